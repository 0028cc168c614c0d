"""Hand positions for the Go tests, reachable by legal play so OpenSpiel can replay them."""

from __future__ import annotations


def setup_actions(game, rows: list[str]) -> list[int]:
    """Actions (from the empty board, Black first) that lay out ``rows`` and leave Black to
    move: stones are placed in pairs, then the surplus colour alternates with passes (never
    two passes in a row). Every intermediate position is a subset of the final one, so no
    placement captures or is suicide when the final position has no group without
    liberties."""
    n = game.size
    cells = "".join(r.replace(" ", "") for r in rows)
    black = [p for p in range(n * n) if cells[(n - 1 - p // n) * n + p % n] == "X"]
    white = [p for p in range(n * n) if cells[(n - 1 - p // n) * n + p % n] == "O"]
    actions = []
    for b, w in zip(black, white, strict=False):
        actions += [b, w]
    k = min(len(black), len(white))
    for b in black[k:]:
        actions += [b, game.pass_action]
    for w in white[k:]:
        actions += [game.pass_action, w]
    return actions


def play(game, actions: list[int], state=None):
    state = game.new_initial_state() if state is None else state
    for a in actions:
        state = game.apply(state, a)
    return state
