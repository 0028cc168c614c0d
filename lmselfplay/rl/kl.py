"""The KL term to the reference policy: its coefficient per game / role (:func:`parse_beta`,
:func:`beta_for`) and schedule over the run (:func:`beta_factor`), its per-token estimators
(:func:`kl_per_token`), and the reference model a sharded run loads (:func:`reference_policy`)."""

from __future__ import annotations

import math
from typing import Any

import torch

from lmselfplay.models.policy import load_policy
from lmselfplay.rl.distributed import is_partitioned
from lmselfplay.utils.config import ConfigError

BETA_SCHEDULES = ("constant", "linear", "cosine")
KL_ESTIMATORS = ("k3", "exact")


def parse_beta(value: Any) -> float | dict[str, float]:
    """A KL coefficient (``0.1``, ``"0.1"``) or one per key (``{"nim": 0.1}``,
    ``"nim=0.1,kuhn_poker/p1=0.3"``, the ``parse_weights`` syntax). ConfigError (a ValueError) names the bad
    entry: not a number, negative, or NAME=NUMBER without a name."""
    if isinstance(value, str) and "=" not in value:
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"beta {value!r} is neither a number nor NAME=NUMBER entries") from None
    if isinstance(value, str):
        items = [x.strip().partition("=") for x in value.split(",") if x.strip()]
        if any(not sep or not name.strip() for name, sep, _ in items):
            raise ConfigError(f"bad beta {value!r}: expected NAME=NUMBER entries separated by commas")
        value = {name.strip(): v.strip() for name, _, v in items}
    if isinstance(value, dict):
        out = {}
        for name, v in value.items():
            try:
                out[str(name)] = float(v)
            except (TypeError, ValueError):
                raise ConfigError(f"beta entry '{name}={v}' is not a number") from None
            if not out[str(name)] >= 0:
                raise ConfigError(f"beta entry '{name}={v}' must be >= 0")
        return out
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"beta must be a number >= 0 or a mapping of them, got {value!r}")
    return float(value)


def kl_enabled(beta: float | dict[str, float]) -> bool:
    """Whether any sample can get a KL term (then a reference policy is needed)."""
    return any(v > 0 for v in beta.values()) if isinstance(beta, dict) else beta > 0


def beta_for(beta: float | dict[str, float], role: str, task: str = "") -> float:
    """The coefficient of a sample: a scalar applies to all; a mapping is looked up by the
    longest '/'-prefix of ``role`` (``kuhn_poker/p0/initial`` -> ``kuhn_poker/p0`` ->
    ``kuhn_poker``), then ``task``, then ``default``; KeyError when none is there."""
    if not isinstance(beta, dict):
        return beta
    parts = role.split("/") if role else []
    for key in ["/".join(parts[:n]) for n in range(len(parts), 0, -1)] + [task, "default"]:
        if key and key in beta:
            return beta[key]
    raise KeyError(f"no KL coefficient for role {role!r} (task {task!r}) in beta {beta}: add it or 'default'")


def kl_per_token(estimator: str, lp: torch.Tensor | None, ref_lp: torch.Tensor | None,
                 logp_all: torch.Tensor | None = None, ref_all: torch.Tensor | None = None) -> torch.Tensor:
    """The KL term of each completion token, differentiable in the policy's log-probs.

    ``k3``: ``exp(d) - d - 1`` with ``d = ref_lp - lp`` the sampled tokens' log-ratio. Its
    value estimates KL(policy || ref), and as a loss its gradient, ``(1 - ref/pi) grad log pi``
    on the sampled token, is in expectation over on-policy samples the gradient of
    KL(ref || policy). That expectation hides a variance without bound: a token the policy
    now finds far less likely than the reference does, once sampled, has a weight
    ``ref/pi`` of thousands, and one such token can make a step's gradient norm hundreds.

    ``exact``: KL(ref || policy) = sum_v ref(v) (log ref(v) - log pi(v)) over the whole
    vocabulary at the token's position (``logp_all`` / ``ref_all``: (N, V) log-probs there),
    whose gradient on the logits, ``pi - ref``, is k3's expected gradient, bounded, and
    pulls back every move a visited position has collapsed away from, sampled or not."""
    if estimator == "k3":
        d = ref_lp - lp
        return torch.exp(d) - d - 1.0
    if logp_all is None or ref_all is None:
        raise ValueError("the exact KL needs the policy's and the reference's log-probs over the vocabulary")
    return (ref_all.exp() * (ref_all - logp_all)).sum(-1)


def beta_factor(cfg: Any, step: int, total_steps: int) -> float:
    """The schedule's multiplier at trainer step ``step``: 1 at step 0, ``beta_final_ratio``
    from ``total_steps`` on; linear or half-cosine in between (constant: always 1)."""
    if cfg.beta_schedule == "constant" or total_steps <= 0:
        return 1.0
    frac = min(max(step / total_steps, 0.0), 1.0)
    shape = frac if cfg.beta_schedule == "linear" else (1 - math.cos(math.pi * frac)) / 2
    return 1.0 + (cfg.beta_final_ratio - 1.0) * shape



def reference_policy(policy: Any, beta: float | dict[str, float], model: Any, device: str) -> Any:
    """The reference model a KL run (``beta``, the trainer config's) must load itself: under
    ZeRO-3 init (weights sharded at load) without LoRA the trainer cannot copy the initial
    policy, so it is loaded a second time from ``policy`` (the PolicyConfig); None otherwise
    (the trainer copies it, or LoRA's disabled adapter is it)."""
    if not kl_enabled(beta) or policy.use_lora or not is_partitioned(model):
        return None
    return load_policy(policy, device=device, use_lora=False)[0]

