"""Rewards for a task proposer, from how often the solver got its task right.

The Absolute Zero (Zhao et al. 2025) and R-Zero (Huang et al. 2025) recipes call these
— one implementation. ``outcomes[i, g]`` is 1 when the g-th of G solver attempts at
task i was right (by the verifier, or by agreement with the majority pseudo-label).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class ProposerRewards(NamedTuple):
    success_rate: np.ndarray  # r̄: fraction of the G attempts that were right
    absolute_zero: np.ndarray  # AZR learnability: 0 if r̄ = 0 (unsolvable), else 1 - r̄
    uncertainty: np.ndarray  # R-Zero: 1 - 2|r̄ - 1/2|, highest at r̄ = 1/2
    variance: np.ndarray  # r̄(1 - r̄): variance of the solver's 0/1 reward


def _int_table(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"{name} must be a 2-D array (n_tasks, n) with n >= 1, got {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer) and not np.issubdtype(a.dtype, np.bool_):
        raise ValueError(f"{name} must hold integers, got dtype {a.dtype}")
    return a.astype(np.int64)


def proposer_rewards(outcomes) -> ProposerRewards:
    """Four per-task rewards (each shape (n_tasks,)) from a 0/1 outcome table (n_tasks, G)."""
    o = _int_table(outcomes, "outcomes")
    if np.any((o != 0) & (o != 1)):
        raise ValueError("outcomes must be 0 or 1")
    r = o.mean(axis=1)
    azr = np.where(r == 0, 0.0, 1.0 - r)
    return ProposerRewards(r, azr, 1.0 - 2.0 * np.abs(r - 0.5), r * (1.0 - r))


def majority_agreement(answers) -> tuple[np.ndarray, np.ndarray]:
    """Majority vote per task over m answer ids (n_tasks, m).

    Returns ``(labels, agreement)``: the most frequent id (ties to the smallest id) and
    the fraction p̂ of the m answers equal to it.
    """
    a = _int_table(answers, "answers")
    # counts[i, k] = how many answers of task i equal answer k (m is small: a vote)
    counts = (a[:, :, None] == a[:, None, :]).sum(axis=2)
    best = counts.max(axis=1, keepdims=True)
    labels = np.where(counts == best, a, np.iinfo(np.int64).max).min(axis=1)
    return labels, best[:, 0] / a.shape[1]
