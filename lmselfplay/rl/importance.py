"""Truncated importance sampling (TIS) of the trainer-engine mismatch.

The engine samples from its own distribution ``mu`` (other kernels, bf16, a fused sampler, or
weights up to ``max_staleness`` versions old) and reports ``log mu`` of every sampled token. The
trainer's policy at the start of the step is ``pi_old`` (its own log-probs, computed in the step's
first pass before any update). Without correction the PPO ratio is taken against ``mu``: a token
whose ``pi_old / mu`` is already outside ``[1 - eps, 1 + eps]`` is clipped before the policy has
moved at all, so the gradient is biased toward whatever the mismatch happens to favour. With
``tis_cap = C > 0`` (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy
RL training"; the rule of verl's and TRL's ``vllm_importance_sampling_cap``):

    ratio = exp(logp - logp_old)                      (PPO's trust region, on the trainer's own)
    w     = min(exp(logp_old - log mu), C)            (detached; per token)
    pg    = w * -min(ratio * A, clip(ratio, 1-eps, 1+eps) * A)

so ``E_mu[w * A * grad logp] = E_pi_old[A * grad logp]`` wherever the cap does not bind: the
on-policy gradient, whatever the engine's mismatch. Logged per step: ``tis/weight`` (mean w),
``tis/capped`` (share of tokens at the cap), beside ``logprob_diff`` (the weight-sync check's).
"""

from __future__ import annotations

import torch

from lmselfplay.lm.trajectory import Sample


class TruncatedImportance:
    """The step's ``logp_old`` per sample (kept from the first pass) and the TIS weights."""

    def __init__(self, cap: float):
        if cap < 0:
            raise ValueError(f"tis_cap must be >= 0 (0: off), got {cap}")
        self.cap = cap
        self._old: dict[int, torch.Tensor] = {}

    def begin_step(self) -> None:
        self._old.clear()

    def old_logprobs(self, mb: list[Sample], lp: torch.Tensor, mask: torch.Tensor, first_pass: bool) -> torch.Tensor:
        """``logp_old`` on the micro-batch's grid: the current ``lp`` (detached) in the first pass,
        kept per sample for the later passes (their micro-batches are shuffled differently)."""
        at = mask.bool()
        if first_pass:
            rows = lp.detach()[at].split([int(n) for n in at.sum(1).tolist()])
            for s, row in zip(mb, rows):
                self._old[id(s)] = row
            return lp.detach()
        old = torch.zeros_like(lp)
        old[at] = torch.cat([self._old[id(s)] for s in mb]).to(lp.dtype)
        return old

    def weights(self, old_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor
                ) -> tuple[torch.Tensor, dict[str, float]]:
        """(per-token ``min(exp(logp_old - log mu), cap)``, its metrics over ``mask``'s weights)."""
        raw = torch.exp(torch.clamp(old_lp.detach() - engine_lp, -20, 20))
        w = torch.clamp(raw, max=self.cap)
        m = mask.float()
        total = m.sum().clamp_min(1e-8)
        return w, {"tis/weight": float((w * m).sum() / total),
                   "tis/capped": float(((raw >= self.cap).float() * m).sum() / total)}
