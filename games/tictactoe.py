"""Tic-tac-toe. Cells are numbered 1..9 row by row (action = cell - 1, as OpenSpiel).

X (player 0) moves first. Single-character move names keep every move one token.

Two board texts (``TicTacToe(board=...)``; the move names and answers are the same):

* ``digits`` (the default): rows ``X 2 O``, a mark where a cell is taken, its number where empty;
* ``cells``: every cell is one string that names its cell and its content, ``1X2_3O`` per row
  (:func:`cell_text`), one token each in a tokenizer that has the 27 of them
  (:data:`CELL_STRINGS`, the v7 build's). A transformer learns the optimal-move function at an
  MLP's speed only when each board token names its cell (docs/embedded_model.md, the shape
  probe). The text is short so that the board dominates it: the side to move and the board come
  last, next to the answer slot, and there is no legal-move list (the board names every empty
  cell, ``5_``; its move is ``5``). Measured on the full text, the list and an early board each
  slowed the supervised control (docs/embedded_model.md, v7).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmselfplay.games.base import OPTIMAL_MOVES, TERMINAL, Invalid
from lmselfplay.games.text import parse_named_move, prompt

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
MARKS = ".XO"
# The cells text marks an empty cell "_": a digit followed by "." is common in the corpus's
# arithmetic ("costs 5."), and a cell token must never match inside other text.
CELL_MARKS = "_XO"
CELL_STRINGS = tuple(f"{k}{m}" for k in range(1, 10) for m in CELL_MARKS)
BOARD_FORMATS = ("digits", "cells")


def cell_text(k: int, content: int) -> str:
    """Cell ``k`` (0-8) holding ``content`` (0 empty, 1 X, 2 O) in the cells text: ``5X``."""
    return f"{k + 1}{CELL_MARKS[content]}"


@dataclass(frozen=True)
class TicTacToeState:
    board: tuple[int, ...] = (0,) * 9  # 0 empty, 1 X, 2 O

    @property
    def player(self) -> int:
        return sum(1 for c in self.board if c) % 2

    @property
    def winner(self) -> int:
        """0 or 1 for a completed line, -1 otherwise."""
        b = self.board
        for i, j, k in LINES:
            if b[i] and b[i] == b[j] == b[k]:
                return b[i] - 1
        return -1


class TicTacToe:
    name = "tictactoe"
    title = "Tic-tac-toe"  # the name in words (figures, tables)
    n_actions = 9
    perfect_information = True
    max_utility = 1.0
    exact_metric = OPTIMAL_MOVES

    def __init__(self, board: str = "digits"):
        if board not in BOARD_FORMATS:
            raise ValueError(f"unknown tic-tac-toe board text {board!r}; known: {', '.join(BOARD_FORMATS)}")
        self.board = board
        # strings a tokenizer must hold as one token each to read this text (tiny.whole_strings)
        self.token_strings = CELL_STRINGS if board == "cells" else ()

    def new_initial_state(self, seed: int | None = None) -> TicTacToeState:
        return TicTacToeState()

    def is_terminal(self, s: TicTacToeState) -> bool:
        return s.winner >= 0 or all(s.board)

    def current_player(self, s: TicTacToeState) -> int:
        return TERMINAL if self.is_terminal(s) else s.player

    def legal_actions(self, s: TicTacToeState) -> list[int]:
        return [] if self.is_terminal(s) else [i for i, c in enumerate(s.board) if not c]

    def chance_outcomes(self, s: TicTacToeState) -> list[tuple[int, float]]:
        return []

    def apply(self, s: TicTacToeState, a: int) -> TicTacToeState:
        if self.is_terminal(s) or not 0 <= a < 9 or s.board[a]:
            raise ValueError(f"illegal tic-tac-toe action {a} on {self.render(s)!r}")
        b = list(s.board)
        b[a] = s.player + 1
        return TicTacToeState(tuple(b))

    def returns(self, s: TicTacToeState) -> list[float]:
        w = s.winner
        if w < 0:
            return [0.0, 0.0]
        return [1.0, -1.0] if w == 0 else [-1.0, 1.0]

    def action_text(self, a: int) -> str:
        return str(a + 1)

    def board_text(self, s: TicTacToeState) -> list[str]:
        """Rows of the board: ``digits`` marks and the cell number where a cell is empty
        (``X 2 O``); ``cells`` one named cell after another (``1X2_3O``)."""
        if self.board == "cells":
            return ["".join(cell_text(k, s.board[k]) for k in range(r * 3, r * 3 + 3)) for r in range(3)]
        cells = [MARKS[c] if c else str(i + 1) for i, c in enumerate(s.board)]
        return [" ".join(cells[r * 3 : r * 3 + 3]) for r in range(3)]

    def observation_text(self, s: TicTacToeState, player: int) -> str:
        rules = "Get three in a row."
        state = [f"You play {MARKS[player + 1]}.", *self.board_text(s)]
        if self.board == "cells":  # the board names every empty cell: no list beside it
            return prompt(self.name, rules, state, None, state_last=True)
        return prompt(self.name, rules, state, [self.action_text(a) for a in self.legal_actions(s)])

    def parse_action(self, s: TicTacToeState, text: str) -> int | Invalid:
        return parse_named_move(text, {self.action_text(a): a for a in self.legal_actions(s)})

    def render(self, s: TicTacToeState) -> str:
        return "\n".join(self.board_text(s))

    def encode(self, s: TicTacToeState) -> np.ndarray:
        """Planes (mine, theirs, side-to-move) from the mover's point of view, 3x3x3."""
        me = s.player + 1
        b = np.array(s.board).reshape(3, 3)
        planes = np.stack([b == me, (b != me) & (b != 0), np.full((3, 3), s.player == 0)])
        return planes.astype(np.float32)
