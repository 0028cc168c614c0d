"""Kuhn poker: cards J < Q < K, ante 1, one bet of 1 (OpenSpiel's conventions).

Two chance nodes deal player 0's then player 1's card. Actions: 0 = pass
(check / fold), 1 = bet (bet / call). The first player's Nash value is -1/18.
Observations and information states hide the opponent's card.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from lmselfplay.games.base import CHANCE, EXPLOITABILITY, TERMINAL, Invalid, resolve_chance
from lmselfplay.games.text import parse_named_move, prompt

CARDS = "JQK"
PASS, BET = 0, 1
ACTION_NAMES = ("pass", "bet")
TERMINAL_HISTORIES = {(0, 0), (1, 0), (1, 1), (0, 1, 0), (0, 1, 1)}


@dataclass(frozen=True)
class KuhnState:
    cards: tuple[int, ...] = ()
    history: tuple[int, ...] = ()


class KuhnPoker:
    name = "kuhn_poker"
    title = "Kuhn poker"  # the name in words (figures, tables)
    n_actions = 2
    perfect_information = False
    max_utility = 2.0  # ante + bet
    exact_metric = EXPLOITABILITY

    def nash_policy(self) -> dict[str, list[float]]:
        """An equilibrium policy (alpha = 1/3): the exact opponent in evaluations."""
        return nash_policy()

    def new_initial_state(self, seed: int | None = None) -> KuhnState:
        s = KuhnState()
        if seed is not None:
            s = resolve_chance(self, s, random.Random(seed))
        return s

    def is_terminal(self, s: KuhnState) -> bool:
        return s.history in TERMINAL_HISTORIES

    def current_player(self, s: KuhnState) -> int:
        if len(s.cards) < 2:
            return CHANCE
        if self.is_terminal(s):
            return TERMINAL
        return len(s.history) % 2

    def chance_outcomes(self, s: KuhnState) -> list[tuple[int, float]]:
        if len(s.cards) >= 2:
            return []
        left = [c for c in range(3) if c not in s.cards]
        return [(c, 1.0 / len(left)) for c in left]

    def legal_actions(self, s: KuhnState) -> list[int]:
        p = self.current_player(s)
        if p == CHANCE:
            return [c for c, _ in self.chance_outcomes(s)]
        return [] if p == TERMINAL else [PASS, BET]

    def apply(self, s: KuhnState, a: int) -> KuhnState:
        if len(s.cards) < 2:
            if a in s.cards or a not in range(3):
                raise ValueError(f"illegal deal {a} after {s.cards}")
            return KuhnState(s.cards + (a,), s.history)
        if self.is_terminal(s) or a not in (PASS, BET):
            raise ValueError(f"illegal kuhn action {a} at history {s.history}")
        return KuhnState(s.cards, s.history + (a,))

    def returns(self, s: KuhnState) -> list[float]:
        if not self.is_terminal(s):
            return [0.0, 0.0]
        h = s.history
        if h == (1, 0):  # player 1 folded to a bet
            return [1.0, -1.0]
        if h == (0, 1, 0):  # player 0 folded
            return [-1.0, 1.0]
        pot = 2.0 if BET in h and h != (1, 0) and h != (0, 1, 0) else 1.0
        winner = 0 if s.cards[0] > s.cards[1] else 1
        return [pot, -pot] if winner == 0 else [-pot, pot]

    # --- hidden information ---------------------------------------------------------
    def information_state(self, s: KuhnState, player: int) -> str:
        """Own card + public betting, e.g. ``'K:pb'``."""
        card = CARDS[s.cards[player]] if len(s.cards) > player else "?"
        return card + ":" + "".join("pb"[a] for a in s.history)

    def history_text(self, s: KuhnState) -> str:
        return " ".join(ACTION_NAMES[a] for a in s.history) or "none"

    def action_text(self, a: int) -> str:
        return ACTION_NAMES[a]

    def observation_text(self, s: KuhnState, player: int) -> str:
        rules = "Cards J<Q<K, ante 1, one bet of 1; pass folds after a bet, bet calls."
        state = [f"You are player {player + 1}. Your card: {CARDS[s.cards[player]]}.",
                 f"Betting so far: {self.history_text(s)}."]
        return prompt(self.name, rules, state, [self.action_text(a) for a in self.legal_actions(s)])

    def parse_action(self, s: KuhnState, text: str) -> int | Invalid:
        if self.current_player(s) not in (0, 1):
            return Invalid("no player is to move")
        return parse_named_move(text, {ACTION_NAMES[a]: a for a in self.legal_actions(s)})

    def render(self, s: KuhnState) -> str:
        cards = " vs ".join(CARDS[c] for c in s.cards) or "(not dealt)"
        out = f"cards {cards}; betting: {self.history_text(s)}"
        if self.is_terminal(s):
            out += f"; returns {self.returns(s)}"
        return out

    def encode(self, s: KuhnState) -> np.ndarray:
        """Information-state tensor of the player to move: card one-hot + history."""
        p = max(self.current_player(s), 0)
        x = np.zeros(3 + 6, dtype=np.float32)
        if len(s.cards) > p:
            x[s.cards[p]] = 1.0
        for i, a in enumerate(s.history):
            x[3 + 2 * i + a] = 1.0
        return x


def nash_policy(alpha: float = 1 / 3) -> dict[str, list[float]]:
    """Kuhn's equilibrium family (0 <= alpha <= 1/3): P(bet) per information state.

    Player 1 bets a J with prob. alpha, a K with 3*alpha, calls with a Q with
    alpha + 1/3; player 2 bets a J after a pass with 1/3, calls with a Q with 1/3.
    Value for player 1: -1/18 for every alpha.
    """
    if not 0 <= alpha <= 1 / 3:
        raise ValueError(f"alpha must lie in [0, 1/3], got {alpha}")
    bet = {"J:": alpha, "Q:": 0.0, "K:": 3 * alpha, "J:pb": 0.0, "Q:pb": alpha + 1 / 3, "K:pb": 1.0,
           "J:p": 1 / 3, "Q:p": 0.0, "K:p": 1.0, "J:b": 0.0, "Q:b": 1 / 3, "K:b": 1.0}
    return {k: [1.0 - b, b] for k, b in bet.items()}
