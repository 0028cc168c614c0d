"""TextArena's games as games of this project (games/textarena.py): TextArena's own rules referee."""

import random

import pytest

from lmselfplay.games import Invalid, TicTacToe, make
from lmselfplay.games.base import TERMINAL, WIN_RATES
from lmselfplay.games.text import format_answer

pytest.importorskip("textarena")


def test_same_winner_as_our_tictactoe_on_the_same_moves():
    """Random move sequences played on our tic-tac-toe and on TextArena's (cell k is TextArena's
    ``[k]``; the first mover is player 0 in both): the same winner, at the same ply."""
    ours, theirs = TicTacToe(), make("textarena:TicTacToe-v0")
    rng = random.Random(0)
    outcomes = set()
    for game in range(60):
        s, t = ours.new_initial_state(), theirs.new_initial_state(seed=game)
        while not ours.is_terminal(s):
            assert theirs.current_player(t) == ours.current_player(s)
            a = rng.choice(ours.legal_actions(s))
            move = theirs.parse_action(t, format_answer(f"[{a}]"))
            assert move == f"[{a}]"
            s, t = ours.apply(s, a), theirs.apply(t, move)
        assert theirs.is_terminal(t) and theirs.current_player(t) == TERMINAL
        assert theirs.returns(t) == ours.returns(s)
        outcomes.add(tuple(ours.returns(s)))
    assert outcomes == {(1.0, -1.0), (-1.0, 1.0), (0.0, 0.0)}


def test_an_invalid_move_is_an_invalid_answer():
    game = make("textarena:TicTacToe-v0")
    s = game.apply(game.new_initial_state(seed=0), "[4]")
    for text in ["<move>[4]</move>", "<move>[9]</move>", "<move>centre</move>", "no move", None]:
        assert isinstance(game.parse_action(s, text), Invalid)
    assert "occupied" in game.parse_action(s, "<move>[4]</move>").reason
    with pytest.raises(ValueError):
        game.apply(s, "[4]")
    assert game.exact_metric == WIN_RATES and game.action_space == "text"


def test_players_read_their_own_observations():
    game = make("textarena:KuhnPoker-v0")
    s = game.new_initial_state(seed=3)
    p = game.current_player(s)
    mine, theirs = game.observation_text(s, p), game.observation_text(s, 1 - p)
    assert mine != theirs and "Player" in mine


def test_global_random_is_left_alone():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    make("textarena:TicTacToe-v0").new_initial_state(seed=5)
    game = make("textarena:TicTacToe-v0")
    game.apply(game.new_initial_state(seed=7), "[0]")
    assert random.random() == expected


def test_refusals_say_why():
    with pytest.raises(ValueError, match="no such TextArena environment"):
        make("textarena:NoSuchGame-v0")
    with pytest.raises(ValueError, match="not a two-player game"):
        make("textarena:Minesweeper-v0")
