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

The engine reads its own :class:`EngineConfig` and nothing else; what it needs from the rest of
the run is passed by the recipe: the sampling's ``temperature`` / ``top_p`` (vLLM's log-prob
mode), the run's ``seed``, and the run's ``answer_budget`` — the largest number of new tokens
any of its generations asks for, which the recipe states by naming its budget fields
(``answer_budget()`` on its config): a colocated vLLM sizes its KV cache for
``vllm_max_prompt_tokens + answer_budget``, so no field joins the budget by its name alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmselfplay.lm.engines.base import Engine, SamplingParams
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.engines.staleness import StalenessConfig, StalenessDetector
from lmselfplay.utils.config import ConfigError, non_negative, positive

ENGINES = ("hf", "vllm", "vllm-server")


@dataclass
class EngineConfig(StalenessConfig):
    _argument_group_name = "engine (lmselfplay.lm.engines.EngineConfig)"
    engine: str = field(default="hf", metadata={"help": "rollout engine: hf | vllm | vllm-server"})
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata={
        "help": "engine=vllm: share of GPU memory vLLM reserves (weights + KV cache); the trainer keeps the rest"})
    vllm_max_model_len: int = field(default=0, metadata={
        "help": "engine=vllm: longest prompt + answer vLLM sizes its KV cache for; 0: vllm_max_prompt_tokens + the "
                "recipe's answer budget (the largest of its answer budgets; a 40k-128k default context does not fit "
                "a colocated share). "
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
        """Each field in its range, and the overlap settings that cannot work, refused before any
        folder, model or engine is touched: the hf engine serves the trainer's own module (the
        optimizer would write the weights it samples from), and sleep mode frees the engine while
        the trainer steps — the time overlap generates in."""
        _check_kind(self.engine)
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ConfigError(f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization!r}")
        positive(self, "vllm_max_prompt_tokens", "vllm_server_timeout", "vllm_push_timeout", "weight_sync_bucket_mb")
        non_negative(self, "vllm_max_model_len", "vllm_max_num_batched_tokens", "vllm_server_wait")
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


def check_sleep_mode_engines(cfg: EngineConfig, engines: int) -> None:
    """At most one colocated vLLM engine with sleep mode per process: vLLM's sleep mode puts the
    weights in its process-wide CuMem allocator, and a second instance's load asserts that the
    allocator is empty ("CuMem allocator can only be used for one instance per process",
    ``_maybe_get_memory_pool_context`` in vllm/v1/worker/gpu_worker.py). ConfigError otherwise."""
    if engines > 1 and cfg.engine == "vllm" and cfg.vllm_enable_sleep_mode:
        raise ConfigError(f"{engines} colocated vLLM engines with vllm_enable_sleep_mode: vLLM allows one sleep-mode "
                          "engine per process (its CuMem allocator); turn sleep mode off or use engine vllm-server")


def _check_kind(kind: str) -> None:
    if kind not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {kind!r}")


def configured_max_model_len(cfg: EngineConfig) -> int | None:
    """``vllm_max_model_len`` when set, None for 0 (the engine's own); ConfigError when negative."""
    explicit = int(cfg.vllm_max_model_len)
    if explicit < 0:
        raise ConfigError(f"vllm_max_model_len must be >= 0, got {explicit}")
    return explicit or None


def colocated_max_model_len(cfg: EngineConfig, model: Any, answer_budget: int) -> int:
    """``vllm_max_model_len``, or ``vllm_max_prompt_tokens`` + the recipe's ``answer_budget``, at
    most the model's context."""
    length = configured_max_model_len(cfg) or int(cfg.vllm_max_prompt_tokens) + int(answer_budget)
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return min(length, int(context)) if isinstance(context, int) and context > 0 else length


def make_engine(cfg: EngineConfig, model: Any, tokenizer: Any, *, answer_budget: int, temperature: float,
                top_p: float, seed: int) -> Engine:
    """The learner's engine for ``cfg.engine``, serving ``model``'s current weights, with the
    run's staleness detector as ``engine.detector`` (``staleness_threshold`` / ``strict_sync``):
    :meth:`~lmselfplay.rl.trainer.PolicyTrainer.step` checks it every step against the engine the
    trainer served, so every recipe that builds its engine here is checked.

    Fails early (before any rollout) when vLLM is missing or cannot return the protocol's
    log-probs for the configured temperature / top_p. ``answer_budget``, ``temperature``,
    ``top_p`` and ``seed`` come from the recipe (see the module doc)."""
    engine = build_engine(cfg, model, tokenizer, answer_budget=answer_budget, temperature=temperature,
                          top_p=top_p, seed=seed)
    engine.detector = StalenessDetector.from_config(cfg)
    return engine


def build_engine(cfg: EngineConfig, model: Any, tokenizer: Any, *, answer_budget: int, temperature: float,
                 top_p: float, seed: int) -> Engine:
    """The engine of :func:`make_engine`, without its detector."""
    kind = cfg.engine
    _check_kind(kind)
    if kind == "hf":
        return HFEngine(model, tokenizer)
    from lmselfplay.lm.engines.vllm import check_logprobs_mode, logprobs_mode_for

    temperature, top_p = float(temperature), float(top_p)
    bucket = int(cfg.weight_sync_bucket_mb) << 20
    if kind == "vllm":
        from lmselfplay.lm.engines.hf import unwrap
        from lmselfplay.lm.engines.vllm import VLLMEngine

        mode = logprobs_mode_for(temperature)
        check_logprobs_mode(mode, SamplingParams(temperature=temperature, top_p=top_p))
        extra = {}
        if int(cfg.vllm_max_num_batched_tokens) > 0:
            extra["max_num_batched_tokens"] = int(cfg.vllm_max_num_batched_tokens)
        return VLLMEngine(model, tokenizer, gpu_memory_utilization=float(cfg.vllm_gpu_memory_utilization),
                          enable_sleep_mode=bool(cfg.vllm_enable_sleep_mode), logprobs_mode=mode,
                          bucket_bytes=bucket, seed=int(seed), dtype=str(cfg.vllm_dtype),
                          max_model_len=colocated_max_model_len(cfg, unwrap(model), answer_budget), **extra)
    from lmselfplay.lm.engines.vllm_server import VLLMServerEngine

    urls = cfg.vllm_server_urls
    engine = VLLMServerEngine(tokenizer, base_urls=list(urls) if urls else [], timeout=float(cfg.vllm_server_timeout),
                              wait_for_server=float(cfg.vllm_server_wait), bucket_bytes=bucket,
                              push_timeout=float(cfg.vllm_push_timeout),
                              max_model_len=configured_max_model_len(cfg))
    check_logprobs_mode(engine.logprobs_mode, SamplingParams(temperature=temperature, top_p=top_p))
    engine.update_weights(model, version=0)  # the servers start from whatever they loaded: serve ours
    return engine
