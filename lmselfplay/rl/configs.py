"""The configs every policy-gradient recipe parses (``selfplay_games``, ``r_zero``,
``absolute_zero``, ``debate``, ``rlvr``): the parts of a run that trains a policy with
:class:`~lmselfplay.rl.trainer.PolicyTrainer` and samples it with an engine.

A recipe's container derives from :class:`PolicyGradientConfigs` and adds its own arguments and
its other parts; each component is built from its own part (``PolicyTrainer(model, tok,
cfg.trainer, surrogate=cfg.surrogate, ...)``, ``load_policy(cfg.policy, ...)``, ``make_engine(cfg.engine, ...)``,
``cfg.sampling.params(max_new_tokens, seed)``, ``rollouts_for(cfg.overlap.max_staleness, ...)``, ``Run(cfg.run, ...)``). These parts come first in the parsed tuple, so ``--help`` lists them
before the recipe's own group.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmselfplay.lm.engines import EngineConfig
from lmselfplay.lm.sampling import SamplingConfig
from lmselfplay.models.policy import PolicyConfig
from lmselfplay.rl.overlap import OverlapConfig, check_overlap_settings
from lmselfplay.rl.trainer import SurrogateConfig, TrainerConfig
from lmselfplay.utils.config import Configs
from lmselfplay.utils.run import RunConfig


@dataclass(frozen=True)
class PolicyGradientConfigs(Configs):
    """The trainer's, its policy-gradient surrogate's, the policy's, the engine's, the sampling's,
    the overlap's and the run's configs."""

    trainer: TrainerConfig
    surrogate: SurrogateConfig
    policy: PolicyConfig
    engine: EngineConfig
    sampling: SamplingConfig
    overlap: OverlapConfig
    run: RunConfig

    def __post_init__(self) -> None:
        """The overlap's settings against the engine's (they span two parts), then the recipe's
        own ``validate``."""
        check_overlap_settings(self.overlap, self.engine)
        super().__post_init__()
