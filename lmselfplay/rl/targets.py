"""Supervised-target samples packed into shared rows: sequences that share a prefix share its
tokens (:func:`pack_targets`), a branching row attends through a tree mask (:func:`tree_inputs`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from lmselfplay.lm.trajectory import Sample


@dataclass
class TargetRow(Sample):
    """Pure supervised-target samples (a target, no completion) packed into one row by
    :func:`pack_targets`: ``prompt_ids`` are the nodes of their sequences' prefix tree in
    depth-first order, ``parents`` each node's parent (-1: a root), ``targets`` each sample's
    (node whose next-token logits it targets, token ids, probabilities, weight)."""

    parents: list[int] = field(default_factory=list)
    targets: list[tuple[int, list[int], list[float], float]] = field(default_factory=list)

    @property
    def branches(self) -> bool:
        """Whether the row is more than one sequence (a token whose parent is not the one before it)."""
        return any(p != i - 1 for i, p in enumerate(self.parents))


def target_entries(s: Sample) -> list[tuple[int, list[int], list[float], float]]:
    """A sample's supervised targets as (logit position in ``prompt + completion``, token ids,
    probabilities, weight): a :class:`TargetRow`'s all, another sample's one or none."""
    if isinstance(s, TargetRow):
        return s.targets
    if s.target is None:
        return []
    return [(len(s.prompt_ids) - 1 + s.target[0], s.target[1], s.target[2], s.weight)]


def pack_targets(samples: list[Sample], branching: bool = False) -> list[Sample]:
    """The pure-target samples (a target, no completion) packed into :class:`TargetRow` s, the
    other samples first, as they are. The logits of a causal LM at a token depend only on that
    token's prefix and positions, so sequences that share a prefix can share its tokens: with
    ``branching`` (the model takes a custom attention mask and position ids, :func:`tree_inputs`)
    a row is a prefix tree of sequences, each token attending to its ancestors at its depth;
    without, a row is a chain of sequences each a prefix of the next (the causal mask as it is).
    A row never gets longer than the batch's longest sequence, so it never widens a micro-batch.
    The loss is the same as one row per sample, summed in another floating-point order. The
    distillation targets (``distill_samples``: a target per answer token, each on the whole
    prompt) share all but their last few tokens."""
    pure = sorted((s for s in samples if s.target is not None and not s.completion_ids), key=lambda s: s.prompt_ids)
    width = max((len(s.prompt_ids) + len(s.completion_ids) for s in samples), default=0)
    rows: list[TargetRow] = []
    prev: list[int] = []
    path: list[int] = []  # the node of each token of prev, the last sequence placed
    for s in pure:
        # in lexicographic order the sequence placed last shares the longest prefix with s
        seq, n = s.prompt_ids, len(os.path.commonprefix([prev, s.prompt_ids]))
        row = rows[-1] if rows else None
        if row is None or not (branching or n == len(prev)) or len(row.prompt_ids) + len(seq) - n > width:
            row, n, path = TargetRow([], [], [], role=s.role, task=s.task, policy_version=s.policy_version,
                                     weight=s.weight, target=s.target), 0, []
            rows.append(row)
        start = len(row.prompt_ids)
        path = path[:n] + list(range(start, start + len(seq) - n))
        row.prompt_ids = row.prompt_ids + seq[n:]
        row.parents += [path[k - 1] if k else -1 for k in range(n, len(seq))]
        row.targets.append((path[len(seq) - 1 + s.target[0]], s.target[1], s.target[2], s.weight))
        prev = seq
    return [s for s in samples if s.completion_ids or s.target is None] + rows


def tree_inputs(samples: list[Sample], width: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The boolean 4D attention mask (True: attend) and position ids of a right-padded batch
    holding branching :class:`TargetRow` s: a node attends to its ancestors and itself at
    position = its depth; every other row (and the padding) keeps the causal mask and
    positions 0, 1, ..."""
    allowed = torch.ones(width, width, dtype=torch.bool).tril().repeat(len(samples), 1, 1)
    positions = torch.arange(width).repeat(len(samples), 1)
    for r, s in enumerate(samples):
        if not (isinstance(s, TargetRow) and s.branches):
            continue
        for i, p in enumerate(s.parents):
            allowed[r, i, : len(s.parents)] = allowed[r, p, : len(s.parents)] if p >= 0 else False
            allowed[r, i, i] = True
            positions[r, i] = positions[r, p] + 1 if p >= 0 else 0
    return {"attention_mask": allowed.unsqueeze(1).to(device), "position_ids": positions.to(device)}

