"""The weight-sync check: are the rollouts sampled from the weights being trained?

    logprob_diff = mean over the sampled (policy) tokens of |trainer log-prob - engine log-prob|

The trainer's first pass over a batch computes the current log-probs of every sampled token
before any optimizer step; the engine reported the behaviour log-probs when it sampled. With
the weights in sync the two differ only by numerics (0 in float32 for the HF engine sharing the
trainer's module; ~0.01-0.02 for a bf16 vLLM engine). A weight push that silently stopped
working leaves the engine a step or more behind and the difference jumps (huggingface/trl#5312:
~0.015 -> ~0.20 when sleep mode stopped syncing). Every engine is checked every step:
above ``weight_sync_threshold`` it is a warning, or an error with ``strict_sync``. The check sits in
the layer every recipe shares: ``make_engine`` gives each learner engine its detector and
``PolicyTrainer.step`` judges the step against the engine it last served.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from lmselfplay.utils.config import Config, non_negative


class StaleWeightsError(RuntimeError):
    """The engine's log-probs are too far from the trainer's (``strict_sync``)."""


class StaleWeightsWarning(UserWarning):
    pass


@dataclass
class WeightSyncCheckConfig(Config):
    _argument_group_name = "weight-sync check (lmselfplay.lm.engines.weight_sync_check.WeightSyncCheckConfig)"
    renamed_keys: ClassVar[dict[str, str]] = {"staleness_threshold": "weight_sync_threshold"}
    weight_sync_threshold: float = field(default=0.1, metadata={
        "help": "mean |trainer - engine| log-prob of sampled tokens above which the engine is stale (0: off)"})
    strict_sync: bool = field(default=False, metadata={"help": "a stale engine is an error, not a warning"})

    def validate(self) -> None:
        non_negative(self, "weight_sync_threshold")


def mean_abs_logprob_diff(trainer_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor) -> float:
    """Masked mean of |trainer_lp - engine_lp| (``mask`` may hold token weights); 0 tokens -> nan."""
    w = mask.float()
    total = float(w.sum())
    if total <= 0:
        return math.nan
    return float(((trainer_lp.detach().float() - engine_lp.float()).abs() * w).sum() / total)


class WeightSyncCheck:
    def __init__(self, threshold: float = 0.1, strict: bool = False):
        if threshold < 0:
            raise ValueError(f"weight_sync_threshold must be >= 0, got {threshold}")
        self.threshold, self.strict = threshold, strict
        self.history: list[float] = []

    @classmethod
    def from_config(cls, cfg: WeightSyncCheckConfig) -> WeightSyncCheck:
        return cls(cfg.weight_sync_threshold, cfg.strict_sync)

    def check(self, value: float, step: int | None = None, engine: str = "engine") -> dict[str, float]:
        """Record one step's measured difference; warn or raise when over the threshold.
        Returns the metric to log (``sync/logprob_diff``)."""
        self.history.append(value)
        if self.threshold > 0 and not math.isnan(value) and value > self.threshold:
            at = f" at step {step}" if step is not None else ""
            msg = (f"{engine} is stale{at}: mean |trainer - engine| log-prob of the sampled tokens is {value:.4f} "
                   f"> weight_sync_threshold {self.threshold}; its weights are not the trainer's (a weight push "
                   f"failed or was skipped?)")
            if self.strict:
                raise StaleWeightsError(msg + " [strict_sync: true]")
            warnings.warn(msg, StaleWeightsWarning, stacklevel=2)
        return {"sync/logprob_diff": value, "sync/stale": float(self.threshold > 0 and value > self.threshold)}
