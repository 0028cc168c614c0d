"""PSRO: double oracle on RPS and Kuhn poker; 'last' and 'uniform' meta-solvers reproduce
iterated best response and fictitious play exactly."""

from __future__ import annotations

import numpy as np
import pytest

from lmselfplay.game_theory.matrix_games import (
    BIASED_RPS,
    PAPER,
    ROCK,
    RPS,
    SCISSORS,
    best_response_dynamics,
    fictitious_play_rounds,
    meta_strategy,
)
from lmselfplay.game_theory.psro import (
    PSRO,
    extensive_form_oracles,
    joint_policy,
    mixture_policy,
    uniform_tabular,
)
from lmselfplay.games.exploitability import exploitability, policy_value
from lmselfplay.games.kuhn_poker import KuhnPoker


def matrix_psro(U, solver):
    """Policies are pure actions; the oracle is the exact best response (lowest index)."""
    def best_response(player, opponents, weights):
        mix = np.bincount(opponents, weights=weights, minlength=U.shape[1 - player])
        return int(np.argmax(U @ mix)) if player == 0 else int(np.argmin(mix @ U))
    return PSRO(lambda a, b: U[a, b], best_response, (ROCK, ROCK), meta_solver=solver)


def test_double_oracle_on_rps_adds_paper_then_scissors_then_stops_uniform():
    psro = matrix_psro(RPS, "nash")
    first = psro.step()
    assert psro.populations == ([ROCK, PAPER], [ROCK, PAPER]) and not first.converged
    assert first.nash_conv == pytest.approx(2.0)  # rock vs rock
    second = psro.step()
    assert psro.populations == ([ROCK, PAPER, SCISSORS], [ROCK, PAPER, SCISSORS])
    np.testing.assert_allclose(second.meta_strategies[0], [0, 1], atol=1e-9)  # paper over {R, P}
    last = psro.step()
    assert last.converged and psro.populations[0] == [ROCK, PAPER, SCISSORS]
    for mix in last.meta_strategies:
        np.testing.assert_allclose(mix, [1 / 3] * 3, atol=1e-9)
    assert abs(last.nash_conv) < 1e-9
    np.testing.assert_array_equal(psro.payoffs, RPS)


def test_last_meta_solver_is_iterated_best_response():
    psro = matrix_psro(RPS, "last")
    for _ in range(6):
        assert psro.step().nash_conv == pytest.approx(2.0)  # cycles, never improves
    mus, nus = best_response_dynamics(RPS, 7)
    assert psro.populations == (list(mus.argmax(1)), list(nus.argmax(1)))
    assert psro.populations[0] == [0, 1, 2, 0, 1, 2, 0]


def test_uniform_meta_solver_is_fictitious_play():
    T = 40
    psro = matrix_psro(BIASED_RPS, "uniform")
    for _ in range(T - 1):
        assert not psro.step().converged
    mus, nus = fictitious_play_rounds(BIASED_RPS, T)
    assert psro.populations == (list(mus.argmax(1)), list(nus.argmax(1)))
    mu, nu = psro.meta_strategies()
    np.testing.assert_allclose(mu @ np.eye(3)[psro.populations[0]], mus.mean(0))


def test_double_oracle_on_kuhn_reaches_nash_in_finitely_many_steps():
    game = KuhnPoker()
    payoff, oracle, initial = extensive_form_oracles(game)
    psro = PSRO(payoff, oracle, initial, meta_solver="nash")
    last = psro.run(30)
    assert last.converged and len(psro.history) < 30
    assert psro.history[0].nash_conv == pytest.approx(0.9166666666666666)  # uniform vs uniform
    mu, nu = last.meta_strategies
    profile = joint_policy(game, mixture_policy(game, psro.populations[0], mu, 0),
                           mixture_policy(game, psro.populations[1], nu, 1))
    assert exploitability(game, profile) < 1e-9
    assert policy_value(game, profile)[0] == pytest.approx(-1 / 18, abs=1e-9)
    assert float(mu @ psro.payoffs @ nu) == pytest.approx(-1 / 18, abs=1e-9)


def test_mixture_policy_is_payoff_equivalent_to_the_mixture():
    """Kuhn's theorem: value(behaviour mixture, opp) = sum_k w_k value(policy_k, opp)."""
    game = KuhnPoker()
    rng = np.random.default_rng(0)

    def random_policy(player):
        return {k: rng.dirichlet([1, 1]) for k in uniform_tabular(game, player)}

    members = [random_policy(0) for _ in range(3)]
    weights = np.array([0.5, 0.3, 0.2])
    opponent = random_policy(1)
    mixed = mixture_policy(game, members, weights, 0)
    expected = sum(w * policy_value(game, joint_policy(game, m, opponent))[0]
                   for w, m in zip(weights, members))
    assert policy_value(game, joint_policy(game, mixed, opponent))[0] == pytest.approx(expected)
    # and it differs from naive per-infostate averaging (which ignores own reach)
    naive = {k: sum(w * m[k] for w, m in zip(weights, members)) for k in mixed}
    assert max(np.abs(naive[k] - mixed[k]).max() for k in mixed) > 1e-3


def test_meta_strategy_solvers_and_errors():
    table = np.array([[0.0, 1.0], [-1.0, 0.0], [0.5, -2.0]])
    np.testing.assert_array_equal(meta_strategy(table, "last"), [0, 0, 1])
    np.testing.assert_allclose(meta_strategy(table, "uniform"), [1 / 3] * 3)
    # rows 0 and 2 mixed 5:2 guarantee 1/7 against either column
    np.testing.assert_allclose(meta_strategy(table, "nash"), [5 / 7, 0, 2 / 7], atol=1e-9)
    win_rates = (RPS + 1) / 2  # constant-sum league table: same Nash as RPS
    np.testing.assert_allclose(meta_strategy(win_rates, "nash"), [1 / 3] * 3, atol=1e-9)
    with pytest.raises(ValueError, match="unknown meta-solver 'best'"):
        meta_strategy(table, "best")
    with pytest.raises(ValueError, match="finite"):
        meta_strategy([[np.nan]], "nash")
    with pytest.raises(ValueError, match="2-D"):
        meta_strategy([1.0, 2.0], "uniform")
    with pytest.raises(ValueError, match="unknown meta-solver"):
        PSRO(lambda a, b: 0.0, lambda p, o, w: 0, (0, 0), meta_solver="alpharank")
