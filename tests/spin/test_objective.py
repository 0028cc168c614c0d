"""SPIN's closed-form update is the minimizer of its logistic loss (Chen et al. 2024,
Thm 5.4), and its log-ratio to the data contracts by |1 - 1/lam| per step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmselfplay.spin.objective import spin_expected_loss, spin_rate, spin_tabular

P_DATA = np.array([0.1, 0.2, 0.3, 0.4])
P0 = np.array([0.55, 0.25, 0.15, 0.05])


def minimize_spin_loss(p_t: np.ndarray, lam: float) -> np.ndarray:
    """argmin over a free distribution on 4 answers (softmax logits), by L-BFGS."""
    log_p_t = torch.tensor(np.log(p_t), dtype=torch.float64)
    q = torch.tensor(P_DATA, dtype=torch.float64)
    logits = log_p_t.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([logits], lr=1.0, max_iter=500, tolerance_grad=1e-14,
                            tolerance_change=1e-16, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = spin_expected_loss(logits, log_p_t, q, lam)
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    return torch.softmax(logits, -1).detach().numpy()


@pytest.mark.parametrize("lam", [0.7, 1.0, 2.5])
def test_closed_form_is_the_minimizer_of_the_spin_loss(lam):
    closed = spin_tabular(P0, P_DATA, lam, 3)
    p = P0
    for t in range(1, 4):  # three SPIN iterations, each by numerical minimization
        p = minimize_spin_loss(p, lam)
        np.testing.assert_allclose(p, closed[t], atol=1e-6)
    # and the minimizer really beats a perturbation of it
    log_p_t = torch.tensor(np.log(closed[2]), dtype=torch.float64)
    q = torch.tensor(P_DATA, dtype=torch.float64)
    best = spin_expected_loss(torch.tensor(np.log(closed[3])), log_p_t, q, lam)
    worse = spin_expected_loss(torch.tensor(np.log(closed[3]) + [0.05, 0, 0, 0]), log_p_t, q, lam)
    assert best < worse


def test_lam_one_reaches_the_data_in_one_step_and_data_is_a_fixed_point():
    traj = spin_tabular(P0, P_DATA, 1.0, 2)
    np.testing.assert_allclose(traj[0], P0)
    np.testing.assert_allclose(traj[1:], [P_DATA, P_DATA], atol=1e-15)
    np.testing.assert_allclose(spin_tabular(P_DATA, P_DATA, 0.3, 5)[-1], P_DATA, atol=1e-12)


@pytest.mark.parametrize("lam", [0.3, 0.6, 0.9, 1.5, 4.0])
def test_log_ratio_scales_by_spin_rate_each_step(lam):
    traj = spin_tabular(P0, P_DATA, lam, 6)
    d = np.log(traj) - np.log(P_DATA)
    d -= d.mean(1, keepdims=True)  # log-ratios are defined up to the normalizer
    ratios = np.linalg.norm(d[1:], axis=1) / np.linalg.norm(d[:-1], axis=1)
    np.testing.assert_allclose(ratios, spin_rate(lam), rtol=1e-9)
    assert spin_rate(lam) == pytest.approx(abs(1 - 1 / lam))
    # the sign flips each step when lam < 1 (overshoot), never when lam > 1
    signs = np.sign(d[1:, 0] * d[:-1, 0])
    assert np.all(signs == (-1 if lam < 1 else 1))


def test_small_lam_oscillates_without_nan_even_when_entries_underflow():
    traj = spin_tabular(P0, P_DATA, 0.2, 60)  # rate 4: log-ratios grow like 4**t
    assert np.all(np.isfinite(traj))
    np.testing.assert_allclose(traj.sum(1), 1.0)
    assert np.any(traj[-5:] == 0.0)  # underflowed entries are exact zeros, not nan
    assert np.abs(traj[-1] - P_DATA).max() > 0.5  # diverges from the data for lam < 1/2
    assert np.abs(spin_tabular(P0, P_DATA, 0.8, 60)[-1] - P_DATA).max() < 1e-12


def test_zero_data_mass_and_bad_inputs():
    traj = spin_tabular(P0, [0.5, 0.5, 0.0, 0.0], 2.0, 3)
    assert np.all(traj[1:, 2:] == 0.0) and np.all(np.isfinite(traj))
    with pytest.raises(ValueError, match="positive wherever"):
        spin_tabular([1.0, 0.0], [0.5, 0.5], 2.0, 1)
    with pytest.raises(ValueError, match="lam"):
        spin_tabular(P0, P_DATA, 0.0, 1)
    with pytest.raises(ValueError, match="lam"):
        spin_rate(float("nan"))
    with pytest.raises(ValueError, match="differ in length"):
        spin_tabular(P0, [0.5, 0.5], 2.0, 1)
    with pytest.raises(ValueError, match="non-negative"):
        spin_tabular([-1.0, 2.0], [0.5, 0.5], 2.0, 1)
