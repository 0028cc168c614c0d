"""Rules and exact solutions of Nim, tic-tac-toe and Kuhn poker."""

from functools import cache

import pytest

from lmselfplay.games import KuhnPoker, Nim, TicTacToe, make
from lmselfplay.games.base import TERMINAL, all_states, random_playout
from lmselfplay.games.exploitability import exploitability, nash_conv, policy_value, uniform_policy
from lmselfplay.games.solve import Minimax, optimal_actions


def brute_force_nim(n: int, max_take: int, misere: bool) -> int:
    @cache
    def win(k: int) -> bool:  # does the player to move at k stones win?
        for t in range(1, min(max_take, k) + 1):
            if k - t == 0:
                if not misere:
                    return True
            elif not win(k - t):
                return True
        return False

    return 1 if win(n) else -1


@pytest.mark.parametrize("misere", [False, True])
@pytest.mark.parametrize("max_take", [1, 2, 3, 4, 7])
def test_nim_formula_matches_brute_force(max_take, misere):
    for n in range(1, 40):
        game = Nim(start=n, max_take=max_take, misere=misere)
        s = game.new_initial_state()
        assert game.value(s) == brute_force_nim(n, max_take, misere), (n, max_take, misere)
        # the formula's optimal moves agree with generic minimax over the same game
        mm = Minimax(game)
        assert mm.value(s) == game.value(s)
        assert sorted(game.optimal_actions(s)) == sorted(mm.optimal_actions(s))


def test_nim_normal_play_losing_positions():
    game = Nim(start=15, max_take=3)
    losing = [n for n in range(1, 16) if game.value(game.state_with(n)) < 0]
    assert losing == [4, 8, 12]
    assert optimal_actions(game, game.state_with(15)) == [2]  # take 3, leave 12


def test_nim_returns_and_terminal():
    game = Nim(start=2, max_take=3)
    s = game.apply(game.new_initial_state(), 1)  # player 0 takes both
    assert game.is_terminal(s) and game.current_player(s) == TERMINAL
    assert game.returns(s) == [1.0, -1.0]
    assert Nim(start=2, misere=True).returns(s) == [-1.0, 1.0]
    with pytest.raises(ValueError):
        game.apply(game.new_initial_state(), 2)  # cannot take 3 of 2


def test_tictactoe_state_counts_and_value():
    game = TicTacToe()
    states = all_states(game)
    assert len(states) == 5478
    assert sum(not game.is_terminal(s) for s in states) == 4520
    mm = Minimax(game)
    assert mm.value(game.new_initial_state()) == 0.0  # a draw with best play
    # X on 1 and 2, O on 4 and 5, X to move: 3 wins at once
    s = game.new_initial_state()
    for a in (0, 3, 1, 4):
        s = game.apply(s, a)
    assert mm.optimal_actions(s) == [2]
    assert mm.value(s) == 1.0


def test_tictactoe_win_detection():
    game = TicTacToe()
    s = game.new_initial_state()
    for a in (0, 3, 4, 5, 8):  # X: 1 5 9 diagonal
        s = game.apply(s, a)
    assert game.is_terminal(s) and game.returns(s) == [1.0, -1.0]
    with pytest.raises(ValueError):
        game.apply(s, 1)


def test_kuhn_uniform_exploitability_and_value():
    game = KuhnPoker()
    pol = uniform_policy(game)
    assert nash_conv(game, pol) == pytest.approx(11 / 12, abs=1e-12)
    assert exploitability(game, pol) == pytest.approx(0.4583333333333333, abs=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.1, 1 / 3])
def test_kuhn_nash_value_is_minus_one_eighteenth(alpha):
    """Kuhn's equilibrium family has value -1/18 for player 1 and zero NashConv."""
    from lmselfplay.games.kuhn_poker import nash_policy

    game = make("kuhn_poker")
    policy = nash_policy(alpha)
    assert policy_value(game, policy)[0] == pytest.approx(-1 / 18, abs=1e-12)
    assert nash_conv(game, policy) == pytest.approx(0.0, abs=1e-12)
    # and a deviation from it is exploitable
    policy["K:b"] = [0.5, 0.5]
    assert nash_conv(game, policy) > 0.01


def test_kuhn_hides_opponent_card():
    game = KuhnPoker()
    root = game.new_initial_state()
    for mine in range(3):
        views = set()
        for theirs in {0, 1, 2} - {mine}:
            s = game.apply(game.apply(root, mine), theirs)
            s = game.apply(s, 0)  # player 0 passes; player 1 to move sees the same history
            views.add((game.observation_text(s, 0), game.information_state(s, 0)))
            assert f"Your card: {'JQK'[mine]}" in game.observation_text(s, 0)
        assert len(views) == 1  # player 0 cannot tell the opponent's card


@pytest.mark.parametrize("name", ["nim", "nim_misere", "tictactoe", "kuhn_poker"])
def test_playouts_are_zero_sum(name):
    game = make(name)
    for seed in range(200):
        final = random_playout(game, seed)[-1]
        assert game.is_terminal(final)
        assert sum(game.returns(final)) == 0


def test_registry_errors_are_clear():
    with pytest.raises(KeyError, match="unknown game 'chess'"):
        make("chess")
    with pytest.raises(ValueError, match="bad parameters"):
        make("nim", stones=3)
