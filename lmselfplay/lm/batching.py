"""The one padded-batch builder and the one teacher-forced log-prob function.

Generation pads on the LEFT (every prompt ends where generation starts); training and
scoring pad on the RIGHT (every sequence starts at position 0, so a token's position —
and thus its log-prob — does not depend on the other rows). Both go through
:func:`pad_batch`; every log-prob of a sampled or scored token goes through
:func:`logprobs_from_logits`, so the trainer, the engines and the metrics compute the same numbers.

Memory: a real vocabulary is ~150k entries, so a (batch, length, vocab) float32 tensor is
600 KB per token. Log-probs are computed by :func:`over_positions`, a block of positions at a
time (``LOGPROB_BLOCK_ELEMENTS`` float32 values), so only one block's float32 copy exists at
once, in the forward and — recomputed under activation checkpointing — in the backward.
Scoring (:func:`sequence_logprobs`) projects onto the vocabulary only the positions that predict
a completion token, a bounded number of them per forward (``SCORE_LOGIT_ELEMENTS``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

LOGPROB_BLOCK_ELEMENTS = 1 << 24  # float32 values of one block of (positions, vocab): 64 MB
SCORE_LOGIT_ELEMENTS = 1 << 26  # vocabulary-sized values one scoring forward keeps: 256 MB in float32


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


def _blocks(logits: torch.Tensor, positions: int) -> Iterator[tuple[int, int, torch.Tensor]]:
    """(first row, first column, block) covering ``logits`` (B, T, V) in row-major order, each
    block (rows, columns, V) of at most ``positions`` positions (one position at least).

    Blocks are views made by one ``split`` / ``unbind``, so the backward assembles the gradient
    of ``logits`` once; slicing each block separately would allocate a zero tensor the size of
    ``logits`` per block in the backward."""
    n_rows, width = logits.shape[:2]
    if width <= positions:
        rows = max(1, positions // max(width, 1))
        for r0, block in zip(range(0, n_rows, rows), logits.split(rows, dim=0), strict=True):
            yield r0, 0, block
        return
    for r, row in enumerate(logits.unbind(0)):
        for c0, block in zip(range(0, width, positions), row.split(positions, dim=0), strict=True):
            yield r, c0, block.unsqueeze(0)


def _apply_block(fn: Callable[..., tuple[torch.Tensor, ...]], block: torch.Tensor, rows: torch.Tensor,
                 cols: torch.Tensor, *aligned: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return fn(block[rows, cols].float(), *aligned)


def over_positions(logits: torch.Tensor, where: torch.Tensor, fn: Callable[..., tuple[torch.Tensor, ...]],
                   *aligned: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``fn(x, *aligned_part)`` on the float32 logits ``x`` (k, V) of the positions where
    ``where`` (B, T) is True, a block of positions at a time; ``aligned`` are tensors with one
    row per selected position (row-major order), cut alike. Returns (rows, cols, outputs):
    the selected positions and each of ``fn``'s outputs concatenated in that order.

    While gradients are recorded each block runs under activation checkpointing: its float32
    intermediates are freed after the forward and recomputed in the backward, so a step never
    holds more than one block's worth. ``fn`` must return a tuple of tensors."""
    n_rows, width, vocab = logits.shape
    per_block = max(1, LOGPROB_BLOCK_ELEMENTS // max(vocab, 1))
    record = torch.is_grad_enabled() and logits.requires_grad
    where = where.to(logits.device, torch.bool)
    all_rows, all_cols, outs, start = [], [], [], 0
    for r0, c0, block in _blocks(logits, per_block):
        rows, cols = where[r0 : r0 + block.shape[0], c0 : c0 + block.shape[1]].nonzero(as_tuple=True)
        if not len(rows):
            continue
        part = [a[start : start + len(rows)] for a in aligned]
        start += len(rows)
        if record:
            res = checkpoint(_apply_block, fn, block, rows, cols, *part, use_reentrant=False)
        else:
            res = _apply_block(fn, block, rows, cols, *part)
        all_rows.append(rows + r0)
        all_cols.append(cols + c0)
        outs.append(res)
    if not outs:
        empty = torch.zeros(0, dtype=torch.long, device=logits.device)
        return empty, empty, []
    return torch.cat(all_rows), torch.cat(all_cols), [torch.cat(parts) for parts in zip(*outs, strict=True)]


def _selected_and_entropy(x: torch.Tensor, targets: torch.Tensor, temperature: float,
                          with_entropy: bool) -> tuple[torch.Tensor, ...]:
    """log softmax(x / T) at ``targets``, and the entropy of softmax(x / T) = lse - sum p x."""
    x = x / temperature
    lse = torch.logsumexp(x, dim=-1)
    lp = x.gather(1, targets.unsqueeze(1)).squeeze(1) - lse
    if not with_entropy:
        return (lp,)
    return lp, lse - (F.softmax(x, dim=-1) * x).sum(-1)


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False, where: torch.Tensor | None = None):
    """:func:`logprobs_from_logits` of the model's forward on ``input_ids`` (every position's
    logits: for the tests' references and small batches; scoring uses :func:`sequence_logprobs`).
    Differentiable; callers add ``no_grad`` when scoring."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return logprobs_from_logits(logits, input_ids, temperature, with_entropy, where)


def logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0,
                         with_entropy: bool = False, where: torch.Tensor | None = None):
    """Log-prob of each next token, shape (B, T-1), under ``log_softmax(logits / T)`` in
    float32, and optionally the entropy there (else ``None``), from a forward's logits
    (B, T, V). ``where`` (B, T-1, bool): the positions to compute (the completion tokens,
    say); the others are 0. Computed by :func:`over_positions` (no (B, T, V) float32 tensor)."""
    n_rows, width = input_ids.shape
    grid = torch.zeros((n_rows, max(width - 1, 0)), dtype=torch.bool, device=logits.device)
    if where is None:
        grid[:] = True
    else:
        grid |= where.to(logits.device, torch.bool)
    grid = F.pad(grid, (0, 1))  # the last position predicts nothing
    targets = input_ids.to(logits.device)[:, 1:][grid[:, :-1]]
    fn = functools.partial(_selected_and_entropy, temperature=temperature, with_entropy=with_entropy)
    rows, cols, outs = over_positions(logits, grid, fn, targets)
    if not outs:  # nothing selected: zeros, still part of the graph (a loss built on them has a gradient)
        zero = logits.sum() * 0.0
        return (torch.zeros(grid[:, :-1].shape, device=logits.device) + zero,
                torch.zeros(grid[:, :-1].shape, device=logits.device) + zero if with_entropy else None)
    base = torch.zeros(grid[:, :-1].shape, dtype=outs[0].dtype, device=logits.device)
    lp = base.index_put((rows, cols), outs[0])
    return lp, base.index_put((rows, cols), outs[1]) if with_entropy else None


def completion_positions(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
                         width: int) -> torch.Tensor:
    """(B, width - 1) bool: the next-token positions that predict each completion's tokens
    in a right-padded batch of ``prompt + completion`` rows."""
    where = torch.zeros((len(prompts), max(width - 1, 0)), dtype=torch.bool)
    for r, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        where[r, len(p) - 1 : len(p) - 1 + len(c)] = True
    return where


def score_chunks(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], vocab: int,
                 budget: int | None = None) -> list[list[int]]:
    """Row indices of each scoring forward: rows ordered by where their completion starts, then
    consecutive rows while rows x kept columns x ``vocab`` stays within ``budget`` values
    (``SCORE_LOGIT_ELEMENTS``; one row at least). The kept columns of a chunk are the span from
    its first completion-predicting position to its last (:func:`score_span`)."""
    budget = SCORE_LOGIT_ELEMENTS if budget is None else budget
    order = sorted(range(len(prompts)), key=lambda r: (len(prompts[r]), len(completions[r])))
    chunks: list[list[int]] = []
    for r in order:
        grown = (chunks[-1] if chunks else []) + [r]
        lo, hi = score_span([prompts[i] for i in grown], [completions[i] for i in grown])
        if chunks and len(grown) * (hi - lo) * vocab <= budget:
            chunks[-1] = grown
        else:
            chunks.append([r])
    return chunks


def score_span(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> tuple[int, int]:
    """[lo, hi): the next-token positions that predict some completion token of these rows."""
    lo = min(max(len(p) - 1, 0) for p in prompts)
    hi = max(len(p) - 1 + len(c) for p, c in zip(prompts, completions, strict=True))
    return lo, max(hi, lo)


def output_vocab(model: Any) -> int:
    """Rows of the model's output projection (what one position's logits hold)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is not None:
        return int(getattr(weight, "ds_shape", weight.shape)[0])
    return int(model.config.vocab_size)


@torch.no_grad()
def sequence_logprobs(model: Any, prompts: list[list[int]], completions: list[list[int]],
                      pad_id: int, temperature: float = 1.0) -> list[list[float]]:
    """Teacher-forced log-probs of each completion's tokens given its prompt (lists).

    Only the positions that predict a completion token are projected onto the vocabulary: each
    forward (:func:`score_chunks`) keeps the logits of its rows' completion span alone
    (``logits_to_keep``), so a forward holds at most ``SCORE_LOGIT_ELEMENTS`` vocabulary-sized
    values however long the prompts, however many rows and however large the vocabulary."""
    out: list[list[float]] = [[] for _ in prompts]
    device = next(model.parameters()).device
    for rows in score_chunks(prompts, completions, output_vocab(model)):
        ps, cs = [prompts[r] for r in rows], [completions[r] for r in rows]
        lo, hi = score_span(ps, cs)
        if hi == lo:  # no completion token in this chunk
            continue
        ids, mask = pad_batch([list(p) + list(c) for p, c in zip(ps, cs)], pad_id)
        where = completion_positions(ps, cs, ids.shape[1])[:, lo:hi]
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False,
                       logits_to_keep=torch.arange(lo, hi, device=device)).logits
        targets = ids[:, lo + 1 : hi + 1][where].to(device)
        fn = functools.partial(_selected_and_entropy, temperature=temperature, with_entropy=False)
        _, _, outs = over_positions(logits, where, fn, targets)
        flat = outs[0].cpu().tolist() if outs else []
        start = 0
        for r, c in zip(rows, cs):  # over_positions returns the positions row-major, each row's in order
            out[r], start = flat[start : start + len(c)], start + len(c)
    return out
