"""The configs every policy-gradient recipe parses (``selfplay_games``, ``r_zero``,
``absolute_zero``, ``debate``): the parts of a run that trains a policy with
:class:`~lmselfplay.rl.trainer.PolicyTrainer` and samples it with an engine.

A recipe's container derives from :class:`PolicyGradientConfigs` and adds its own arguments and
its other parts; each component is built from its own part (``PolicyTrainer(model, tok,
cfg.trainer, ...)``, ``load_policy(cfg.policy, ...)``, ``make_engine(cfg.engine, ...)``,
``Run(cfg.run, ...)``). These parts come first in the parsed tuple, so ``--help`` lists them
before the recipe's own group.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmselfplay.lm.engines import EngineConfig
from lmselfplay.models.policy import PolicyConfig
from lmselfplay.rl.trainer import TrainerConfig
from lmselfplay.utils.config import Configs
from lmselfplay.utils.run import RunConfig


@dataclass(frozen=True)
class PolicyGradientConfigs(Configs):
    """The trainer's, the policy's, the engine's and the run's configs."""

    trainer: TrainerConfig
    policy: PolicyConfig
    engine: EngineConfig
    run: RunConfig
