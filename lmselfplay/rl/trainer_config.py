"""The trainer's configs: :class:`TrainerConfig` (optimizer, passes, the KL term, micro-batches),
:class:`SurrogateConfig` (the policy-gradient term) and :class:`TargetLossConfig` (the
supervised-target term); :class:`~lmselfplay.rl.trainer.PolicyTrainer` takes all three."""

from __future__ import annotations

from dataclasses import dataclass, field

from lmselfplay.rl.kl import BETA_SCHEDULES, KL_ESTIMATORS, KLCoefficient
from lmselfplay.utils.config import Config, ConfigError, non_negative, positive


@dataclass
class TrainerConfig(Config):
    _argument_group_name = "trainer (lmselfplay.rl.trainer_config.TrainerConfig)"
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate"})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1 (first-moment decay)"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2 (second-moment decay)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping (0: off)"})
    lr_scheduler_type: str = field(default="constant_with_warmup",
                                   metadata={"help": "any transformers scheduler name"})
    warmup_steps: int = field(default=0, metadata={"help": "trainer.step() calls of LR warm-up"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per pass"})
    num_iterations: int = field(default=2, metadata={"help": "PPO passes over each batch"})
    beta: KLCoefficient = field(default=KLCoefficient(0.1), metadata={
        "help": "KL coefficient to the reference policy: a number, or one per game / role as "
                "'nim=0.1,kuhn_poker=0.2' (a YAML mapping works too); keys match a sample's role "
                "'game/pN/start' by its longest prefix, then its task; 'default' covers the rest"})
    beta_schedule: str = field(default="constant", metadata={
        "help": "constant | linear | cosine: every beta is multiplied by a factor going from 1 to "
                "beta_final_ratio over the run's trainer steps (the recipe's step count, as the LR schedule)"})
    beta_final_ratio: float = field(default=1.0, metadata={"help": "beta at the last trainer step / beta at step 0"})
    ref_update_every: int = field(default=0, metadata={
        "help": "M > 0: replace the KL reference with the current policy every M steps (magnetic mirror "
                "descent's moving magnet); 0: the initial policy throughout"})
    kl_estimator: str = field(default="k3", metadata={
        "help": "k3: the sampled token's exp(ref - logp) - (ref - logp) - 1; exact: KL(ref || policy) over the "
                "whole vocabulary at every completion token (k3's expected gradient without its variance)"})
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus coefficient"})
    merge_identical: bool = field(default=True, metadata={"help": "merge equal (prompt, answer) turns"})
    max_tokens_per_micro_batch: int = field(default=8192, metadata={
        "help": "cap on the padded tokens (rows x longest sequence) of one forward/backward: a step's samples are "
                "cut into as many micro-batches as the cap needs (at least gradient_accumulation_steps), the loss "
                "unchanged; a sample longer than the cap is a micro-batch of its own; 0: no cap"})

    def validate(self) -> None:
        check_micro_batch_fields(self)
        self.beta = KLCoefficient.from_config(self.beta)
        positive(self, "gradient_accumulation_steps", "num_iterations")
        non_negative(self, "learning_rate", "warmup_steps", "weight_decay", "max_grad_norm")
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ConfigError(f"beta_schedule must be one of {BETA_SCHEDULES}, got {self.beta_schedule!r}")
        if not self.beta_final_ratio >= 0:
            raise ConfigError(f"beta_final_ratio must be >= 0, got {self.beta_final_ratio}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ConfigError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.ref_update_every < 0:
            raise ConfigError(f"ref_update_every must be >= 0, got {self.ref_update_every}")


@dataclass
class SurrogateConfig(Config):
    """The policy-gradient term's clipped surrogate: PPO's clip range and the truncated
    importance sampling of the engine's log-probs; only the recipes whose samples carry
    advantages and engine log-probs have it (search self-play's distillation samples have
    neither)."""

    _argument_group_name = "policy-gradient surrogate (lmselfplay.rl.trainer_config.SurrogateConfig)"
    epsilon: float = field(default=0.2, metadata={"help": "PPO clip range"})
    tis_cap: float = field(default=0.0, metadata={
        "help": "C > 0: truncated importance sampling of the engine's mismatch (lmselfplay/rl/importance.py): the "
                "PPO ratio against the trainer's own log-probs at the step's start, each token weighted by "
                "min(exp(trainer - engine log-prob), C); 0: off, the ratio against the engine's log-probs"})

    def validate(self) -> None:
        non_negative(self, "epsilon")
        if not self.tis_cap >= 0:
            raise ConfigError(f"tis_cap must be >= 0 (0: off), got {self.tis_cap}")


# the trainer's surrogate where its caller names none: PPO's clip range 0.2, no importance sampling
PPO_SURROGATE = SurrogateConfig()


@dataclass
class TargetLossConfig(Config):
    """The supervised-target term (``Sample.target``: search distillation, exact feedback,
    average-policy distillation); only the recipes that make target samples have it."""

    _argument_group_name = "target loss (lmselfplay.rl.trainer_config.TargetLossConfig)"
    target_coef: float = field(default=1.0, metadata={"help": "weight of the supervised-target cross-entropy"})
    target_passes: int = field(default=0, metadata={
        "help": "extra passes over the batch's pure supervised-target samples only (distillation targets), after "
                "the num_iterations passes over the whole batch; the learning-rate schedule does not advance on them"})

    def validate(self) -> None:
        non_negative(self, "target_coef")
        if self.target_passes < 0:
            raise ConfigError(f"target_passes must be >= 0, got {self.target_passes}")


def check_micro_batch_fields(cfg: TrainerConfig) -> None:
    """ConfigError naming the field: ``max_tokens_per_micro_batch`` must be an integer >= 0."""
    cap = cfg.max_tokens_per_micro_batch
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise ConfigError(f"max_tokens_per_micro_batch must be an integer >= 0 (0: no cap), got {cap!r}")

