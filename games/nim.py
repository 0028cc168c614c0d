"""One-pile Nim: take 1..max_take stones; normal play (last stone wins) or misere.

Exact solution: in normal play the player to move loses exactly when
``n % (max_take + 1) == 0``; in misere play exactly when ``n % (max_take + 1) == 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmselfplay.games.base import OPTIMAL_MOVES, TERMINAL, Invalid
from lmselfplay.games.text import parse_named_move, prompt


@dataclass(frozen=True)
class NimState:
    stones: int
    player: int = 0
    last_mover: int = -1  # who took the last stones (decides the winner at 0)


class Nim:
    perfect_information = True
    max_utility = 1.0
    exact_metric = OPTIMAL_MOVES

    def __init__(self, start: int = 15, max_take: int = 3, misere: bool = False):
        if start < 1 or max_take < 1:
            raise ValueError(f"nim needs start >= 1 and max_take >= 1, got {start}, {max_take}")
        self.start, self.max_take, self.misere = int(start), int(max_take), bool(misere)
        self.name = "nim_misere" if misere else "nim"
        self.title = "Misère Nim" if misere else "Nim"  # the name in words (figures, tables)
        self.n_actions = self.max_take  # action a takes a + 1 stones

    def new_initial_state(self, seed: int | None = None) -> NimState:
        return NimState(self.start)

    def state_with(self, stones: int, player: int = 0) -> NimState:
        return NimState(int(stones), player)

    def current_player(self, s: NimState) -> int:
        return TERMINAL if s.stones == 0 else s.player

    def is_terminal(self, s: NimState) -> bool:
        return s.stones == 0

    def legal_actions(self, s: NimState) -> list[int]:
        return list(range(min(self.max_take, s.stones))) if s.stones else []

    def information_state(self, s: NimState, player: int) -> str:
        """Perfect information: the position itself (stones left, player to move)."""
        return f"{s.stones} stones, player {s.player}"

    def chance_outcomes(self, s: NimState) -> list[tuple[int, float]]:
        return []

    def apply(self, s: NimState, a: int) -> NimState:
        if a not in range(min(self.max_take, s.stones)):
            raise ValueError(f"illegal nim action {a} with {s.stones} stones")
        return NimState(s.stones - (a + 1), 1 - s.player, s.player)

    def returns(self, s: NimState) -> list[float]:
        if s.stones:
            return [0.0, 0.0]
        winner = s.last_mover if not self.misere else 1 - s.last_mover
        return [1.0, -1.0] if winner == 0 else [-1.0, 1.0]

    # --- exact solution -------------------------------------------------------------
    def value(self, s: NimState) -> float:
        """Game value for the player to move (+1 win, -1 loss) under optimal play."""
        m = self.max_take + 1
        losing = s.stones % m == (1 if self.misere else 0)
        return -1.0 if losing else 1.0

    def optimal_actions(self, s: NimState) -> list[int]:
        """Every legal action that keeps the best achievable value."""
        legal = self.legal_actions(s)
        best = []
        for a in legal:
            nxt = self.apply(s, a)
            v = -self.value(nxt) if nxt.stones else (1.0 if not self.misere else -1.0)
            best.append(v)
        top = max(best)
        return [a for a, v in zip(legal, best) if v == top]

    # --- text -----------------------------------------------------------------------
    def action_text(self, a: int) -> str:
        return str(a + 1)

    def observation_text(self, s: NimState, player: int) -> str:
        goal = "takes the last stone loses" if self.misere else "takes the last stone wins"
        rules = f"Take 1 to {self.max_take} stones; whoever {goal}."
        legal = [self.action_text(a) for a in self.legal_actions(s)]
        return prompt(self.name, rules, [f"Stones: {s.stones}. You are player {player + 1}."], legal)

    def parse_action(self, s: NimState, text: str) -> int | Invalid:
        return parse_named_move(text, {self.action_text(a): a for a in self.legal_actions(s)})

    def render(self, s: NimState) -> str:
        who = "game over" if not s.stones else f"player {s.player + 1} to move"
        return f"{'o' * s.stones} ({s.stones} stones, {who})"

    def encode(self, s: NimState) -> np.ndarray:
        """One-hot of the pile size (0..start) for networks."""
        x = np.zeros(self.start + 1, dtype=np.float32)
        x[s.stones] = 1.0
        return x
