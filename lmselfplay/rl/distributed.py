"""What the trainer does for its ranks: DeepSpeed's "auto" fields, counts agreed across ranks,
and parameters read, written or swapped whole under ZeRO-3 (gathered one tensor at a time)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def is_partitioned(model: Any) -> bool:
    """True when the weights were sharded at load time (DeepSpeed ZeRO-3 init)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def fill_deepspeed_config(accelerator: Any, max_grad_norm: float) -> None:
    """DeepSpeed wants a micro-batch size (no dataloader is prepared here: our
    micro-batches vary, the value only feeds its throughput logging) and does the
    clipping itself; fill those "auto" fields from the trainer config."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        return
    ds = plugin.deepspeed_config
    if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds["train_micro_batch_size_per_gpu"] = 1
    if ds.get("gradient_clipping", "auto") == "auto":
        ds["gradient_clipping"] = float(max_grad_norm)


def most_across_ranks(accelerator: Any, n: int) -> int:
    """The largest ``n`` of any rank (every rank must call it: a collective when there are several)."""
    if accelerator.num_processes == 1:
        return n
    return int(accelerator.gather(torch.tensor([n], device=accelerator.device)).max())


@contextmanager
def gathered(params: list[torch.Tensor], zero3: bool, modify: bool = False) -> Iterator[None]:
    """Inside: ``params`` hold their full values on every rank. Under ZeRO-3 they are
    gathered; with ``modify`` rank 0's values are re-partitioned on exit (every rank
    writes the same values, so whichever rank DeepSpeed keeps is right)."""
    if not zero3:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=0 if modify else None):
        yield


@torch.no_grad()
def read_full(params: list[torch.Tensor], zero3: bool) -> list[torch.Tensor]:
    """Copies of ``params``' full values."""
    out = []
    for p in params:  # one at a time: a ZeRO-3 gather never holds more than one tensor
        with gathered([p], zero3):
            out.append(p.data.detach().clone())
    return out


@torch.no_grad()
def write_full(params: list[torch.Tensor], values: list[torch.Tensor], zero3: bool) -> None:
    """``params`` set to ``values`` (full tensors), each in its own device and dtype."""
    for p, v in zip(params, values, strict=True):
        with gathered([p], zero3, modify=True):
            p.data.copy_(v.to(p.data.device, p.data.dtype))


@contextmanager
def swapped_weights(params: list[torch.Tensor], values: list[torch.Tensor], zero3: bool) -> Iterator[None]:
    """Inside: ``params`` hold ``values``; on exit their own weights are back, bit for
    bit (no optimizer step happens inside, so nothing else sees the swap)."""
    own = read_full(params, zero3)
    write_full(params, values, zero3)
    try:
        yield
    finally:
        write_full(params, own, zero3)
