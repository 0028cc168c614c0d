"""R-Zero's configs: its own arguments (:class:`RZeroArgs`) and the tuple it parses
(:class:`RZeroConfigs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from lmselfplay.lm.engines.factory import check_sleep_mode_engines
from lmselfplay.rl.configs import PolicyGradientConfigs
from lmselfplay.tasks.sums import CHAIN_SUM_CONFIG, SUM_TASK
from lmselfplay.utils.config import Config, ConfigError, non_negative, positive
from lmselfplay.verifiers.executor import ExecutorConfig

GROUNDED = {"arithmetic": "rules", "program": "executor", "sum": "rules"}  # the referee that knows each form's truth
# the positive control's task set (spec, settings) of each form's questions: R-Zero's held-out set is its held-out
# items, and the referee study's fixed arm trains on it
TASK_SETS = {"arithmetic": ("arithmetic", {}), "program": ("program", {}), "sum": (SUM_TASK, CHAIN_SUM_CONFIG)}


@dataclass
class RZeroArgs(Config):
    """R-Zero's own fields (the tasks, the roles, the phases, the filter, the budgets); the
    components' fields are in their own configs (:class:`RZeroConfigs`)."""

    _argument_group_name = "r_zero (lmselfplay.r_zero.config.RZeroArgs)"
    renamed_keys: ClassVar[dict[str, str]] = {"iterations": "rounds"}  # beside the trainer's num_iterations
    resume_fixed: ClassVar[frozenset[str]] = frozenset({"task_form", "two_copies", "pool_size"})
    task_form: str = field(default="arithmetic", metadata={
        "help": "arithmetic (word problems) | program (what a program prints) | sum (three one-digit numbers, "
                "reasoning-gym's chain_sum as in the positive control, answered between <answer> tags)"})
    referee: str = field(default="vote", metadata={
        "help": "vote | grounded (= rules for arithmetic, executor for programs) | rules | executor | judge"})
    two_copies: bool = field(default=False, metadata={"help": "challenger and solver as two models"})
    challenger_vllm_server_urls: list[str] = field(default_factory=list, metadata={
        "help": "two_copies with engine=vllm-server: the challenger's `vllm serve` URLs (a server holds one model's "
                "weights; vllm_server_urls serve the solver)"})
    challenger_prompt: str = field(default="", metadata={
        "help": "what the challenger is asked (arithmetic); empty: the corpus's word-problem request"})
    rounds: int = field(default=3, metadata={"help": "challenger + filter + solver rounds (each logged as an iteration)"})
    challenger_steps: int = field(default=2, metadata={"help": "challenger updates per iteration"})
    num_questions: int = field(default=32, metadata={"help": "N: questions per challenger step"})
    challenger_group_size: int = field(default=8, metadata={"help": "questions per prompt (GRPO group)"})
    num_answers: int = field(default=10, metadata={"help": "m: solver answers per question"})
    pool_size: int = field(default=64, metadata={"help": "questions written for the filter"})
    filter_low: int = field(default=3, metadata={"help": "keep questions with >= this many votes of m"})
    filter_high: int = field(default=7, metadata={"help": "... and <= this many"})
    solver_steps: int = field(default=4, metadata={"help": "solver updates per iteration"})
    solver_batch: int = field(default=16, metadata={"help": "kept questions per solver step"})
    solver_group_size: int = field(default=8, metadata={"help": "answers per question (GRPO group)"})
    repetition_weight: float = field(default=1.0, metadata={"help": "lambda of the repetition penalty"})
    repetition_threshold: float = field(default=0.5, metadata={"help": "BLEU above which two questions cluster"})
    malformed_reward: float = field(default=-1.0, metadata={"help": "challenger reward of a malformed question"})
    challenger_max_new_tokens: int = field(default=64, metadata={"help": "answer budget of a question"})
    solver_max_new_tokens: int = field(default=40, metadata={"help": "answer budget of a solution"})
    check_timeout_s: float = field(default=2.0, metadata={"help": "time limit of every answer check"})
    heldout_size: int = field(default=100, metadata={"help": "fixed ground-truth questions for eval"})

    def validate(self) -> None:
        positive(self, "rounds", "challenger_steps", "num_questions", "challenger_group_size", "num_answers",
                 "pool_size", "solver_steps", "solver_batch", "solver_group_size", "challenger_max_new_tokens",
                 "solver_max_new_tokens", "check_timeout_s")
        non_negative(self, "heldout_size")
        if self.task_form not in GROUNDED:
            raise ConfigError(f"task_form must be one of {', '.join(GROUNDED)}, got {self.task_form!r}")
        grounded = GROUNDED[self.task_form]
        if self.referee == "grounded":
            self.referee = grounded
        if self.referee in ("rules", "executor") and self.referee != grounded:
            raise ConfigError(f"referee {self.referee!r} cannot check {self.task_form} questions; use {grounded!r}")
        if not 0 <= self.filter_low <= self.filter_high <= self.num_answers:
            raise ConfigError("need 0 <= filter_low <= filter_high <= num_answers")
        if self.num_questions % self.challenger_group_size or self.pool_size % self.challenger_group_size:
            raise ConfigError("num_questions and pool_size must be multiples of challenger_group_size")

    def answer_budget(self) -> int:
        """The engine's answer budget (its KV cache is sized for it): the larger of a question's and a solution's."""
        return max(self.challenger_max_new_tokens, self.solver_max_new_tokens)


@dataclass(frozen=True)
class RZeroConfigs(PolicyGradientConfigs):
    """What ``recipes/r_zero.py`` parses: the trainer's, policy's, engine's and run's configs and
    its own arguments (checkpoints: one per phase)."""

    rzero: RZeroArgs

    defaults = {"output_dir": "runs/r_zero"}

    def validate(self) -> None:
        """Two copies on servers: one set of servers per model, none shared; one policy: one set.
        At most one sleep-mode vLLM engine per process. Programs: the sandbox's settings
        (``LMSELFPLAY_SANDBOX``) are checked here, before any model loads."""
        args, engine = self.rzero, self.engine
        if args.task_form == "program":
            ExecutorConfig()
        mine = engine.engine == "vllm-server" and args.two_copies
        if args.challenger_vllm_server_urls and not mine:
            raise ConfigError("challenger_vllm_server_urls serve the challenger of two_copies with engine vllm-server; "
                              "one policy uses vllm_server_urls for both roles")
        if mine and not args.challenger_vllm_server_urls:
            raise ConfigError("two_copies with engine vllm-server needs challenger_vllm_server_urls: the challenger "
                              "and the solver are two models, and a server holds one model's weights")
        shared = sorted(set(args.challenger_vllm_server_urls) & set(engine.vllm_server_urls or []))
        if mine and shared:
            raise ConfigError(f"challenger_vllm_server_urls and vllm_server_urls share {shared}: "
                              "a server holds one model's weights")
        check_sleep_mode_engines(engine, 2 if args.two_copies else 1)
