"""RL with verifiable rewards on a fixed task set: the positive control of every language recipe.

The algorithm box and the command are ``recipes/rlvr.py``'s; this module holds its configs
(:class:`RLVRConfigs`), the step's parts (sample the group, score it, the samples) and the
held-out evaluation with 95% intervals. The task sets and their held-out split are
:mod:`lmselfplay.tasks.task_sets`; the referee is :class:`~lmselfplay.verifiers.task_referee.TaskReferee`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmselfplay.lm.engines import SamplingParams, generate_fitting
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.advantages import group_advantages
from lmselfplay.rl.configs import PolicyGradientConfigs
from lmselfplay.tasks.task_sets import TaskItem, TaskSet, parse_spec
from lmselfplay.utils.config import Config, ConfigError, non_negative, positive
from lmselfplay.utils.run import PeriodicCheckpoints
from lmselfplay.utils.stats import wilson
from lmselfplay.verifiers.task_referee import TaskReferee

ADVANTAGES = ("group", "reward")


@dataclass
class RLVRArgs(Config):
    """The positive control's own fields: the task set, the group, the budgets, the evaluation."""

    _argument_group_name = "rlvr (lmselfplay.rl.rlvr.RLVRArgs)"
    task: str = field(default="arithmetic", metadata={
        "help": "arithmetic | program | reasoning_gym:<task> | jsonl:<path> (lines {\"question\", \"answer\"})"})
    task_config: str = field(default="", metadata={
        "help": "reasoning_gym tasks: the dataset's settings as JSON, e.g. '{\"min_terms\": 2, \"max_terms\": 3}'"})
    heldout_size: int = field(default=500, metadata={"help": "fixed held-out items (never trained on)"})
    heldout_seed: int = field(default=0, metadata={"help": "seed of the held-out set (reasoning_gym: its dataset's seed)"})
    heldout_path: str = field(default="", metadata={"help": "jsonl tasks: a file of held-out items (else the last heldout_size lines)"})
    max_steps: int = field(default=200, metadata={"help": "trainer steps (the learning-rate schedule spans them)"})
    prompts_per_step: int = field(default=16, metadata={"help": "distinct questions per step"})
    num_generations: int = field(default=8, metadata={"help": "G: sampled answers per question (the GRPO group)"})
    advantage: str = field(default="group", metadata={
        "help": "group: r minus its group's mean (GRPO); reward: A = r, no baseline (REINFORCE; with 0/1 rewards "
                "only the right answers are pushed up, as rejection-sampling fine-tuning)"})
    scale_rewards: bool = field(default=True, metadata={
        "help": "advantage group: divide by the group's reward std (GRPO); false: mean-centred only (Dr. GRPO)"})
    max_new_tokens: int = field(default=40, metadata={"help": "answer budget"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling (behaviour log-probs are before top-p)"})
    eval_every: int = field(default=50, metadata={"help": "steps between held-out evaluations (0: at the start and end only)"})
    check_timeout_s: float = field(default=2.0, metadata={"help": "time limit of every answer check"})

    def validate(self) -> None:
        try:
            parse_spec(self.task)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.task_settings()
        positive(self, "max_steps", "prompts_per_step", "num_generations", "max_new_tokens", "check_timeout_s")
        non_negative(self, "heldout_size", "eval_every")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.advantage not in ADVANTAGES:
            raise ConfigError(f"advantage must be one of {', '.join(ADVANTAGES)}, got {self.advantage!r}")
        if self.num_generations < 2 and self.advantage == "group":
            raise ConfigError("num_generations must be >= 2: a group of one has no group advantage")

    def task_settings(self) -> dict[str, Any]:
        """``task_config`` as a mapping (ConfigError naming the field when it is not JSON of one)."""
        if not self.task_config:
            return {}
        try:
            value = json.loads(self.task_config)
        except ValueError:
            raise ConfigError(f"task_config must be a JSON object, got {self.task_config!r}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"task_config must be a JSON object, got {self.task_config!r}")
        return value


@dataclass(frozen=True)
class RLVRConfigs(PolicyGradientConfigs):
    """What ``recipes/rlvr.py`` parses: the trainer's, policy's, engine's and run's configs, its
    own arguments and the checkpoints'."""

    rlvr: RLVRArgs
    checkpoints: PeriodicCheckpoints

    defaults = {"output_dir": "runs/rlvr"}


def make_task_set(cfg: RLVRConfigs) -> TaskSet:
    """The run's task set (a ConfigError names a bad task, file or reasoning-gym setting)."""
    a = cfg.rlvr
    try:
        return TaskSet(a.task, a.heldout_size, seed=cfg.trainer.seed, task_config=a.task_settings(),
                       heldout_seed=a.heldout_seed, heldout_path=a.heldout_path or None)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def generate(engine: Any, tok: Any, items: list[TaskItem], sampling: SamplingParams):
    """One engine call for all ``items`` (through THE formatter)."""
    return generate_fitting(engine, [encode_prompt(tok, t.prompt) for t in items], sampling)


def sampling(cfg: RLVRConfigs, step: int, rank: int, greedy: bool = False) -> SamplingParams:
    a = cfg.rlvr
    return SamplingParams(max_new_tokens=a.max_new_tokens, temperature=0.0 if greedy else cfg.trainer.temperature,
                          top_p=a.top_p, seed=hash((cfg.trainer.seed, rank, step)) % (2**31))


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


def heldout_accuracy(engine: Any, tok: Any, referee: TaskReferee, heldout: list[TaskItem],
                     greedy: SamplingParams) -> dict[str, float]:
    """Accuracy of ``greedy`` answers on the held-out items with a 95% Wilson interval, overall and per family."""
    if not heldout:
        return {}
    comps = generate(engine, tok, heldout, greedy)
    right = [v.reward >= 1.0 for v in referee.score(heldout, [c.text for c in comps])]
    out = accuracy_row("eval/heldout", right)
    by_family: dict[str, list[bool]] = defaultdict(list)
    for t, r in zip(heldout, right):
        if t.family:
            by_family[t.family].append(r)
    for fam, rs in sorted(by_family.items()):
        out.update(accuracy_row(f"eval/heldout/{fam}", rs))
    return out


def accuracy_row(prefix: str, right: list[bool]) -> dict[str, float]:
    lo, hi = wilson(sum(right), len(right))
    return {f"{prefix}/accuracy": float(np.mean(right)) if right else float("nan"),
            f"{prefix}/ci_low": lo, f"{prefix}/ci_high": hi, f"{prefix}/n": len(right)}


def plot(logger: Any) -> Any:
    keys = ["eval/heldout/accuracy", "train/reward", "train/informative_groups", "kl", "clip_frac"]
    return logger.plot(keys, "curves.png", title="rlvr")


def print_final(first: dict[str, float], last: dict[str, float], logger: Any, model_dir: Any) -> None:
    def line(row: dict[str, float]) -> str:
        return (f"{row['eval/heldout/accuracy']:.3f} [{row['eval/heldout/ci_low']:.3f}, "
                f"{row['eval/heldout/ci_high']:.3f}]")

    if first and last:
        print(f"\nheld-out accuracy (greedy, 95% CI): {line(first)} -> {line(last)}")
    if logger is not None:
        print(f"curves: {logger.dir / 'curves.png'}\nmetrics: {logger.path}")
    print(f"model: {model_dir}")
