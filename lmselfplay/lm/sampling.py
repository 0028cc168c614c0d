"""The sampling part of a recipe's configs: the temperature and nucleus of the policy's own
answers, and the :class:`~lmselfplay.lm.engines.base.SamplingParams` built from them
(:meth:`SamplingConfig.params`).

Rules: the temperature is a finite number > 0 (greedy decoding is a call's own choice,
``greedy=True``), and a policy-gradient trainer scores the samples at it
(``PolicyTrainer(..., temperature=cfg.sampling.temperature)``); ``top_p`` is in (0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lmselfplay.lm.engines.base import SamplingParams
from lmselfplay.utils.config import Config, ConfigError, positive


@dataclass
class SamplingConfig(Config):
    """How the policy samples its rollouts; every sampling recipe's configs hold one."""

    _argument_group_name = "sampling (lmselfplay.lm.sampling.SamplingConfig)"
    temperature: float = field(default=1.0, metadata={
        "help": "sampling temperature of the policy's own answers; a policy-gradient trainer scores them at it"})
    top_p: float = field(default=1.0, metadata={
        "help": "nucleus sampling of the policy's own answers, in (0, 1] (behaviour log-probs are before top-p)"})

    def validate(self) -> None:
        positive(self, "temperature", "top_p")
        if not self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

    def params(self, max_new_tokens: int, seed: int | None = None, greedy: bool = False,
               stop: Sequence[str] = ()) -> SamplingParams:
        """The engine's sampling of one call: this temperature (0, greedy, where ``greedy``) and
        top-p, ``max_new_tokens`` per answer, ``stop`` strings, ``seed``."""
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0 if greedy else self.temperature,
                              top_p=self.top_p, stop=list(stop), seed=seed)
