"""The trainer's precision: float32 master weights (:func:`master_weights`) and a forward under
autocast in the weights' old dtype (:func:`autocast_forward`)."""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch

from lmselfplay.utils.config import ConfigError


def master_weights(model: Any, accelerator: Any) -> torch.dtype | None:
    """Hold the trained parameters in float32 and return the dtype the forward should compute in
    (``None``: as the weights are).

    AdamW on bfloat16 weights loses every update smaller than half a weight's last bit: at lr
    1e-6 only ~2% of the weights move at all. So trainable bfloat16 / float16 parameters are
    upcast here, before the optimizer sees them; on a GPU the forward then runs in their old dtype
    under autocast (what accelerate's ``mixed_precision`` does: it is used instead when set), on a
    CPU in float32 (a CPU run never computes in bfloat16). LoRA adapters are float32 already (PEFT).
    Under DeepSpeed its bf16 / fp16 mode keeps float32 master weights itself. ConfigError for mixed
    precision on a CPU run, and for low-precision weights under DeepSpeed without mixed precision."""
    low = {p.dtype for p in model.parameters() if p.requires_grad} & {torch.bfloat16, torch.float16}
    mp = str(accelerator.mixed_precision)
    on_cpu = accelerator.device.type == "cpu"
    if on_cpu and mp not in ("no", "None"):
        raise ConfigError(f"mixed_precision {mp} on a CPU run: CPU training computes in float32; "
                          f"set mixed_precision 'no' in the accelerate config")
    if not low:
        return None
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        if mp not in ("bf16", "fp16"):
            raise ConfigError(f"{low.pop()} weights under DeepSpeed without mixed precision would be updated in "
                              f"place; set mixed_precision bf16 in the accelerate config or dtype float32")
        return None
    if on_cpu:
        model.float()
        return None
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    return None if mp != "no" else low.pop()


def autocast_forward(model: Any, dtype: torch.dtype | None) -> None:
    """Run ``model``'s forward (and so ``generate``'s) under CUDA autocast in ``dtype``, as
    accelerate's mixed precision does; bound as a method so a deep copy autocasts its own forward."""
    if dtype is None:
        return
    forward = torch.autocast(device_type="cuda", dtype=dtype)(model.forward.__func__)
    model.forward = MethodType(forward, model)

