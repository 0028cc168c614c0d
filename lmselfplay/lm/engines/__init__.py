"""Rollout engines: ``hf`` (batched transformers generate, default); ``vllm`` on GPU."""

from lmselfplay.lm.engines.base import Completion, Engine, SamplingParams
from lmselfplay.lm.engines.hf import HFEngine

__all__ = ["Completion", "Engine", "HFEngine", "SamplingParams"]
