"""Games with exact rules. This top-level folder ``games/`` installs as ``lmselfplay.games``
(pyproject ``package-dir``): a top-level ``games`` package would be too generic for site-packages.

``make(name, **params)`` builds a game from the registry; every game follows the
protocol in :mod:`lmselfplay.games.base` and the text protocol in
:mod:`lmselfplay.games.text`. A name ``family:spec`` is built by a family of games from
another project (:data:`FAMILIES`): ``openspiel:leduc_poker``, ``openspiel:liars_dice(numdice=1)``
(:mod:`lmselfplay.games.openspiel`), ``textarena:TicTacToe-v0`` (:mod:`lmselfplay.games.textarena`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from lmselfplay.games.base import (
    CHANCE,
    TERMINAL,
    Game,
    Invalid,
    forfeit_returns,
    random_legal_reset,
    resolve_chance,
)
from lmselfplay.games.go import Go
from lmselfplay.games.kuhn_poker import KuhnPoker
from lmselfplay.games.nim import Nim
from lmselfplay.games.taboo import Taboo
from lmselfplay.games.tictactoe import TicTacToe

REGISTRY: dict[str, Callable[..., Any]] = {
    "nim": Nim,
    "nim_misere": lambda **kw: Nim(misere=True, **kw),
    "tictactoe": TicTacToe,
    "kuhn_poker": KuhnPoker,
    "taboo": Taboo,
    "go": Go,
    "go9": lambda **kw: Go(size=9, **kw),
}




def _openspiel(spec: str, **params: Any) -> Any:
    from lmselfplay.games.openspiel import make as make_openspiel

    return make_openspiel(spec, **params)


def _textarena(spec: str, **params: Any) -> Any:
    from lmselfplay.games.textarena import make as make_textarena

    return make_textarena(spec, **params)


# prefix -> factory(spec, **params) of the games of another project, named "prefix:spec"
FAMILIES: dict[str, Callable[..., Any]] = {"openspiel": _openspiel, "textarena": _textarena}


def register(name: str, factory: Callable[..., Any]) -> None:
    """Add a game: one module + one registry line is all a new game needs."""
    REGISTRY[name] = factory


def is_game_name(name: str) -> bool:
    """Whether ``name`` names a registered game or a game of a family (not whether it loads)."""
    family, sep, spec = name.partition(":")
    return name in REGISTRY or bool(sep and spec.strip() and family in FAMILIES)


def split_names(names: str) -> list[str]:
    """Comma-separated game names; a comma inside parentheses belongs to its name's parameters
    (``openspiel:goofspiel(num_cards=4,players=2),nim``)."""
    out, depth, current = [], 0, ""
    for ch in names:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth <= 0:
            out.append(current)
            current = ""
        else:
            current += ch
    out.append(current)
    return [n.strip() for n in out if n.strip()]


def make(name: str, **params: Any) -> Any:
    """The game ``name`` (a registry name or ``family:spec``) with ``params``: KeyError for an
    unknown name, ValueError for a game that cannot be built (one line saying why)."""
    family, sep, spec = name.partition(":")
    if sep and family in FAMILIES:
        factory = functools.partial(FAMILIES[family], spec)
    elif name in REGISTRY:
        factory = REGISTRY[name]
    else:
        raise KeyError(f"unknown game {name!r}; known: {', '.join(sorted(REGISTRY))}, "
                       f"or {', '.join(f + ':NAME' for f in FAMILIES)}")
    try:
        return factory(**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for game {name!r}: {e}") from None


__all__ = ["CHANCE", "FAMILIES", "TERMINAL", "Game", "Go", "Invalid", "KuhnPoker", "Nim", "REGISTRY", "TicTacToe",
           "forfeit_returns", "is_game_name", "make", "split_names", "random_legal_reset", "register", "resolve_chance"]
