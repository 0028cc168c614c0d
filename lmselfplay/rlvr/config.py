"""The positive control's configs: its own arguments (:class:`RLVRArgs`) and the tuple it parses
(:class:`RLVRConfigs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from lmselfplay.rl.configs import PolicyGradientConfigs
from lmselfplay.tasks.task_sets import parse_spec
from lmselfplay.utils.config import Config, ConfigError, json_object, non_negative, positive
from lmselfplay.utils.run import PeriodicCheckpoints

ADVANTAGES = ("group", "reward")


@dataclass
class RLVRArgs(Config):
    """The positive control's own fields: the task set, the group, the budgets, the evaluation."""

    _argument_group_name = "rlvr (lmselfplay.rlvr.config.RLVRArgs)"
    resume_fixed: ClassVar[frozenset[str]] = frozenset({"task", "task_config"})
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
        if self.advantage not in ADVANTAGES:
            raise ConfigError(f"advantage must be one of {', '.join(ADVANTAGES)}, got {self.advantage!r}")
        if self.num_generations < 2 and self.advantage == "group":
            raise ConfigError("num_generations must be >= 2: a group of one has no group advantage")

    def task_settings(self) -> dict[str, Any]:
        """``task_config`` as a mapping (ConfigError naming the field when it is not JSON of one)."""
        return json_object(self, "task_config")


@dataclass(frozen=True)
class RLVRConfigs(PolicyGradientConfigs):
    """What ``recipes/rlvr.py`` parses: the trainer's, policy's, engine's and run's configs, its
    own arguments and the checkpoints'."""

    rlvr: RLVRArgs
    checkpoints: PeriodicCheckpoints

    defaults = {"output_dir": "runs/rlvr"}
