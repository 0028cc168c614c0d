"""Rewards for a task proposer, from how often the solver got its task right.

The Absolute Zero (Zhao et al. 2025) and R-Zero (Huang et al. 2025) recipes call these
— one implementation. ``outcomes[i, g]`` is 1 when the g-th of G solver attempts at
task i was right (by the verifier, or by agreement with the majority pseudo-label of
:func:`lmselfplay.verifiers.vote.majority_agreement`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lmselfplay.verifiers.vote import int_table


class ProposerRewards(NamedTuple):
    success_rate: np.ndarray  # r̄: fraction of the G attempts that were right
    absolute_zero: np.ndarray  # AZR learnability: 0 if r̄ = 0 (unsolvable), else 1 - r̄
    uncertainty: np.ndarray  # R-Zero: 1 - 2|r̄ - 1/2|, highest at r̄ = 1/2
    variance: np.ndarray  # r̄(1 - r̄): variance of the solver's 0/1 reward


def proposer_rewards(outcomes) -> ProposerRewards:
    """Four per-task rewards (each shape (n_tasks,)) from a 0/1 outcome table (n_tasks, G)."""
    o = int_table(outcomes, "outcomes")
    if np.any((o != 0) & (o != 1)):
        raise ValueError("outcomes must be 0 or 1")
    r = o.mean(axis=1)
    azr = np.where(r == 0, 0.0, 1.0 - r)
    return ProposerRewards(r, azr, 1.0 - 2.0 * np.abs(r - 0.5), r * (1.0 - r))
