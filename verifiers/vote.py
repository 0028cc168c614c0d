"""The vote as a referee: the majority of m answers is the label (R-Zero's pseudo-label).

The weakest referee this project has, measured by the referee study rather than trusted:
:func:`majority_agreement` gives each task's majority answer and the agreement p-hat with it.
"""

from __future__ import annotations

import numpy as np


def int_table(x, name: str) -> np.ndarray:
    """``x`` as an int64 table (n_tasks, n) with n >= 1, else ValueError naming ``name``."""
    a = np.asarray(x)
    if a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"{name} must be a 2-D array (n_tasks, n) with n >= 1, got {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer) and not np.issubdtype(a.dtype, np.bool_):
        raise ValueError(f"{name} must hold integers, got dtype {a.dtype}")
    return a.astype(np.int64)


def majority_agreement(answers) -> tuple[np.ndarray, np.ndarray]:
    """Majority vote per task over m answer ids (n_tasks, m).

    Returns ``(labels, agreement)``: the most frequent id (ties to the smallest id) and
    the fraction p̂ of the m answers equal to it.
    """
    a = int_table(answers, "answers")
    # counts[i, k] = how many answers of task i equal answer k (m is small: a vote)
    counts = (a[:, :, None] == a[:, None, :]).sum(axis=2)
    best = counts.max(axis=1, keepdims=True)
    labels = np.where(counts == best, a, np.iinfo(np.int64).max).min(axis=1)
    return labels, best[:, 0] / a.shape[1]
