"""Exact solutions of small perfect-information games by memoized minimax.

Values are for the player to move (+1 win, 0 draw, -1 loss); works for any
deterministic two-player zero-sum Game with terminal returns in {-1, 0, 1}.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from lmselfplay.games.base import Game


class Minimax:
    """Game values of every reachable position, computed once and cached."""

    def __init__(self, game: Game):
        if not game.perfect_information:
            raise ValueError(f"{game.name} has hidden information: use exploitability instead")
        self.game = game

        @cache
        def value(state: Any) -> float:
            if game.is_terminal(state):
                return game.returns(state)[0]
            return max(self._child_value(state, a) for a in game.legal_actions(state))

        self._value = value

    def _child_value(self, state: Any, a: int) -> float:
        g = self.game
        child = g.apply(state, a)
        mover = g.current_player(state)
        if g.is_terminal(child):
            return g.returns(child)[mover]
        return self._value(child) if g.current_player(child) == mover else -self._value(child)

    def value(self, state: Any) -> float:
        """Value for the player to move; for a terminal state, for player 0."""
        return self._value(state)

    def action_values(self, state: Any) -> dict[int, float]:
        return {a: self._child_value(state, a) for a in self.game.legal_actions(state)}

    def optimal_actions(self, state: Any) -> list[int]:
        q = self.action_values(state)
        best = max(q.values())
        return [a for a, v in q.items() if v == best]


_CACHE: dict[tuple, Minimax] = {}


def minimax_for(game: Game) -> Minimax:
    """A shared solver per game configuration (the tic-tac-toe table takes ~0.1 s)."""
    key = (game.name, tuple(sorted(vars(game).items())))
    if key not in _CACHE:
        _CACHE[key] = Minimax(game)
    return _CACHE[key]


def optimal_actions(game: Game, state: Any) -> list[int]:
    """Optimal moves at ``state`` (Nim by its formula, others by minimax)."""
    if hasattr(game, "optimal_actions"):
        return game.optimal_actions(state)
    return minimax_for(game).optimal_actions(state)
