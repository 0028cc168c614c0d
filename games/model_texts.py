"""The game texts a model was built to read: a build's game parameters
(``"tictactoe.board=cells"``) are recorded in its ``config.json`` and every game shown to that
model is made with them (:func:`make_game_for`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The model config attribute that carries a build's game parameters (TinyConfig.game_params):
# save_pretrained keeps it, so every checkpoint trained from the build plays the texts it read.
GAME_PARAMS_ATTR = "lmselfplay_game_params"


def parse_game_params(text: str) -> dict[str, dict[str, str]]:
    """``"tictactoe.board=cells,nim.start=7"`` as ``{"tictactoe": {"board": "cells"}, ...}``;
    a ValueError names an entry that is not ``game.param=value``."""
    out: dict[str, dict[str, str]] = {}
    for entry in (e.strip() for e in (text or "").split(",")):
        if not entry:
            continue
        lhs, eq, value = entry.partition("=")
        game, dot, param = lhs.strip().partition(".")
        if not (eq and dot and game and param.strip() and value.strip()):
            raise ValueError(f"game_params entry {entry!r}: write game.param=value (tictactoe.board=cells)")
        out.setdefault(game, {})[param.strip()] = value.strip()
    return out


def game_params_of(model_dir: str | Path | None) -> dict[str, dict[str, str]]:
    """The game parameters a model was built to read: what its folder's ``config.json`` records
    (:data:`GAME_PARAMS_ATTR`, written by builds with ``game_params`` and kept by every checkpoint
    saved from them); none for a hub name, a folder without it, or ``None``."""
    if model_dir in (None, ""):
        return {}
    try:
        config = json.loads((Path(model_dir).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return parse_game_params(config.get(GAME_PARAMS_ATTR, "")) if isinstance(config, dict) else {}


def make_game_for(name: str, model_dir: str | Path | None, **extra: Any) -> Any:
    """The registry's game ``name`` as the model in ``model_dir`` reads it: with the game
    parameters its build recorded (:func:`game_params_of`), ``extra`` on top. Every place that
    shows a model a game's text makes the game here, so a build's text goes wherever the build
    goes (the default model's folder: ``lmselfplay.models.policy.resolve_model_path``)."""
    from lmselfplay.games import make

    return make(name, **(game_params_of(model_dir).get(name, {}) | extra))
