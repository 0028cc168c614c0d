"""The steps of RL with verifiable rewards, the algorithm of ``recipes/rlvr.py``, whose docstring
is its box (steps 1-6):

* step 1, the questions: :func:`make_task_set` (the run's task set and its held-out split);
* step 2, the group: :func:`sampling` (seeded by seed, rank and step), :func:`generate`;
* step 4, advantages: :func:`advantages_of` (GRPO's group advantage, or the reward itself);
* step 5, the update's samples: :func:`samples_of`; the step's log row: :func:`group_stats`.

Its configs are :mod:`lmselfplay.rlvr.config`, its held-out evaluation (step 6)
:mod:`lmselfplay.rlvr.metrics`. The task sets are :mod:`lmselfplay.tasks.task_sets`; the referee
(step 3) is :class:`~lmselfplay.verifiers.task_referee.TaskReferee`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmselfplay.lm.engines import SamplingParams, generate_fitting
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.advantages import group_advantages
from lmselfplay.rlvr.config import RLVRArgs, RLVRConfigs
from lmselfplay.tasks.task_sets import TaskItem, TaskSet
from lmselfplay.utils.config import ConfigError


def make_task_set(cfg: RLVRConfigs) -> TaskSet:
    """The run's task set (a ConfigError names a bad task, file or reasoning-gym setting)."""
    a = cfg.rlvr
    try:
        return TaskSet(a.task, a.heldout_size, seed=cfg.run.seed, task_config=a.task_settings(),
                       heldout_seed=a.heldout_seed, heldout_path=a.heldout_path or None)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def generate(engine: Any, tok: Any, items: list[TaskItem], sampling: SamplingParams):
    """One engine call for all ``items`` (through THE formatter)."""
    return generate_fitting(engine, [encode_prompt(tok, t.prompt) for t in items], sampling)


def sampling(cfg: RLVRConfigs, step: int, rank: int, greedy: bool = False) -> SamplingParams:
    return cfg.sampling.params(cfg.rlvr.max_new_tokens, hash((cfg.run.seed, rank, step)) % (2**31), greedy)


def samples_of(completions, advantages: np.ndarray, rewards: np.ndarray, items: list[TaskItem],
               version: int) -> list[Sample]:
    """The trained samples (an empty answer carries no token to train)."""
    return [Sample(c.prompt_ids, c.token_ids, c.logprobs, float(adv), float(r), "solver", t.kind,
                   version if c.version is None else c.version)
            for c, adv, r, t in zip(completions, advantages, rewards, items) if c.token_ids]


def advantages_of(rewards: np.ndarray, args: RLVRArgs) -> np.ndarray:
    """Per answer, ``rewards`` shaped (questions, G): GRPO's group advantage, or the reward itself."""
    if args.advantage == "reward":
        return rewards.reshape(-1).astype(float)
    return group_advantages(rewards, normalize_std=args.scale_rewards).reshape(-1)


def group_stats(rewards: np.ndarray) -> dict[str, float]:
    """The step's reward, and the share of groups with mixed rewards (the only ones that teach)."""
    groups = rewards.reshape(rewards.shape[0], -1)
    informative = (groups.max(axis=1) > groups.min(axis=1)).mean()
    return {"train/reward": float(rewards.mean()), "train/informative_groups": float(informative)}
