"""Differential tests: our Go against OpenSpiel's ``go`` (the oracle).

The two rule sets agree on everything but repetition. OpenSpiel forbids only the simple
ko recapture; any other move that repeats an earlier position is legal there and ends
the game at once as a draw (go.cc: ``superko_``). We forbid every repetition (positional
superko). So at every ply our legal set is OpenSpiel's minus exactly the moves that
repeat a position, and those end OpenSpiel's game as a draw.
"""

import random

import numpy as np
import pytest
from go_positions import KO, MULTI, SEKI, TRIPLE_KO_CYCLE, setup_actions, triple_ko

from lmselfplay.games.go import Go

pyspiel = pytest.importorskip("pyspiel")


def openspiel_go(size, komi=7.5):
    return pyspiel.load_game("go", {"board_size": size, "komi": komi})


def same_board(game, ours, theirs):
    """OpenSpiel's observation planes are (black, white, empty) over points a1, b1, ..."""
    n = game.n_points
    planes = np.asarray(theirs.observation_tensor(0))
    board = np.frombuffer(ours.board, dtype=np.uint8)
    return (np.array_equal(planes[:n] == 1, board == 1)
            and np.array_equal(planes[n:2 * n] == 1, board == 2))


def check_superko_difference(game, s, t, extra):
    """Moves OpenSpiel allows and we do not: each repeats a position, and OpenSpiel's game
    then ends as a draw."""
    for a in extra:
        assert "superko" in game.illegal_reason(s, a)
        child = t.child(a)
        assert child.is_terminal() and child.returns() == [0.0, 0.0]


def differential(size, n_games, seed):
    """Random games stepped in both; returns how many superko differences were seen."""
    game, oracle = Go(size), openspiel_go(size)
    rng = random.Random(seed)
    differences = 0
    for _ in range(n_games):
        s, t = game.new_initial_state(), oracle.new_initial_state()
        while not game.is_terminal(s):
            assert not t.is_terminal() and t.current_player() == game.current_player(s)
            ours, theirs = game.legal_actions(s), t.legal_actions()
            extra = sorted(set(theirs) - set(ours))
            assert set(ours) <= set(theirs)
            check_superko_difference(game, s, t, extra)
            differences += len(extra)
            a = rng.choice(ours)
            s = game.apply(s, a)
            t.apply_action(a)
            assert same_board(game, s, t)  # same captures, stone for stone
        assert t.is_terminal()
        assert game.returns(s) == t.returns()
    return differences


def test_random_9x9_games_match_openspiel():
    assert differential(9, 300, seed=0) > 0  # the superko difference did occur


@pytest.mark.slow
def test_2000_random_9x9_games_match_openspiel():
    differential(9, 2000, seed=1)


@pytest.mark.slow
def test_200_random_19x19_games_match_openspiel():
    differential(19, 200, seed=2)


def test_small_boards_match_openspiel():
    for size in (5, 7, 13):
        differential(size, 20, seed=size)


def replay_both(size, actions, komi=7.5):
    game, oracle = Go(size, komi=komi), openspiel_go(size, komi)
    s, t = game.new_initial_state(), oracle.new_initial_state()
    for a in actions:
        s = game.apply(s, a)
        t.apply_action(a)
    return game, s, t


SNAPBACK = [". . . . .", ". . . . .", "X X X . .", "O O X . .", ". . X . ."]


@pytest.mark.parametrize("rows,to_play,moves,captures", [
    (MULTI, 1, ["C5"], (0, 1)),  # multi-stone move without liberties that captures
    (SNAPBACK, 0, ["A1", "B1", "A1"], (3, 1)),
    (KO, 0, ["C4"], (1, 0)),
])
def test_hand_positions_match_openspiel(rows, to_play, moves, captures):
    """Positions laid out by legal play in both implementations."""
    g = Go(5)
    actions = setup_actions(g, rows, to_play) + [g.point(m) for m in moves]
    game, s, t = replay_both(5, actions)
    assert s.captures == captures and same_board(game, s, t)
    assert game.legal_actions(s) == t.legal_actions()


def test_seki_score_matches_openspiel():
    for komi in (4.5, 5.5):  # Black's margin before komi is 5: the sign flips in between
        g = Go(7, komi=komi)
        actions = setup_actions(g, SEKI, to_play=1) + [g.pass_action, g.pass_action]
        game, s, t = replay_both(7, actions, komi)
        assert t.is_terminal() and game.returns(s) == t.returns()


def test_triple_ko_is_where_the_rule_sets_differ():
    """The documented difference. With three kos on the board the captures can cycle:

        B takes K1, W takes K2, B takes K3, W takes K1, B takes K2, W takes K3

    and the sixth move recreates the start position. None of the six is an immediate ko
    recapture, so OpenSpiel (simple ko) allows the sixth and scores the game a draw on the
    spot; positional superko forbids it and the game goes on."""
    g = Go(9)
    actions = setup_actions(g, triple_ko("OXO")) + [g.point(m) for m in TRIPLE_KO_CYCLE[:-1]]
    game, s, t = replay_both(9, actions)
    sixth = game.point(TRIPLE_KO_CYCLE[-1])
    assert sixth in t.legal_actions() and sixth not in game.legal_actions(s)
    assert set(t.legal_actions()) - set(game.legal_actions(s)) == {sixth}
    check_superko_difference(game, s, t, [sixth])
