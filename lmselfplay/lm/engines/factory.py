"""Pick the rollout engine by config: ``engine: hf | vllm | vllm-server``.

* ``hf``: :class:`~lmselfplay.lm.engines.hf.HFEngine` sharing the trainer's module (default;
  CPU or GPU, nothing to install).
* ``vllm``: :class:`~lmselfplay.lm.engines.vllm.VLLMEngine` colocated in the training process
  (``pip install lmselfplay[vllm]``, CUDA).
* ``vllm-server``: :class:`~lmselfplay.lm.engines.vllm_server.VLLMServerEngine` talking to
  ``vllm serve`` at ``vllm_server_url`` (weights over NCCL).

Recipes call :func:`make_engine` for the learner and hand it the learner's weights with
``PolicyTrainer.serving(engine)``. League snapshots are served by frozen HF engines whatever
the learner's engine (:func:`lmselfplay.lm.policy.frozen_policy`): every colocated vLLM
instance reserves its own slice of GPU memory for weights and KV cache, and a server holds
one set of weights (the learner's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmselfplay.lm.engines.base import Engine, SamplingParams
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.engines.staleness import StalenessConfig

ENGINES = ("hf", "vllm", "vllm-server")


@dataclass
class EngineConfig(StalenessConfig):
    engine: str = field(default="hf", metadata={"help": "rollout engine: hf | vllm | vllm-server"})
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata={
        "help": "engine=vllm: share of GPU memory vLLM reserves (weights + KV cache); the trainer keeps the rest"})
    vllm_enable_sleep_mode: bool = field(default=False, metadata={
        "help": "engine=vllm: free vLLM's GPU memory between rollouts (slower; for tight memory)"})
    vllm_server_url: str = field(default="http://127.0.0.1:8000", metadata={"help": "engine=vllm-server: base URL"})
    vllm_server_timeout: float = field(default=300.0, metadata={"help": "engine=vllm-server: seconds per request"})
    vllm_server_wait: float = field(default=0.0, metadata={
        "help": "engine=vllm-server: seconds to wait for the server's /health at start"})
    weight_sync_bucket_mb: int = field(default=256, metadata={
        "help": "weights pushed to vLLM in buckets of at most this many MB (ZeRO-3 gathers one bucket at a time)"})


def _check_kind(kind: str) -> None:
    if kind not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {kind!r}")


def make_engine(cfg: Any, model: Any, tokenizer: Any) -> Engine:
    """The learner's engine for ``cfg.engine``, serving ``model``'s current weights.

    Fails early (before any rollout) when vLLM is missing or cannot return the protocol's
    log-probs for the configured temperature / top_p."""
    kind = getattr(cfg, "engine", "hf")
    _check_kind(kind)
    if kind == "hf":
        return HFEngine(model, tokenizer)
    from lmselfplay.lm.engines.vllm import check_logprobs_mode, logprobs_mode_for

    temperature, top_p = float(getattr(cfg, "temperature", 1.0)), float(getattr(cfg, "top_p", 1.0))
    bucket = int(getattr(cfg, "weight_sync_bucket_mb", 256)) << 20
    if kind == "vllm":
        from lmselfplay.lm.engines.vllm import VLLMEngine

        mode = logprobs_mode_for(temperature)
        check_logprobs_mode(mode, SamplingParams(temperature=temperature, top_p=top_p))
        return VLLMEngine(model, tokenizer, gpu_memory_utilization=float(cfg.vllm_gpu_memory_utilization),
                          enable_sleep_mode=bool(cfg.vllm_enable_sleep_mode), logprobs_mode=mode,
                          bucket_bytes=bucket, seed=int(getattr(cfg, "seed", 0)))
    from lmselfplay.lm.engines.vllm_server import VLLMServerEngine

    engine = VLLMServerEngine(tokenizer, base_url=cfg.vllm_server_url, timeout=float(cfg.vllm_server_timeout),
                              wait_for_server=float(cfg.vllm_server_wait), bucket_bytes=bucket)
    check_logprobs_mode(engine.logprobs_mode, SamplingParams(temperature=temperature, top_p=top_p))
    engine.update_weights(model, version=0)  # the server starts from whatever it loaded: serve ours
    return engine
