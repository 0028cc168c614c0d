"""The SPIN recipe's config (``recipes/spin.py``): the supervised data, the iterations and their
lambda schedule, the DPO step (names as in TRL's ``DPOConfig``) and the
optional SFT phase; and what the DPO step derives from it (:func:`dpo_losses`, :func:`beta_at`).

Rules: at least one lambda, every one a finite number > 0 (the last repeats past the schedule's
end); ``max_completion_length`` None means the longest data answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lmselfplay.lm.sampling import SamplingConfig
from lmselfplay.models.policy import PolicyConfig
from lmselfplay.utils.config import (
    Config,
    ConfigError,
    Configs,
    json_object,
    non_negative,
    positive,
)
from lmselfplay.utils.run import RunConfig


@dataclass
class SpinArgs(Config):
    """SPIN's own fields (the data, the iterations, its DPO and SFT trainers' settings, named as
    TRL's); the policy's, the sampling's and the run's fields are in their own configs (:class:`SpinConfigs`)."""

    _argument_group_name = "spin (lmselfplay.spin.config.SpinArgs)"
    resume_fixed: ClassVar[frozenset[str]] = frozenset({"dataset", "dataset_split", "dataset_config"})
    # data
    dataset: str | None = field(default=None, metadata={
        "help": "datasets name, .jsonl/.json/.parquet/.csv file or save_to_disk folder with "
                "prompt+answer (or prompt+completion, question+answer, messages); "
                "default: the project's arithmetic word problems"})
    dataset_split: str = field(default="train", metadata={"help": "split of the dataset to use"})
    dataset_config: str = field(default="", metadata={
        "help": "dataset reasoning_gym:<task>: the task's settings as JSON, e.g. '{\"min_terms\": 3, \"max_terms\": 3}'"})
    num_train_examples: int = field(default=256, metadata={"help": "training prompts (SPIN's data set size)"})
    num_eval_examples: int = field(default=64, metadata={"help": "held-out prompts for accuracy and likelihood"})
    # SPIN
    spin_iterations: int = field(default=3, metadata={"help": "SPIN iterations: generate, then train on (data, own answer) pairs"})
    beta_per_iteration: list[float] = field(default_factory=lambda: [0.1], metadata={
        "help": "lambda_t per iteration (DPO beta); the last value repeats. The paper: 0.1 ... then 5.0"})
    max_completion_length: int | None = field(default=None, metadata={
        "help": "generation length of y' = longest trained answer; None: the longest data answer"})
    generation_batch_size: int = field(default=64, metadata={"help": "prompts per generate call"})
    # DPO (names as in TRL's DPOConfig)
    num_train_epochs: float = field(default=2.0, metadata={"help": "DPO epochs per SPIN iteration"})
    learning_rate: float = field(default=5e-7, metadata={"help": "DPO learning rate"})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "any transformers scheduler name"})
    warmup_steps: float = field(default=0.1, metadata={"help": "int: steps; float in [0, 1): ratio"})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "DPO pairs per device and step"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    loss_type: str = field(default="sigmoid", metadata={"help": "TRL DPO loss type (sigmoid = SPIN's logistic loss)"})
    rpo_alpha: float = field(default=0.0, metadata={
        "help": "weight of an NLL term on the chosen (data) answer (RPO's alpha; TRL's loss_type 'sft' "
                "beside loss_type): keeps DPO from lowering the data likelihood along with y'"})
    logging_steps: int = field(default=10, metadata={"help": "optimizer steps between log rows"})
    save_steps: int = field(default=50, metadata={"help": "optimizer steps between in-iteration checkpoints"})
    # optional SFT phase -> theta_0 (when the model has not been fine-tuned on the data)
    sft_epochs: float = field(default=0.0, metadata={"help": "SFT epochs on the data before SPIN (theta_0); 0: none"})
    sft_learning_rate: float = field(default=1e-4, metadata={"help": "learning rate of the SFT phase"})
    # output
    progress: bool = field(default=True, metadata={"help": "show progress bars"})

    def dataset_settings(self) -> dict:
        """``dataset_config`` as a mapping (ConfigError naming the field when it is not JSON of one)."""
        return json_object(self, "dataset_config")

    def validate(self) -> None:
        self.dataset_settings()
        positive(self, "num_train_examples", "spin_iterations", "generation_batch_size",
                 "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "logging_steps", "save_steps")
        non_negative(self, "num_eval_examples", "learning_rate", "warmup_steps", "rpo_alpha", "sft_epochs",
                     "sft_learning_rate")
        if self.max_completion_length is not None:
            positive(self, "max_completion_length")
        if not self.beta_per_iteration:
            raise ConfigError("beta_per_iteration must hold at least one lambda")
        bad = [b for b in self.beta_per_iteration
               if not (isinstance(b, int | float) and not isinstance(b, bool) and math.isfinite(b) and b > 0)]
        if bad:
            raise ConfigError(f"beta_per_iteration values must be positive, got {bad}")


@dataclass(frozen=True)
class SpinConfigs(Configs):
    """What ``recipes/spin.py`` parses: its own arguments, the policy's, the sampling's of the
    model's own answers and the run's configs (a checkpoint per iteration, ``checkpoint-<t>``)."""

    spin: SpinArgs
    policy: PolicyConfig
    sampling: SamplingConfig
    run: RunConfig

    defaults = {"output_dir": "runs/spin"}


def dpo_losses(cfg: SpinConfigs) -> dict[str, Any]:
    """DPOConfig's loss fields: the pairwise loss, plus the NLL on the data answer when
    ``rpo_alpha`` > 0 (loss = pairwise + rpo_alpha * NLL(y | x), as RPO / TRL's MPO weights)."""
    if cfg.spin.rpo_alpha == 0:
        return {"loss_type": [cfg.spin.loss_type]}
    return {"loss_type": [cfg.spin.loss_type, "sft"], "loss_weights": [1.0, float(cfg.spin.rpo_alpha)]}


def beta_at(cfg: SpinConfigs, t: int) -> float:
    """lambda_t: the schedule's t-th value, its last one past its end (SpinArgs checked them)."""
    return float(cfg.spin.beta_per_iteration[min(t, len(cfg.spin.beta_per_iteration) - 1)])
