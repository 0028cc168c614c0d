"""The terms of the trainer's loss (:mod:`lmselfplay.rl.trainer` has the whole loss), per
completion token of a micro-batch:

    ratio = exp(logp - old)
    pg    = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)        policy_gradient
    kl    = exp(ref - logp) - (ref - logp) - 1, or KL(ref || policy)   kl_term
    ce    = -sum_v target(v) * log softmax(logits / T)(v)              target_term
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from lmselfplay.lm.batching import over_positions
from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.importance import TruncatedImportance
from lmselfplay.rl.kl import kl_per_token
from lmselfplay.rl.targets import target_entries
from lmselfplay.rl.trainer_config import SurrogateConfig


def policy_gradient(surrogate: SurrogateConfig | None, importance: TruncatedImportance, mb: list[Sample],
                    lp: torch.Tensor, b: dict[str, torch.Tensor], w: torch.Tensor,
                    first_pass: bool) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate per token and its metrics (``clip_frac``, ``ratio``; with
    ``tis_cap`` the TIS weights' on the first pass). The ratio is against the engine's
    log-probs, or with ``tis_cap`` against the trainer's own at the step's start, the
    mismatch weighted. Without a :class:`SurrogateConfig` zero (every advantage is 0:
    checked in ``step``) and no metrics."""
    if surrogate is None:
        return torch.zeros_like(lp), {}
    eps, old, tis, parts = surrogate.epsilon, b["old"], None, {}
    if surrogate.tis_cap > 0:
        old = importance.old_logprobs(mb, lp, b["mask"], first_pass)
        tis, tis_parts = importance.weights(old, b["old"], w)
        parts.update(tis_parts if first_pass else {})
    ratio = torch.exp(torch.clamp(lp - old, -20, 20))
    adv = b["adv"].unsqueeze(1)
    pg = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
    if tis is not None:
        pg = pg * tis
    with torch.no_grad():
        wsum = w.sum().clamp_min(1e-8)
        parts.update(clip_frac=float((((ratio - 1).abs() > eps).float() * w).sum() / wsum),
                     ratio=float((ratio * w).sum() / wsum))
    return pg, parts


def kl_term(estimator: str, temperature: float, mb: list[Sample], logits: torch.Tensor, lp: torch.Tensor,
            b: dict[str, torch.Tensor], ref_rows: dict[int, torch.Tensor]) -> torch.Tensor:
    """:func:`kl_per_token` on the micro-batch's grid (zero off the completion tokens).
    The exact KL works on the completion positions only: the reference rows of the
    step (row-major, as ``mask`` enumerates them) against the policy's there."""
    if estimator == "k3":
        return kl_per_token("k3", lp, b["ref"])
    if not any(s.completion_ids for s in mb):  # only targets (ZeRO-3 brings them here): no KL
        return torch.zeros_like(lp)
    ref_all = torch.cat([ref_rows[id(s)] for s in mb if s.completion_ids])
    block = partial(exact_kl_block, temperature=temperature)
    rows, cols, (exact,) = over_positions(logits, F.pad(b["mask"].bool(), (0, 1)), block, ref_all)
    return torch.zeros_like(lp).index_put((rows, cols), exact)


def exact_kl_block(x: torch.Tensor, ref_all: torch.Tensor, temperature: float) -> tuple[torch.Tensor]:
    """KL(ref || policy) at a block of positions (x: their float32 logits, ref_all: the
    reference's log-probs there, kept on the CPU)."""
    logp_all = torch.log_softmax(x / temperature, dim=-1)
    return (kl_per_token("exact", None, None, logp_all, ref_all.to(x.device)),)


def target_term(mb: list[Sample], logits: torch.Tensor, temperature: float, target_total: float,
                columns: list[int] | None = None) -> tuple[torch.Tensor | float, float | None]:
    """Cross-entropy from each target distribution of the micro-batch (:func:`target_entries`:
    ``Sample.target``, index into the completion, token ids, probabilities, or a
    :class:`TargetRow`'s several) to the policy's next-token distribution at its position,
    weighted by its sample's weight and divided by the total target weight of this rank's
    batch (``target_total``); 0 when the micro-batch has none. ``logits``: the micro-batch's
    forward (rows in ``mb``'s order) at every position, or at the positions ``columns`` only;
    the policy-gradient forward's is reused, so the term costs no forward of its own and
    every rank makes the same forwards whatever its samples (ZeRO-3 gathers shards per forward)."""
    entries = [(r, e) for r, s in enumerate(mb) for e in target_entries(s)]
    if not entries:
        return 0.0, None
    col = {p: i for i, p in enumerate(columns)} if columns is not None else None
    rows = torch.tensor([r for r, _ in entries], device=logits.device)
    pos = torch.tensor([e[0] if col is None else col[e[0]] for _, e in entries], device=logits.device)
    logp = torch.log_softmax(logits[rows, pos].float() / temperature, dim=-1)
    probs = torch.zeros_like(logp)  # a token listed twice counts twice
    for i, (_, e) in enumerate(entries):
        probs[i].index_add_(0, torch.tensor(e[1], device=probs.device),
                            torch.tensor(e[2], dtype=probs.dtype, device=probs.device))
    ce = -(logp * probs).sum(-1)
    w = torch.tensor([e[3] for _, e in entries], dtype=ce.dtype, device=ce.device)
    return (ce * w).sum() / max(target_total, 1e-8), float((ce * w).detach().sum() / w.sum())

