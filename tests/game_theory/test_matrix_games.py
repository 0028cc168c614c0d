"""Matrix-game dynamics: exploitability, iterated best response, fictitious play, regret
matching, the LP solver, and the exploitability plot."""

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
    fictitious_play,
    matrix_exploitability,
    regret_matching,
    regret_matching_rounds,
    solve_zero_sum,
)
from lmselfplay.game_theory.plots import exploitability_curves, main

EQ_BIASED = np.array([0.25, 0.5, 0.25])
e = np.eye(3)


def test_exploitability_known_values():
    assert matrix_exploitability(RPS, e[ROCK], e[ROCK]) == 2.0
    assert matrix_exploitability(RPS, e[PAPER], e[ROCK]) == 2.0  # column switches to scissors
    assert matrix_exploitability(RPS, np.ones(3) / 3, np.ones(3) / 3) == pytest.approx(0.0)
    assert matrix_exploitability(BIASED_RPS, EQ_BIASED, EQ_BIASED) == pytest.approx(0.0)
    # uniform in biased RPS: row gains 1/3 with rock, column gains 1/3 with paper
    assert matrix_exploitability(BIASED_RPS, np.ones(3) / 3, np.ones(3) / 3) == pytest.approx(2 / 3)
    batch = matrix_exploitability(RPS, np.stack([e[0], np.ones(3) / 3]), np.stack([e[0], np.ones(3) / 3]))
    np.testing.assert_allclose(batch, [2.0, 0.0], atol=1e-15)


def test_iterated_best_response_cycles_at_exploitability_two():
    mus, nus = best_response_dynamics(RPS, 10)
    assert mus.shape == (10, 3) and nus.shape == (10, 3)
    np.testing.assert_array_equal(mus.argmax(1), [0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    np.testing.assert_array_equal(nus.argmax(1), mus.argmax(1))
    np.testing.assert_array_equal(matrix_exploitability(RPS, mus, nus), 2.0)
    # rectangular game: shapes follow each player's action count
    mus, nus = best_response_dynamics(np.array([[1.0, 0.0], [0.0, 2.0], [0.5, 0.5]]), 4)
    assert mus.shape == (4, 3) and nus.shape == (4, 2)


def test_round_one_conventions():
    mu, nu = fictitious_play(RPS, 1)
    np.testing.assert_array_equal(mu, e[ROCK])
    mu, nu = fictitious_play(RPS, 2)  # rock, then paper (best response to rock)
    np.testing.assert_allclose(mu, [0.5, 0.5, 0.0])
    mu, nu, reg_mu, reg_nu = regret_matching(RPS, 1)
    np.testing.assert_array_equal(mu, e[ROCK])
    assert (reg_mu, reg_nu) == (1.0, 1.0)  # paper would have won against rock
    mus, _, R_mu, _ = regret_matching_rounds(RPS, 2)
    np.testing.assert_array_equal(mus[1], e[PAPER])  # the only positive regret
    # rock vs rock: regrets (0, 1, -1); paper vs paper: (-1, 0, 1)
    np.testing.assert_allclose(R_mu, [-1.0, 1.0, 0.0])


@pytest.mark.parametrize("seed", range(8))
def test_exploitability_of_averages_equals_sum_of_average_regrets(seed):
    rng = np.random.default_rng(seed)
    m1, m2 = rng.integers(2, 7, size=2)
    U = rng.normal(size=(m1, m2))
    T = int(rng.integers(1, 400))
    mu_bar, nu_bar, reg_mu, reg_nu = regret_matching(U, T)
    assert matrix_exploitability(U, mu_bar, nu_bar) == pytest.approx(reg_mu + reg_nu, abs=1e-9)


@pytest.mark.parametrize("seed", range(8))
def test_regret_matching_regret_bound(seed):
    """Hart & Mas-Colell: average regret <= D sqrt(m / T), D the payoff range."""
    rng = np.random.default_rng(100 + seed)
    m1, m2 = rng.integers(2, 9, size=2)
    U = rng.uniform(-1, 1, size=(m1, m2))
    D = U.max() - U.min()
    for T in (10, 100, 1000):
        _, _, reg_mu, reg_nu = regret_matching(U, T)
        assert reg_mu <= D * np.sqrt(m1 / T)
        assert reg_nu <= D * np.sqrt(m2 / T)


def test_fictitious_play_and_regret_matching_find_biased_equilibrium():
    mu, nu = fictitious_play(BIASED_RPS, 20000)
    np.testing.assert_allclose(mu, EQ_BIASED, atol=5e-3)
    np.testing.assert_allclose(nu, EQ_BIASED, atol=5e-3)
    mu, nu, reg_mu, reg_nu = regret_matching(BIASED_RPS, 20000)
    np.testing.assert_allclose(mu, EQ_BIASED, atol=1e-2)
    np.testing.assert_allclose(nu, EQ_BIASED, atol=1e-2)
    assert matrix_exploitability(BIASED_RPS, mu, nu) < 0.02


def test_solve_zero_sum_known_games():
    mu, nu, v = solve_zero_sum(BIASED_RPS)
    np.testing.assert_allclose(mu, EQ_BIASED, atol=1e-9)
    np.testing.assert_allclose(nu, EQ_BIASED, atol=1e-9)
    assert v == pytest.approx(0.0, abs=1e-12)
    # 2x2 without saddle point, by hand: 3p - 2 = 2 - 3p and 2q - 1 = 2 - 4q, value 0
    U = np.array([[1.0, -1.0], [-2.0, 2.0]])
    mu, nu, v = solve_zero_sum(U)
    np.testing.assert_allclose(mu, [2 / 3, 1 / 3], atol=1e-9)
    np.testing.assert_allclose(nu, [1 / 2, 1 / 2], atol=1e-9)
    assert v == pytest.approx(0.0, abs=1e-9)
    assert matrix_exploitability(U, mu, nu) == pytest.approx(0.0, abs=1e-9)
    # saddle point
    mu, nu, v = solve_zero_sum(np.array([[3.0, 1.0], [4.0, 2.0]]))
    np.testing.assert_allclose(mu, [0, 1], atol=1e-9)
    np.testing.assert_allclose(nu, [0, 1], atol=1e-9)
    assert v == pytest.approx(2.0)


def test_bad_inputs():
    with pytest.raises(ValueError, match="positive integer"):
        fictitious_play(RPS, 0)
    with pytest.raises(ValueError, match="finite"):
        regret_matching([[np.inf, 0.0]], 3)
    with pytest.raises(ValueError, match="2-D"):
        best_response_dynamics([1.0, 2.0], 3)


def test_curves_and_png(tmp_path):
    curves = exploitability_curves(BIASED_RPS, 3000)
    assert set(curves) == {"iterated best response", "fictitious play", "regret matching"}
    assert all(c.shape == (3000,) and c[0] == 2.0 for c in curves.values())
    # iterated best response cycles R, P, S: its average sits at the uniform mixture
    assert curves["iterated best response"][-1] == pytest.approx(2 / 3, abs=2e-3)
    assert curves["fictitious play"][-1] < 0.05 and curves["regret matching"][-1] < 0.05
    path = main(["--out", str(tmp_path / "plots"), "--T", "300"])
    assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_named_payoffs():
    assert RPS[ROCK, SCISSORS] == 1.0 and BIASED_RPS[ROCK, SCISSORS] == 2.0
    np.testing.assert_array_equal(RPS, -RPS.T)  # symmetric zero-sum
    np.testing.assert_array_equal(BIASED_RPS, -BIASED_RPS.T)


def test_the_old_package_name_is_one_line_naming_the_new():
    import importlib
    import sys

    sys.modules.pop("lmselfplay.solvers", None)
    with pytest.raises(ImportError, match="lmselfplay.game_theory"):
        importlib.import_module("lmselfplay.solvers")


def test_the_old_matrix_exploitability_name_is_one_line_naming_the_new():
    from lmselfplay.game_theory import matrix_games

    with pytest.raises(AttributeError, match="matrix_exploitability"):
        matrix_games.exploitability  # noqa: B018
