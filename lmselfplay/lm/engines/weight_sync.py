"""Which tensors an engine receives after a trainer step, under which names, in what buckets.

Engine-independent (no vLLM import), so it is tested on CPU. The rules:

* **Names**: an engine loads Hugging Face checkpoint names (``model.layers.0.mlp.up_proj.weight``;
  vLLM's ``load_weights`` stacks q/k/v and gate/up itself). :func:`vllm_name` strips what
  training wrappers add: ``module.`` (DDP / DeepSpeed engine), ``_orig_mod.`` (torch.compile),
  ``_checkpoint_wrapped_module.`` / ``_fsdp_wrapped_module.``, PEFT's ``base_model.model.``,
  ``.base_layer`` and ``modules_to_save.default.``; a ZeRO-3 parameter keeps its plain name.
  Adapter tensors (``lora_A`` / ``lora_B`` / ...) and PEFT's ``original_module`` copies have no
  engine name (``None``): the engine serves merged weights.
* **LoRA**: the weight of a LoRA layer is pushed merged, ``W + sum_a delta_a`` over the
  active adapters (PEFT's own ``get_delta_weight``: scaling and fan_in_fan_out included),
  computed out of place — merge -> push -> unmerge without writing into the trainer's
  weights, so no unmerge round-off accumulates over steps. A layer already merged
  (``merged=True``) is pushed as is. DoRA is refused (its merge is not a plain delta).
* **Buckets**: parameters are grouped in model order into buckets of at most ``max_bytes``
  (full, unsharded size; a single tensor over the budget travels alone). Under DeepSpeed
  ZeRO-3 each bucket is gathered with ``deepspeed.zero.GatheredParameters`` and released
  before the next one, so at most one bucket is ever materialized — never the whole model.
  Gathering is a collective: every rank must run the iterator to the end. The tensors of a
  bucket are valid only until the next bucket is requested.
* **Streams** (CUDA only): a bucket is yielded only once every kernel that wrote its tensors has
  finished (:func:`settle`). vLLM's consumers read it on side streams — the packed NCCL producer
  packs each buffer under ``torch.cuda.stream(side)`` (vllm/distributed/weight_transfer/packed_tensor.py,
  ``packed_broadcast_producer``) — which do not wait for the ZeRO-3 gather, the LoRA merge or the
  optimizer step queued on other streams (huggingface/trl#6798 fixed the same ordering for FSDP2).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")
ADAPTER_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector",
                 "original_module")


def vllm_name(name: str) -> str | None:
    """The checkpoint name an engine loads for a trainer parameter name; None for adapter-only
    tensors (merged into their base weight instead)."""
    parts = name.split(".")
    if any(p in ADAPTER_PARTS for p in parts):
        return None
    while True:
        stripped = next((name[len(p):] for p in WRAPPER_PREFIXES if name.startswith(p)), None)
        if stripped is None:
            break
        name = stripped
    for inner in WRAPPER_PREFIXES[1:]:  # wrappers may also sit inside the tree
        name = name.replace("." + inner, ".")
    name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")


@dataclass
class Unit:
    """One engine tensor: its name, the trainer parameters to gather, how to build it."""
    name: str
    params: list[torch.nn.Parameter]
    build: Callable[[], torch.Tensor]
    nbytes: int = 0
    shape: tuple[int, ...] = ()  # full (unsharded) shape, known without gathering
    dtype: torch.dtype = torch.float32


def full_shape(p: torch.Tensor) -> tuple[int, ...]:
    """Shape of the full tensor (a ZeRO-3 shard keeps it in ``ds_shape``)."""
    return tuple(getattr(p, "ds_shape", p.shape))


def full_nbytes(p: torch.Tensor) -> int:
    """Bytes of the full tensor (a ZeRO-3 shard reports its full size in ``ds_numel``)."""
    return int(getattr(p, "ds_numel", p.numel())) * p.element_size()


def _is_lora_layer(module: Any) -> bool:
    return hasattr(module, "base_layer") and hasattr(module, "get_delta_weight") and hasattr(module, "lora_A")


def _merged_weight(layer: Any) -> torch.Tensor:
    """``W + sum_a delta_a`` for a PEFT LoRA layer, out of place."""
    w = layer.base_layer.weight
    if getattr(layer, "merged", False):
        return w.data
    if any(getattr(layer, "use_dora", {}).get(a, False) for a in layer.active_adapters):
        raise NotImplementedError("weight sync of DoRA adapters is not supported: use plain LoRA (use_dora=False)")
    out = w.data
    for a in layer.active_adapters:
        if a in layer.lora_A or a in getattr(layer, "lora_embedding_A", {}):
            out = out + layer.get_delta_weight(a).to(out.dtype)
    return out


def weight_units(model: Any) -> list[Unit]:
    """Every engine tensor of ``model`` in model order, each parameter in exactly one unit
    (LoRA layers: the base weight with its adapters; tied weights once)."""
    units: list[Unit] = []
    taken: set[int] = set()
    lora_layers = {name: m for name, m in model.named_modules() if _is_lora_layer(m)}
    for mod_name, layer in lora_layers.items():  # claim adapter params before the plain walk
        base_w = layer.base_layer.weight
        params = [base_w] + [p for n, p in layer.named_parameters() if vllm_name(n) is None]
        taken.update(id(p) for p in params)
        units.append(Unit(vllm_name(f"{mod_name}.base_layer.weight"), params,
                          lambda layer=layer: _merged_weight(layer), sum(full_nbytes(p) for p in params),
                          full_shape(base_w), base_w.dtype))
    lora_weight_ids = {id(m.base_layer.weight): i for i, m in enumerate(lora_layers.values())}
    ordered: list[Unit] = []
    for name, p in model.named_parameters():
        if id(p) in lora_weight_ids:
            ordered.append(units[lora_weight_ids[id(p)]])
            continue
        if id(p) in taken:
            continue
        target = vllm_name(name)
        taken.add(id(p))
        if target is None:  # e.g. PEFT's original_module: superseded by modules_to_save
            continue
        ordered.append(Unit(target, [p], lambda p=p: p.data, full_nbytes(p), full_shape(p), p.dtype))
    return ordered


def bucket_units(units: list[Unit], max_bytes: int) -> list[list[Unit]]:
    """Consecutive units grouped so that each bucket's bytes <= max_bytes (a unit larger
    than the budget forms a bucket of its own). Order is kept."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
    buckets: list[list[Unit]] = []
    size = 0
    for u in units:
        if buckets and size + u.nbytes <= max_bytes:
            buckets[-1].append(u)
            size += u.nbytes
        else:
            buckets.append([u])
            size = u.nbytes
    return buckets


def zero3_gather(params: list[torch.nn.Parameter]):
    """DeepSpeed's gather of full parameters on every rank (read-only, freed on exit)."""
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def weight_metadata(model: Any) -> list[tuple[str, str, list[int]]]:
    """``(engine_name, dtype, full_shape)`` of every engine tensor, in push order, without
    gathering anything (a server must know what it will receive before the first byte)."""
    from lmselfplay.lm.engines.hf import unwrap

    return [(u.name, str(u.dtype).removeprefix("torch."), list(u.shape)) for u in weight_units(unwrap(model))]


def iter_weight_buckets(model: Any, max_bytes: int = 256 << 20,
                        gather: Callable[[list[torch.nn.Parameter]], Any] | None = None
                        ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Yield ``[(engine_name, full_tensor), ...]`` bucket by bucket. ``gather`` defaults to
    DeepSpeed's when ``model`` is ZeRO-3 partitioned, else nothing to gather."""
    from lmselfplay.lm.engines.hf import unwrap

    model = unwrap(model)
    if gather is None:
        partitioned = any(hasattr(p, "ds_id") for p in model.parameters())
        gather = zero3_gather if partitioned else (lambda params: contextlib.nullcontext())
    for bucket in bucket_units(weight_units(model), max_bytes):
        params = [p for u in bucket for p in u.params]
        with gather(params), torch.no_grad():
            built = [(u.name, u.build()) for u in bucket]
            settle()
            yield built


def settle() -> None:
    """Wait for every queued kernel of the device (all streams: the gather's, the merge's, the
    optimizer's) before a bucket leaves: its reader may run on another stream. A no-op without CUDA."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def iter_state_buckets(state: dict[str, torch.Tensor], max_bytes: int = 256 << 20
                       ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The same buckets for a plain state dict (a league snapshot: full CPU tensors)."""
    units = [Unit(vllm_name(k), [], lambda v=v: v, v.numel() * v.element_size(), tuple(v.shape), v.dtype)
             for k, v in state.items() if vllm_name(k) is not None]
    for bucket in bucket_units(units, max_bytes):
        yield [(u.name, u.build()) for u in bucket]


@dataclass
class SyncStats:
    """What one push moved (for logging)."""
    tensors: int = 0
    bytes: int = 0
    buckets: int = 0
    seconds: float = 0.0
    peak_bucket_bytes: int = 0
    names: list[str] = field(default_factory=list)

    def add(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        n = sum(t.numel() * t.element_size() for _, t in bucket)
        self.tensors += len(bucket)
        self.bytes += n
        self.buckets += 1
        self.peak_bucket_bytes = max(self.peak_bucket_bytes, n)
        self.names += [k for k, _ in bucket]
