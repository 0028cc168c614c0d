"""Load the policy: a causal LM + its tokenizer, with optional LoRA adapters (PEFT).

The default model is the embedded tiny model (:mod:`lmselfplay.models.tiny`); real models
are named with ``model_name_or_path``. Loading lives here, above the lm layer, because the
embedded model is itself built with the lm layer's formatter (see docs/contributing.md). Prompts are formatted by :mod:`lmselfplay.lm.prompt`,
in the style the config's ``prompt_format`` / ``system_prompt`` / ``enable_thinking`` set; the
tokenizer returned carries that style.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lmselfplay.lm.engines import weight_sync
from lmselfplay.lm.engines.base import declared_eos_ids
from lmselfplay.lm.engines.hf import unwrap
from lmselfplay.lm.prompt import PromptStyle, resolve_prompt_format, set_prompt_style
from lmselfplay.models.cache import ensure_tiny_model
from lmselfplay.models.model_folder import check_model_folder
from lmselfplay.models.tiny import BUILDS, build_config
from lmselfplay.utils.config import Config, ConfigError, positive
from lmselfplay.utils.errors import UserError

DTYPES = ("auto", "float32", "bfloat16", "float16")
PROMPT_FORMATS = ("auto", "chat", "plain")


@dataclass
class PolicyConfig(Config):
    _argument_group_name = "policy (lmselfplay.models.policy.PolicyConfig)"
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "HF hub name or local path; default: the embedded tiny model"})
    dtype: str = field(default="auto", metadata={
        "help": "auto | float32 | bfloat16 | float16: the weights' dtype as loaded (auto: bfloat16 on a GPU that has "
                "it, else float32); the trainer keeps what it trains in float32 and computes in this dtype; "
                "bfloat16 / float16 on a CPU run is an error"})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "recompute each layer's activations in the backward instead of keeping them (less memory, ~30%% "
                "more compute), in every recipe's training"})
    use_lora: bool = field(default=False, metadata={"help": "train LoRA adapters (PEFT) instead of all weights"})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling alpha"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout"})
    lora_target_modules: str = field(default="all-linear", metadata={"help": "modules that get adapters (PEFT's names; all-linear = every linear layer)"})
    prompt_format: str = field(default="auto", metadata={
        "help": "auto | chat | plain: chat = the tokenizer's chat template, plain = a continuation prompt "
                "(base models); auto = chat iff the model declares the template's end of turn as an eos"})
    system_prompt: str | None = field(default=None, metadata={
        "help": "system message of chat prompts (default: the template's own, e.g. Qwen2.5's); "
                "plain prompts start with it"})
    enable_thinking: bool | None = field(default=None, metadata={
        "help": "passed to the chat template (Qwen3); default: the template's default. "
                "Answers are read after </think> either way"})

    def validate(self) -> None:
        """The choices, the LoRA sizes and a local model folder's files
        (:func:`~lmselfplay.models.model_folder.check_model_folder`: before anything loads or is
        written); the dtype's fit to the device is checked when the model loads
        (:func:`resolve_dtype`), once the device is known."""
        check_dtype(self.dtype, "dtype")
        check_local_model(self.model_name_or_path)
        if self.prompt_format not in PROMPT_FORMATS:
            raise ConfigError(f"prompt_format must be one of {', '.join(PROMPT_FORMATS)}, got {self.prompt_format!r}")
        positive(self, "lora_r", "lora_alpha")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora_dropout must be in [0, 1), got {self.lora_dropout!r}")


def check_dtype(dtype: str, name: str) -> None:
    """ConfigError naming the field ``name`` when ``dtype`` is not one of :data:`DTYPES`."""
    if dtype not in DTYPES:
        raise ConfigError(f"{name} must be one of {', '.join(DTYPES)}, got {dtype!r}")


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device, name: str = "dtype") -> torch.dtype:
    """The torch dtype of ``dtype`` on ``device``. A CPU run never uses bfloat16 / float16 (slow,
    and AdamW updates below their resolution are lost): "auto" is float32 there, and asking for
    a half dtype on the CPU is a ConfigError. Errors name the field ``name`` the dtype came from
    (``dtype``, a judge's ``judge_dtype``)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    try:
        out = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ConfigError(f"unknown {name} {dtype!r}: use auto, float32, bfloat16 or float16") from None
    if device.type == "cpu" and out != torch.float32:
        raise ConfigError(f"{name} {dtype} on a CPU run: the CPU computes in float32 (use {name} float32 or auto)")
    return out


def check_local_model(model_name_or_path: str | None, field: str = "model_name_or_path") -> None:
    """A UserError naming the file when ``model_name_or_path`` is an existing local path that
    is not a loadable model folder (:func:`check_model_folder`); nothing for the embedded
    model or a hub name."""
    if model_name_or_path not in (None, "", "tiny", "embedded") and not str(model_name_or_path).startswith("embedded:") \
            and Path(str(model_name_or_path)).expanduser().exists():
        check_model_folder(model_name_or_path, field)


def resolve_model_path(model_name_or_path: str | None) -> str:
    """``None`` -> the embedded tiny model (built offline on first use); ``embedded:<build>`` -> that
    named build (installed from the package or built on first use); an existing local folder (its
    files checked: :func:`check_local_model`); or a hub name (``org/name``). Something that can only
    be a local path but does not exist is a :class:`UserError` that says so (not a hub error about
    repo ids)."""
    if model_name_or_path in (None, "", "tiny", "embedded"):
        return str(ensure_tiny_model())
    name = str(model_name_or_path)
    if name.startswith("embedded:"):  # a named build of the embedded model (models/tiny.py BUILDS)
        build = name.partition(":")[2]
        if build not in BUILDS:
            raise UserError(f"model_name_or_path {name!r}: no embedded build {build!r} (known: {', '.join(BUILDS)})")
        return str(ensure_tiny_model(cfg=build_config(build)))
    if Path(name).expanduser().exists():
        check_local_model(name)
        return str(Path(name).expanduser())
    if name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1 or name.endswith("/"):
        raise UserError(f"model_name_or_path {name!r}: no such local folder (give a model folder "
                        f"saved with save_pretrained, or a hub name like org/name)")
    return name


def prompt_style_of(cfg: PolicyConfig | None) -> PromptStyle:
    if cfg is None:
        return PromptStyle()
    return PromptStyle(cfg.prompt_format, cfg.system_prompt, cfg.enable_thinking)


def load_tokenizer(model_name_or_path: str | None = None, prompt: PromptStyle | None = None) -> Any:
    """The tokenizer (left padding; pad = eos when it has none), carrying the run's prompt
    style with ``auto`` resolved for this model (:mod:`lmselfplay.lm.prompt`)."""
    from transformers import AutoTokenizer

    path = resolve_model_path(model_name_or_path)
    tok = AutoTokenizer.from_pretrained(path)
    # Resolved before pad is set: an eos doubling as pad says nothing about turns.
    style = resolve_prompt_format(tok, prompt or PromptStyle(), declared_eos_ids(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    set_prompt_style(tok, style)
    return tok


def load_policy(cfg: PolicyConfig | None = None, device: str = "auto", dtype_field: str = "dtype",
                **overrides: Any) -> tuple[Any, Any]:
    """(model, tokenizer) on ``device`` (auto | cpu | cuda | cuda:N: the caller's, e.g. its
    process's accelerator device). LoRA adapters are added when ``use_lora`` (PEFT).
    ``dtype_field``: the flag ``cfg.dtype`` came from, named by a dtype error (a judge's
    ``judge_dtype``)."""
    from transformers import AutoModelForCausalLM

    cfg = copy.copy(cfg) if cfg is not None else PolicyConfig()  # overrides never leak into the caller's
    for k, v in overrides.items():
        setattr(cfg, k, v)
    path = resolve_model_path(cfg.model_name_or_path)
    if not Path(path).exists() and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise UserError(f"model_name_or_path {path!r} is not a local folder and HF_HUB_OFFLINE=1")
    where = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(cfg.dtype, where, dtype_field))
    model.to(where)
    if cfg.gradient_checkpointing:  # non-reentrant: also right when the inputs need no grad (LoRA)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if cfg.use_lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM"))
    return model, load_tokenizer(path, prompt_style_of(cfg))


def is_peft_model(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def policy_weights(model: Any, dtype: torch.dtype | None = None, bucket_bytes: int = 256 << 20
                   ) -> dict[str, torch.Tensor]:
    """CPU copies of what makes this policy itself: under LoRA the adapter weights only (a few
    MB: the base weights are frozen and shared; kept as trained), else the full state dict — what a
    league snapshot stores; :func:`frozen_policy` turns it back into a model. The full state's
    floating tensors are stored in ``dtype`` (default :func:`snapshot_dtype`: the model's declared
    dtype, so a bfloat16 model's snapshot is not a float32 copy of its master weights).

    Under DeepSpeed ZeRO-3 every rank must call it (gathering is a collective): the shards are
    gathered ``bucket_bytes`` at a time and copied out, never the whole model at once
    (:func:`~lmselfplay.lm.engines.weight_sync.zero3_gather`)."""
    model = unwrap(model)
    dtype = dtype or snapshot_dtype(model)
    if is_peft_model(model):
        from peft import get_peft_model_state_dict

        return {k: _cpu_copy(v, v.dtype) for k, v in get_peft_model_state_dict(model).items()}  # float32 adapters
    state = model.state_dict(keep_vars=True)
    if not any(hasattr(v, "ds_id") for v in state.values()):
        return {k: _cpu_copy(v, dtype) for k, v in state.items()}
    return _gathered_state(state, dtype, bucket_bytes)


def _gathered_state(state: dict[str, torch.Tensor], dtype: torch.dtype, bucket_bytes: int) -> dict[str, torch.Tensor]:
    """ZeRO-3: a bucket of shards gathered on every rank, copied to the CPU, released; the next one."""
    units = [weight_sync.Unit(k, [v] if hasattr(v, "ds_id") else [], lambda v=v: v, weight_sync.full_nbytes(v))
             for k, v in state.items()]
    out: dict[str, torch.Tensor] = {}
    for bucket in weight_sync.bucket_units(units, bucket_bytes):
        params = list({id(p): p for u in bucket for p in u.params}.values())  # tied weights: once
        with weight_sync.zero3_gather(params) if params else contextlib.nullcontext():
            out.update({u.name: _cpu_copy(u.build(), dtype) for u in bucket})
    return out


def _cpu_copy(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.detach().to("cpu", dtype=dtype if t.is_floating_point() else t.dtype, copy=True)


def snapshot_dtype(model: Any) -> torch.dtype:
    """The dtype a frozen copy of ``model`` needs: the one its config declares (the checkpoint's, or
    the one it was loaded in; the trainer's float32 master weights do not change it), else float32."""
    config = getattr(model.get_base_model() if hasattr(model, "get_base_model") else model, "config", None)
    declared = getattr(config, "dtype", None)
    return declared if isinstance(declared, torch.dtype) else torch.float32


def frozen_policy(template: Any, weights: dict[str, torch.Tensor]) -> Any:
    """A frozen eval-mode model like ``template`` serving ``weights`` (from :func:`policy_weights`)."""
    template = unwrap(template)
    if is_peft_model(template):
        from peft import set_peft_model_state_dict

        # The base weights are frozen under LoRA, so a copy of the learner differs from the
        # snapshot only in its adapter. ZeRO-3 shards would be copied as shards: refuse.
        if any(hasattr(p, "ds_id") for p in template.parameters()):
            raise ValueError("league snapshots with LoRA under DeepSpeed ZeRO-3 are not supported; "
                             "use ZeRO-2 or no LoRA")
        model = copy.deepcopy(template)
        set_peft_model_state_dict(model, weights)
    else:
        model = type(template)(template.config)  # not a deep copy: ZeRO-3 params are shards
        model.load_state_dict(weights)
        floating = {v.dtype for v in weights.values() if v.is_floating_point()}
        if len(floating) == 1:  # served as stored: a bfloat16 snapshot is not widened back to float32
            model.to(floating.pop())
    return model.requires_grad_(False).eval()
