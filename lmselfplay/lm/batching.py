"""The one padded-batch builder and the one teacher-forced log-prob function.

Generation pads on the LEFT (every prompt ends where generation starts); training and
scoring pad on the RIGHT (every sequence starts at position 0, so a token's position —
and thus its log-prob — does not depend on the other rows). Both go through
:func:`pad_batch`; every log-prob of a sampled or scored token goes through
:func:`token_logprobs`, so the trainer, the engines and the metrics compute the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of shape (len(seqs), longest), padded on ``side``."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(seqs):
        cols = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[r, cols] = torch.tensor(list(s), dtype=torch.long)
        mask[r, cols] = 1
    return ids, mask


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False):
    """Log-prob of each next token (shape (B, T-1)) under ``log_softmax(logits / T)`` and
    optionally the entropy there. Differentiable; callers add ``no_grad`` when scoring."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    return logprobs_from_logits(logits, input_ids, temperature, with_entropy)


def logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0,
                         with_entropy: bool = False):
    """:func:`token_logprobs` from a forward's logits (B, T, V) already computed."""
    logits = logits[:, :-1].float() / temperature
    logp_all = F.log_softmax(logits, dim=-1)
    lp = logp_all.gather(2, input_ids[:, 1:].unsqueeze(2)).squeeze(2)
    if not with_entropy:
        return lp, None
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return lp, ent


@torch.no_grad()
def sequence_logprobs(model: Any, prompts: list[list[int]], completions: list[list[int]],
                      pad_id: int, temperature: float = 1.0) -> list[list[float]]:
    """Teacher-forced log-probs of each completion's tokens given its prompt (lists)."""
    if not prompts:
        return []
    ids, mask = pad_batch([list(p) + list(c) for p, c in zip(prompts, completions)], pad_id)
    device = next(model.parameters()).device
    tok_lp, _ = token_logprobs(model, ids.to(device), mask.to(device), temperature)
    tok_lp = tok_lp.cpu()
    return [tok_lp[r, len(p) - 1 : len(p) - 1 + len(c)].tolist() for r, (p, c) in enumerate(zip(prompts, completions))]
