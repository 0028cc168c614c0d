"""Rollout engines: ``hf`` (batched transformers generate, default); ``vllm`` on GPU."""

from .base import Completion, Engine, SamplingParams
from .hf import HFEngine

__all__ = ["Completion", "Engine", "HFEngine", "SamplingParams"]
