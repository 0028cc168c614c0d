"""A step's samples as padded batches under a token cap: :func:`micro_batches` groups them,
:func:`by_length` orders them, :func:`split_by_tokens` cuts them, :func:`collate` pads one
micro-batch into tensors."""

from __future__ import annotations

import math
import random

import torch

from lmselfplay.lm.batching import pad_batch
from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.targets import TargetRow, tree_inputs


def collate(samples: list[Sample], pad_id: int, device: torch.device,
            ref: dict[int, list[float]] | None = None) -> dict[str, torch.Tensor]:
    """Right-padded batch; ``mask`` marks completion tokens as positions in the shifted
    (next-token) frame, aligned with ``behaviour`` log-probs. With a branching
    :class:`TargetRow` the attention mask is 4D, with position ids (:func:`tree_inputs`)."""
    ids, attn = pad_batch([s.prompt_ids + s.completion_ids for s in samples], pad_id)
    n, width = ids.shape
    mask = torch.zeros((n, width - 1))
    old = torch.zeros((n, width - 1))
    ref_lp = torch.zeros((n, width - 1))
    adv = torch.zeros(n)
    weight = torch.zeros(n)
    for r, s in enumerate(samples):
        a, b = len(s.prompt_ids) - 1, len(s.prompt_ids) + len(s.completion_ids) - 1
        mask[r, a:b] = 1.0
        old[r, a:b] = torch.tensor(s.behaviour_logprobs[: b - a], dtype=torch.float)
        if ref is not None and b > a:  # pure-target samples have no completion tokens (no reference)
            ref_lp[r, a:b] = torch.tensor(ref[id(s)], dtype=torch.float)
        adv[r] = s.advantage / s.weight  # merged samples: mean advantage, counted `weight` times
        weight[r] = s.weight
    out = {k: v.to(device) for k, v in dict(input_ids=ids, attention_mask=attn, mask=mask, old=old,
                                            ref=ref_lp, adv=adv, weight=weight).items()}
    if any(isinstance(s, TargetRow) and s.branches for s in samples):
        out.update(tree_inputs(samples, width, device))
    return out



def by_length(samples: list[Sample]) -> list[Sample]:
    """``samples`` longest ``prompt + completion`` first, equal lengths in their given order (a
    stable sort). Runs cut from it by :func:`split_by_tokens` hold sequences of about one length,
    so a row is padded only to its neighbours' width (the main job's step: 0.83 of the padded
    tokens real when cut in the shuffled order, 0.92 cut this way; ``benchmarks/bench_main_job.py
    --grouping``). The trainer keys every result of a row by its sample, never by its place."""
    return sorted(samples, key=lambda s: -(len(s.prompt_ids) + len(s.completion_ids)))


def split_by_tokens(samples: list[Sample], max_tokens: int) -> list[list[Sample]]:
    """``samples`` cut, in order, into runs whose right-padded batch (rows x longest
    ``prompt + completion``) holds at most ``max_tokens`` tokens; a sample longer than the cap is
    a run of its own (a sequence is never split). ``max_tokens`` 0: one run. No sample: no run."""
    runs: list[list[Sample]] = []
    width = 0
    for s in samples:
        n = len(s.prompt_ids) + len(s.completion_ids)
        if runs and (not max_tokens or (len(runs[-1]) + 1) * max(width, n) <= max_tokens):
            runs[-1].append(s)
            width = max(width, n)
        else:
            runs.append([s])
            width = n
    return runs



def micro_batches(samples: list[Sample], rng: random.Random, groups: int, max_tokens: int) -> list[list[Sample]]:
    """The samples of one optimizer step, shuffled, in ``groups`` (``gradient_accumulation_steps``)
    groups of ceil(N / groups) samples, each group sorted longest first (:func:`by_length`, ties in
    the shuffled order) and cut by :func:`split_by_tokens` under ``max_tokens``
    (``max_tokens_per_micro_batch``); a group without samples is one empty micro-batch. A pass's
    loss is a token sum over the whole batch divided by its token count, with one optimizer step
    per pass, so the sorting does not change the gradient (only the order its float terms are
    summed in). The shuffle still decides the groups and the order of equal lengths; the logged
    ``loss``, ``kl``, ``entropy``, ``clip_frac``, ``ratio`` and ``logprob_diff`` are means of the
    micro-batches' means, so their values move with the cut."""
    order = list(samples)
    rng.shuffle(order)
    size = math.ceil(len(order) / groups) if order else 0
    cut = [by_length(order[i * size : (i + 1) * size]) for i in range(groups)]
    return [mb for g in cut for mb in (split_by_tokens(g, max_tokens) or [[]])]
