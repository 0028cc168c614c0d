"""Rollout engines: ``hf`` (batched transformers generate, default); ``vllm`` (colocated) and
``vllm-server`` (``vllm serve``) on GPU, chosen by :func:`make_engine` from ``cfg.engine``.
The vLLM modules import vLLM only when an engine is built."""

from lmselfplay.lm.engines.base import Completion, Engine, SamplingParams, generate_fitting
from lmselfplay.lm.engines.factory import EngineConfig, make_engine
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.engines.weight_sync_check import WeightSyncCheck

__all__ = ["Completion", "Engine", "EngineConfig", "HFEngine", "SamplingParams", "WeightSyncCheck", "generate_fitting",
           "make_engine"]
