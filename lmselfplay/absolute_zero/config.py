"""Absolute Zero's configs: its own arguments (:class:`AbsoluteZeroArgs`) and the tuple it parses
(:class:`AbsoluteZeroConfigs`), the sandbox's part among them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from lmselfplay.rl.configs import PolicyGradientConfigs
from lmselfplay.utils.config import Config, ConfigError, non_negative, positive
from lmselfplay.utils.run import PeriodicCheckpoints
from lmselfplay.verifiers.executor import ExecutorConfig


@dataclass
class AbsoluteZeroArgs(Config):
    """Absolute Zero's own fields (the loop, proposals, solving, the evaluation); the
    components' fields, the sandbox's among them, are in their own configs
    (:class:`AbsoluteZeroConfigs`)."""

    _argument_group_name = "absolute zero (lmselfplay.absolute_zero.config.AbsoluteZeroArgs)"
    renamed_keys: ClassVar[dict[str, str]] = {"executor_workers": "max_workers"}
    max_steps: int = field(default=40, metadata={
        "help": "proposer-solver steps (each one trainer.step(); the learning-rate and beta schedules span them)"})
    proposals_per_type: int = field(default=8, metadata={"help": "proposals per task type per step"})
    references: int = field(default=3, metadata={"help": "K buffer tasks shown in each proposal prompt"})
    proposal_style: str = field(default="paper", metadata={
        "help": "paper: the proposer writes program + inputs after K references; io: it writes the program "
                "for one reference's I/O pair and the task takes that reference's inputs (embedded model)"})
    num_generations: int = field(default=4, metadata={"help": "G solver attempts per task"})
    solve_tasks_per_type: int = field(default=8, metadata={"help": "tasks solved per type (topped up from the buffer)"})
    induction_inputs: int = field(default=4, metadata={"help": "inputs per induction task: half shown, half held out"})
    seed_programs: int = field(default=16, metadata={"help": "generated programs seeding each buffer"})
    answer_tags: bool = field(default=False, metadata={
        "help": "ask the solver for <answer>...</answer> (real models); the embedded model answers bare"})
    propose_max_new_tokens: int = field(default=96, metadata={"help": "answer budget of a proposal"})
    solve_max_new_tokens: int = field(default=64, metadata={"help": "answer budget of a solution"})
    format_penalty: float = field(default=-1.0, metadata={"help": "reward of an unparsable proposal or answer"})
    invalid_penalty: float = field(default=-0.5, metadata={"help": "reward of a parsed proposal that fails validation"})
    eval_every: int = field(default=10, metadata={"help": "steps between held-out evaluations"})
    eval_tasks_per_type: int = field(default=200, metadata={"help": "fixed held-out generated tasks per type"})
    save_datasets: bool = field(default=True, metadata={"help": "save each step's proposals and answers (datasets)"})

    def validate(self) -> None:
        positive(self, "max_steps")
        if self.proposal_style not in ("paper", "io") or self.references < 1:
            raise ConfigError(f"proposal_style must be paper or io (got {self.proposal_style!r}) "
                              f"and references >= 1 (got {self.references})")
        positive(self, "proposals_per_type", "num_generations", "solve_tasks_per_type", "induction_inputs",
                 "propose_max_new_tokens", "solve_max_new_tokens")
        non_negative(self, "references", "seed_programs", "eval_every", "eval_tasks_per_type")

    def answer_budget(self) -> int:
        """The engine's answer budget (its KV cache is sized for it): the larger of a proposal's and a solution's."""
        return max(self.propose_max_new_tokens, self.solve_max_new_tokens)


@dataclass(frozen=True)
class AbsoluteZeroConfigs(PolicyGradientConfigs):
    """What ``recipes/absolute_zero.py`` parses: the trainer's, policy's, engine's and run's
    configs, its own arguments, the checkpoints' and the sandbox's (``executor``, checked as it
    is parsed, before any model loads). ``defaults`` holds this recipe's sandbox limits."""

    absolute_zero: AbsoluteZeroArgs
    checkpoints: PeriodicCheckpoints
    executor: ExecutorConfig

    defaults = {"output_dir": "runs/absolute_zero", "timeout_s": 1.0, "memory_mb": 512, "max_output_bytes": 16 * 1024}
