"""Advantage estimators shared by the on-policy recipes. All are checkpointable.

* :class:`RoleBaselines` — SPIRAL's role-conditioned advantage estimation (RAE): one EMA
  baseline per role key (game x seat x start condition); the advantage uses the baseline
  as it was *before* this batch, then the baseline absorbs the batch's returns; with
  :func:`observation_key` keys, one per (role, observation): a tabular critic for small games;
* :func:`group_advantages` — GRPO: return minus the mean of its group (optionally / std).
* :func:`task_type_advantages` — Absolute Zero's TRR++: normalize within each
  (task type, role) bucket of the batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np


class RoleBaselines:
    def __init__(self, decay: float = 0.95):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"baseline decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.values: dict[str, float] = {}

    def advantages(self, roles: Sequence[str], returns: Sequence[float],
                   fallback: Sequence[str] | None = None) -> np.ndarray:
        """A_i = R_i - b[role_i] with b read before the update; then update b. A key with
        no baseline yet reads ``fallback[i]``'s (0 when that has none either) and starts
        its EMA from it."""
        fallback = fallback if fallback is not None else [""] * len(roles)
        adv = np.array([r - self.values.get(k, self.values.get(f, 0.0)) for k, r, f in zip(roles, returns, fallback)],
                       dtype=float)
        for k, r, f in zip(roles, returns, fallback):
            b = self.values.get(k, self.values.get(f, 0.0))
            self.values[k] = self.decay * b + (1.0 - self.decay) * float(r)
        return adv

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "values": dict(self.values)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay = float(state["decay"])
        self.values = {k: float(v) for k, v in state["values"].items()}


def observation_key(role: str, prompt_ids: Sequence[int]) -> str:
    """The baseline key of one turn: its role and a digest of the exact prompt it saw."""
    import hashlib

    return f"{role}|{hashlib.sha1(np.asarray(prompt_ids, dtype=np.int64).tobytes()).hexdigest()[:16]}"


def group_advantages(rewards: np.ndarray, normalize_std: bool = True, eps: float = 1e-6) -> np.ndarray:
    """GRPO: ``rewards`` of shape (n_groups, G) -> same shape, centred per group."""
    r = np.asarray(rewards, dtype=float)
    if r.ndim != 2:
        raise ValueError(f"group rewards must be 2-D (n_groups, G), got shape {r.shape}")
    a = r - r.mean(axis=1, keepdims=True)
    if normalize_std:
        a = a / (r.std(axis=1, keepdims=True) + eps)
    return a


def task_type_advantages(keys: Sequence[str], rewards: Sequence[float], normalize_std: bool = True,
                         eps: float = 1e-6) -> np.ndarray:
    """TRR++: per (task type, role) key, ``(r - mean_key) / std_key`` within the batch."""
    r = np.asarray(rewards, dtype=float)
    out = np.zeros_like(r)
    buckets: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        buckets[k].append(i)
    for idx in buckets.values():
        vals = r[idx]
        a = vals - vals.mean()
        if normalize_std:
            a = a / (vals.std() + eps)
        out[idx] = a
    return out
