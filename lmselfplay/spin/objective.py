"""The exact maths of SPIN (Chen et al. 2024, "Self-Play Fine-Tuning Converts Weak
Language Models to Strong Language Models") on a finite answer set.

SPIN trains the new model ``p`` against the previous one ``p_t`` with the logistic loss

    L(p) = E_{y ~ p_data, y' ~ p_t} [ log(1 + exp(-(lam log p(y)/p_t(y) - lam log p(y')/p_t(y')))) ]

Its minimizer over all distributions (their Theorem 5.4) is the closed form

    p_{t+1}(y) ∝ p_t(y) (p_data(y) / p_t(y)) ** (1 / lam),

so in log space ``log p_{t+1} = (1 - 1/lam) log p_t + (1/lam) log p_data + const``: the
log-ratio to the data contracts by ``1 - 1/lam`` per iteration. It converges to p_data
for lam > 1/2, in one step for lam = 1, and oscillates away from it for lam < 1/2.
"""

from __future__ import annotations

import numpy as np


def spin_rate(lam: float) -> float:
    """``|1 - 1/lam|``: factor by which ``log(p_t / p_data)`` (centred) shrinks per step."""
    lam = _check_lam(lam)
    return abs(1.0 - 1.0 / lam)


def _check_lam(lam: float) -> float:
    lam = float(lam)
    if not np.isfinite(lam) or lam <= 0:
        raise ValueError(f"lam must be a positive finite number, got {lam!r}")
    return lam


def _distribution(p, name: str) -> np.ndarray:
    p = np.asarray(p, dtype=float)
    if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of non-negative weights")
    return p / p.sum()


def spin_tabular(p0, p_data, lam: float, iters: int) -> np.ndarray:
    """The SPIN iterates ``p_{t+1} ∝ p_t (p_data / p_t)^(1/lam)``, shape (iters+1, K),
    row 0 = p0 (normalized).

    Carried in log space (max subtracted before exponentiating), so no nan appears even
    for lam < 1/2, where the iterates oscillate and entries underflow to exactly 0.
    Answers with ``p_data = 0`` get probability 0 from the first step on; ``p0`` must be
    positive wherever ``p_data`` is (otherwise the update is undefined).
    """
    lam = _check_lam(lam)
    p0, q = _distribution(p0, "p0"), _distribution(p_data, "p_data")
    if p0.shape != q.shape:
        raise ValueError(f"p0 and p_data differ in length: {p0.size} vs {q.size}")
    if int(iters) != iters or iters < 0:
        raise ValueError(f"iters must be a non-negative integer, got {iters!r}")
    support = q > 0
    if np.any(p0[support] <= 0):
        raise ValueError("p0 must be positive wherever p_data is")
    log_q = np.log(q[support])
    log_p = np.log(p0[support])
    out = np.zeros((int(iters) + 1, q.size))
    out[0] = p0
    for t in range(1, int(iters) + 1):
        log_p = (1.0 - 1.0 / lam) * log_p + log_q / lam
        log_p -= log_p.max()
        log_p -= np.log(np.exp(log_p).sum())
        out[t, support] = np.exp(log_p)
    return out


def spin_expected_loss(logits, log_p_t, p_data, lam: float):
    """The SPIN logistic loss, exactly (expectations, no sampling), of ``p = softmax(logits)``
    against the opponent ``p_t``: a torch scalar, differentiable in ``logits``."""
    import torch

    log_p = torch.log_softmax(logits, dim=-1)
    r = lam * (log_p - log_p_t)  # lam * log p(y) / p_t(y)
    margin = r[:, None] - r[None, :]  # y ~ p_data (rows) vs y' ~ p_t (columns)
    weights = p_data[:, None] * torch.exp(log_p_t)[None, :]
    return (weights * torch.nn.functional.softplus(-margin)).sum()
