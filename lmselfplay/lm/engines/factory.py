"""Pick the rollout engine by config: ``engine: hf | vllm | vllm-server``.

* ``hf``: :class:`~lmselfplay.lm.engines.hf.HFEngine` sharing the trainer's module (default;
  CPU or GPU, nothing to install).
* ``vllm``: :class:`~lmselfplay.lm.engines.vllm.VLLMEngine` colocated in the training process
  (``pip install lmselfplay[vllm]``, CUDA).
* ``vllm-server``: :class:`~lmselfplay.lm.engines.vllm_server.VLLMServerEngine` talking to
  one or more ``vllm serve`` at ``vllm_server_urls`` (weights over NCCL, pushed to each).

Recipes call :func:`make_engine` for the learner and hand it the learner's weights with
``PolicyTrainer.serving(engine)``. League snapshots are served by frozen HF engines whatever
the learner's engine (:func:`lmselfplay.models.policy.frozen_policy`): every colocated vLLM
instance reserves its own slice of GPU memory for weights and KV cache, and a server holds
one set of weights (the learner's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lmselfplay.lm.engines.base import Engine, SamplingParams
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.engines.staleness import StalenessConfig, StalenessDetector
from lmselfplay.utils.config import ConfigError

ENGINES = ("hf", "vllm", "vllm-server")


@dataclass
class EngineConfig(StalenessConfig):
    engine: str = field(default="hf", metadata={"help": "rollout engine: hf | vllm | vllm-server"})
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata={
        "help": "engine=vllm: share of GPU memory vLLM reserves (weights + KV cache); the trainer keeps the rest"})
    vllm_max_model_len: int = field(default=0, metadata={
        "help": "engine=vllm: longest prompt + answer vLLM sizes its KV cache for; 0: vllm_max_prompt_tokens + the "
                "run's largest *max_new_tokens (a 40k-128k default context does not fit a colocated share). "
                "engine=vllm-server: a cap on the servers' max_model_len (read from GET /v1/models); 0: theirs"})
    vllm_max_prompt_tokens: int = field(default=2048, metadata={
        "help": "engine=vllm: the prompt budget vllm_max_model_len is derived from"})
    vllm_max_num_batched_tokens: int = field(default=0, metadata={
        "help": "engine=vllm: tokens per scheduler step (0: vLLM's default); lower it on a small GPU"})
    vllm_dtype: str = field(default="auto", metadata={
        "help": "engine=vllm: auto | bfloat16 | float16 | float32, the dtype vLLM runs in (the push casts the "
                "trainer's float32 master weights to it); auto: the model's declared dtype, bfloat16 on CUDA when "
                "that is float32 or absent (logged every step as engine/dtype)"})
    vllm_enable_sleep_mode: bool = field(default=False, metadata={
        "help": "engine=vllm: free vLLM's GPU memory while the trainer steps (once per step; for tight memory)"})
    vllm_server_urls: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8000"], metadata={
        "help": "engine=vllm-server: base URLs of the `vllm serve` processes (requests spread over them, weights "
                "pushed to each)"})
    vllm_server_timeout: float = field(default=300.0, metadata={"help": "engine=vllm-server: seconds per request"})
    vllm_server_wait: float = field(default=0.0, metadata={
        "help": "engine=vllm-server: seconds to wait for the servers' /health at start"})
    vllm_push_timeout: float = field(default=300.0, metadata={
        "help": "engine=vllm-server: deadline in seconds of each step of a weight push (pause, rendezvous, a bucket, "
                "cache reset); a server past it leaves the rotation until a later push succeeds"})
    max_staleness: int = field(default=0, metadata={
        "help": "0: generate each step's rollouts with the weights being trained (on-policy); k >= 1: the next step's "
                "rollouts are generated while this step trains (engine vllm-server or vllm), and a rollout sampled "
                "more than k weight versions ago is dropped (staleness/dropped); correct the rest with tis_cap (without it k = 1 learned worse in docs/scale.md's measurement)"})
    weight_sync_bucket_mb: int = field(default=256, metadata={
        "help": "weights pushed to vLLM in buckets of at most this many MB (ZeRO-3 gathers one bucket at a time)"})

    def validate(self) -> None:
        """Overlap settings that cannot work, refused before any folder, model or engine is
        touched: the hf engine serves the trainer's own module (the optimizer would write the
        weights it samples from), and sleep mode frees the engine while the trainer steps — the
        time overlap generates in."""
        check_staleness(self.max_staleness, shares_module=self.engine == "hf")
        from lmselfplay.lm.engines.vllm import ENGINE_DTYPES  # no vLLM import: the rule only

        if self.vllm_dtype not in ENGINE_DTYPES:
            raise ConfigError(f"vllm_dtype must be one of {', '.join(ENGINE_DTYPES)}, got {self.vllm_dtype!r}")
        if self.max_staleness > 0 and self.vllm_enable_sleep_mode:
            raise ConfigError(f"max_staleness {self.max_staleness} generates while the trainer steps, when "
                              "vllm_enable_sleep_mode puts the engine to sleep: use one or the other")


def check_staleness(max_staleness: int, shares_module: bool) -> None:
    """``max_staleness`` is >= 0, and > 0 only with an engine holding its own copy of the weights:
    one sharing the trainer's module would sample from weights the optimizer is writing."""
    if max_staleness < 0:
        raise ConfigError(f"max_staleness must be >= 0, got {max_staleness}")
    if max_staleness > 0 and shares_module:
        raise ConfigError(f"max_staleness {max_staleness} overlaps generation with training, which needs an engine "
                          "with its own weights (engine: vllm-server or vllm); the hf engine shares the trainer's")


def check_sleep_mode_engines(cfg: Any, engines: int) -> None:
    """At most one colocated vLLM engine with sleep mode per process: vLLM's sleep mode puts the
    weights in its process-wide CuMem allocator, and a second instance's load asserts that the
    allocator is empty ("CuMem allocator can only be used for one instance per process",
    ``_maybe_get_memory_pool_context`` in vllm/v1/worker/gpu_worker.py). ConfigError otherwise."""
    if engines > 1 and getattr(cfg, "engine", "hf") == "vllm" and getattr(cfg, "vllm_enable_sleep_mode", False):
        raise ConfigError(f"{engines} colocated vLLM engines with vllm_enable_sleep_mode: vLLM allows one sleep-mode "
                          "engine per process (its CuMem allocator); turn sleep mode off or use engine vllm-server")


def _check_kind(kind: str) -> None:
    if kind not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {kind!r}")


def answer_budget(cfg: Any) -> int:
    """The largest answer budget of the run: every config field named ``*max_new_tokens``."""
    names = [f.name for f in dataclasses.fields(cfg)] if dataclasses.is_dataclass(cfg) else list(vars(cfg))
    budgets = [int(getattr(cfg, n)) for n in names if n.endswith("max_new_tokens")
               and isinstance(getattr(cfg, n), int) and not isinstance(getattr(cfg, n), bool)]
    return max(budgets, default=256)


def configured_max_model_len(cfg: Any) -> int | None:
    """``vllm_max_model_len`` when set, None for 0 (the engine's own); ConfigError when negative."""
    explicit = int(getattr(cfg, "vllm_max_model_len", 0) or 0)
    if explicit < 0:
        raise ConfigError(f"vllm_max_model_len must be >= 0, got {explicit}")
    return explicit or None


def colocated_max_model_len(cfg: Any, model: Any) -> int:
    """``vllm_max_model_len``, or the run's prompt + answer budget, at most the model's context."""
    length = configured_max_model_len(cfg) or int(getattr(cfg, "vllm_max_prompt_tokens", 2048)) + answer_budget(cfg)
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return min(length, int(context)) if isinstance(context, int) and context > 0 else length


def make_engine(cfg: Any, model: Any, tokenizer: Any) -> Engine:
    """The learner's engine for ``cfg.engine``, serving ``model``'s current weights, with the
    run's staleness detector as ``engine.detector`` (``staleness_threshold`` / ``strict_sync``):
    :meth:`~lmselfplay.rl.trainer.PolicyTrainer.step` checks it every step against the engine the
    trainer served, so every recipe that builds its engine here is checked.

    Fails early (before any rollout) when vLLM is missing or cannot return the protocol's
    log-probs for the configured temperature / top_p."""
    engine = build_engine(cfg, model, tokenizer)
    engine.detector = StalenessDetector.from_config(cfg)
    return engine


def build_engine(cfg: Any, model: Any, tokenizer: Any) -> Engine:
    """The engine of :func:`make_engine`, without its detector."""
    kind = getattr(cfg, "engine", "hf")
    _check_kind(kind)
    if kind == "hf":
        return HFEngine(model, tokenizer)
    from lmselfplay.lm.engines.vllm import check_logprobs_mode, logprobs_mode_for

    temperature, top_p = float(getattr(cfg, "temperature", 1.0)), float(getattr(cfg, "top_p", 1.0))
    bucket = int(getattr(cfg, "weight_sync_bucket_mb", 256)) << 20
    if kind == "vllm":
        from lmselfplay.lm.engines.hf import unwrap
        from lmselfplay.lm.engines.vllm import VLLMEngine

        mode = logprobs_mode_for(temperature)
        check_logprobs_mode(mode, SamplingParams(temperature=temperature, top_p=top_p))
        extra = {}
        if int(getattr(cfg, "vllm_max_num_batched_tokens", 0) or 0) > 0:
            extra["max_num_batched_tokens"] = int(cfg.vllm_max_num_batched_tokens)
        return VLLMEngine(model, tokenizer, gpu_memory_utilization=float(cfg.vllm_gpu_memory_utilization),
                          enable_sleep_mode=bool(cfg.vllm_enable_sleep_mode), logprobs_mode=mode,
                          bucket_bytes=bucket, seed=int(getattr(cfg, "seed", 0)),
                          dtype=str(getattr(cfg, "vllm_dtype", "auto")),
                          max_model_len=colocated_max_model_len(cfg, unwrap(model)), **extra)
    from lmselfplay.lm.engines.vllm_server import VLLMServerEngine

    urls = getattr(cfg, "vllm_server_urls", None)
    engine = VLLMServerEngine(tokenizer, base_urls=list(urls) if urls else [], timeout=float(cfg.vllm_server_timeout),
                              wait_for_server=float(cfg.vllm_server_wait), bucket_bytes=bucket,
                              push_timeout=float(getattr(cfg, "vllm_push_timeout", 300.0)),
                              max_model_len=configured_max_model_len(cfg))
    check_logprobs_mode(engine.logprobs_mode, SamplingParams(temperature=temperature, top_p=top_p))
    engine.update_weights(model, version=0)  # the servers start from whatever they loaded: serve ours
    return engine
