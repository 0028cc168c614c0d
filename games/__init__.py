"""Games with exact rules. This top-level folder ``games/`` installs as ``lmselfplay.games``
(pyproject ``package-dir``): a top-level ``games`` package would be too generic for site-packages.

``make(name, **params)`` builds a game from the registry; every game follows the
protocol in :mod:`lmselfplay.games.base` and the text protocol in
:mod:`lmselfplay.games.text`.
"""

from __future__ import annotations

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


def register(name: str, factory: Callable[..., Any]) -> None:
    """Add a game: one module + one registry line is all a new game needs."""
    REGISTRY[name] = factory


def make(name: str, **params: Any) -> Any:
    if name not in REGISTRY:
        raise KeyError(f"unknown game {name!r}; known: {', '.join(sorted(REGISTRY))}")
    try:
        return REGISTRY[name](**params)
    except TypeError as e:
        raise ValueError(f"bad parameters for game {name!r}: {e}") from None


__all__ = ["CHANCE", "TERMINAL", "Game", "Go", "Invalid", "KuhnPoker", "Nim", "REGISTRY", "TicTacToe",
           "forfeit_returns", "make", "random_legal_reset", "register", "resolve_chance"]
