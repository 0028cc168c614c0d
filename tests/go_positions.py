"""Hand positions for the Go tests, reachable by legal play so OpenSpiel can replay them."""

from __future__ import annotations


def setup_actions(game, rows: list[str], to_play: int = 0) -> list[int]:
    """Actions (from the empty board, Black first) that lay out ``rows`` and leave
    ``to_play`` to move: stones are placed in pairs, then the surplus colour alternates with passes (never
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
    if to_play == 1:  # drop a trailing pass, or pass once (never a second pass in a row)
        actions = actions[:-1] if actions and actions[-1] == game.pass_action else [
            *actions, game.pass_action]
    return actions


def play(game, actions: list[int], state=None):
    state = game.new_initial_state() if state is None else state
    for a in actions:
        state = game.apply(state, a)
    return state


KO = [". X O . .",
      "X O . O .",
      ". X O . .",
      ". . . . .",
      ". . . . ."]


def ko_shape(holder: str) -> list[str]:
    """A ko in a 3x4 box; ``holder`` has the stone in the middle of it."""
    return [".XO.", "XO.O", ".XO."] if holder == "O" else [".XO.", "X.XO", ".XO."]


def triple_ko(holders: str) -> list[str]:
    """Three kos on 9x9 (top-left, left middle, top-right), held by ``holders[i]``."""
    grid = [["."] * 9 for _ in range(9)]
    for (top, left), h in zip([(0, 0), (4, 0), (0, 5)], holders, strict=True):
        for i, row in enumerate(ko_shape(h)):
            for j, ch in enumerate(row):
                grid[top + i][left + j] = ch
    return [" ".join(r) for r in grid]


# The capture points: Black takes a ko held by White at the box's (1, 2), White takes one
# held by Black at (1, 1).  K1 = C8/B8, K2 = C4/B4, K3 = H8/G8.
TRIPLE_KO_CYCLE = ["C8", "B4", "H8", "B8", "C4", "G8"]


MULTI = ["X O . X O",
         ". X X O .",
         ". . . . .",
         ". . . . .",
         ". . . . ."]


# Inner X group (rows 5-4) and inner O group (row 3) share A4 and G4 and have no eyes;
# each is wrapped by the other colour's wall with two eyes (A7/G7, A1/G1).
SEKI = [". O O O O O .",
        "O O O O O O O",
        "X X X X X X X",
        ". X X X X X .",
        "O O O O O O O",
        "X X X X X X X",
        ". X X X X X ."]
