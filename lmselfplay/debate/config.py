"""The debate recipe's configs (``recipes/debate.py``): its own arguments (the judge, the tasks,
the protocols evaluated, the steps and their debates, the baselines) beside the trainer's, the
protocol's, the policy's, the engine's and the run's configs.

Rules: ``eval_protocols`` names only known protocols (:data:`~lmselfplay.debate.protocols.PROTOCOLS`);
``max_steps`` is the loop's length (the trainer's schedules span it); ``eval_every`` 0 evaluates only
before and after training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from lmselfplay.debate.protocols import PROTOCOLS, ProtocolConfig
from lmselfplay.models.policy import check_dtype, check_local_model
from lmselfplay.rl.configs import PolicyGradientConfigs
from lmselfplay.utils.config import Config, ConfigError, non_negative, positive
from lmselfplay.utils.run import PeriodicCheckpoints
from lmselfplay.verifiers.executor import ExecutorConfig


@dataclass
class DebateArgs(Config):
    """The debate recipe's own fields; the components' are in their own configs (:class:`DebateConfigs`)."""

    _argument_group_name = "debate (lmselfplay.debate.config.DebateArgs)"
    resume_fixed: ClassVar[frozenset[str]] = frozenset({"task_families", "reasoning_gym_datasets", "dataset_path"})
    judge_model_name_or_path: str = field(default="", metadata={
        "help": "the judge (hub name or path); empty: a frozen copy of the initial policy"})
    judge_device: str = field(default="auto", metadata={"help": "auto | cpu | cuda | cuda:N"})
    judge_dtype: str = field(default="auto", metadata={"help": "auto | float32 | bfloat16 | float16"})
    task_families: str = field(default="arithmetic,programs", metadata={
        "help": "comma-separated: arithmetic, programs, reasoning_gym, dataset"})
    reasoning_gym_datasets: str = field(default="chain_sum,leg_counting", metadata={
        "help": "reasoning-gym dataset names (family reasoning_gym)"})
    dataset_path: str = field(default="", metadata={
        "help": "local json/jsonl/csv/parquet with question, context, correct, incorrect (family dataset)"})
    train_tasks: int = field(default=512, metadata={"help": "questions debated during training"})
    eval_tasks: int = field(default=64, metadata={"help": "held-out questions of every evaluation"})
    eval_protocols: str = field(default=",".join(PROTOCOLS), metadata={"help": "protocols evaluated: debate, consultancy, double_consultancy, none"})
    max_steps: int = field(default=30, metadata={"help": "training steps (each one trainer.step())"})
    debates_per_step: int = field(default=16, metadata={"help": "debates per training step"})
    baseline_decay: float = field(default=0.9, metadata={"help": "EMA decay of the per-side, per-round baselines"})
    eval_every: int = field(default=0, metadata={"help": "0: evaluate only before and after training"})

    def validate(self) -> None:
        positive(self, "max_steps", "debates_per_step", "train_tasks", "eval_tasks")
        non_negative(self, "eval_every")
        bad = [p for p in self.eval_protocols.split(",") if p.strip() and p.strip() not in PROTOCOLS]
        if bad:
            raise ConfigError(f"unknown eval_protocols {bad}; known: {PROTOCOLS}")
        check_dtype(self.judge_dtype, "judge_dtype")
        check_local_model(self.judge_model_name_or_path, "judge_model_name_or_path")


@dataclass(frozen=True)
class DebateConfigs(PolicyGradientConfigs):
    """What ``recipes/debate.py`` parses: the trainer's, policy's, engine's and run's configs, its
    own arguments, and the protocol's and checkpoints'."""

    debate: DebateArgs
    protocol: ProtocolConfig
    checkpoints: PeriodicCheckpoints

    defaults = {"output_dir": "runs/debate"}

    def validate(self) -> None:
        """Program questions: the sandbox's settings (``LMSELFPLAY_SANDBOX``) are checked here,
        before any model loads."""
        if "programs" in [f.strip() for f in self.debate.task_families.split(",")]:
            ExecutorConfig()

    def answer_budget(self) -> int:
        """The engine's answer budget (its KV cache is sized for it): a speech's (the protocol's)."""
        return self.protocol.max_new_tokens
