"""Search self-play's configs: its own arguments (:class:`SearchSelfPlayArgs`) and the tuple it
parses (:class:`SearchSelfPlayConfigs`), the PUCT search's part shared with AlphaZero."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

from lmselfplay.alphazero.config import SearchConfig
from lmselfplay.lm.sampling import SamplingConfig
from lmselfplay.models.policy import PolicyConfig
from lmselfplay.rl.league import LeagueConfig
from lmselfplay.rl.trainer import TargetLossConfig, TrainerConfig
from lmselfplay.utils.config import Config, ConfigError, Configs, non_negative, positive
from lmselfplay.utils.run import PeriodicCheckpoints, RunConfig


@dataclass
class SearchSelfPlayArgs(Config):
    """Search self-play's own fields (the rounds, the search, the head, the evaluation); the
    components' fields are in their own configs (:class:`SearchSelfPlayConfigs`)."""

    _argument_group_name = "search self-play (lmselfplay.search_selfplay.config.SearchSelfPlayArgs)"
    resume_fixed: ClassVar[frozenset[str]] = frozenset({"game", "game_args", "q_head", "value_width", "replay_window"})
    # rounds beside the trainer's num_iterations (its PPO passes): one word, one meaning
    renamed_keys: ClassVar[dict[str, str]] = {"iterations": "rounds", "games_per_iteration": "games_per_round"}
    unused_keys: ClassVar[dict[str, str]] = {"max_staleness": (
        "its games are played by PUCT on the trainer's own forward passes and value head (no engine holds their "
        "weights), and it trains on search targets from a window of the last replay_window rounds, off-policy "
        "by design, which replay_window already bounds")}
    game: str = field(default="nim", metadata={"help": "registered game name (perfect information)"})
    game_args: str = field(default="{}", metadata={"help": "JSON dict of game parameters"})
    rounds: int = field(default=10, metadata={"help": "rounds of searched self-play + distillation"})
    games_per_round: int = field(default=64, metadata={"help": "self-play games per round"})
    target_tau: float = field(default=1.0, metadata={"help": "temperature of the visit distribution distilled"})
    replay_window: int = field(default=4, metadata={"help": "rounds of self-play kept"})
    distill_steps: int = field(default=20, metadata={"help": "trainer steps per round"})
    batch_size: int = field(default=128, metadata={"help": "distillation samples per trainer step"})
    value_steps: int = field(default=50, metadata={"help": "value-head optimizer steps per round"})
    value_lr: float = field(default=1e-3, metadata={"help": "value-head learning rate"})
    value_width: int = field(default=64, metadata={"help": "value-head (or Q-head) hidden width"})
    q_head: bool = field(default=False, metadata={
        "help": "a Q head (bounded Q per move, V = sum_a pi(a|s) Q(s, a)) instead of the value head"})
    q_lambda: float = field(default=4.0, metadata={
        "help": "lambda_Q: Q target = c Q_search + (1 - c) Q_prior with c = N / (N + lambda_Q)"})
    eval_every: int = field(default=2, metadata={"help": "rounds between evaluations (0: never)"})
    eval_games: int = field(default=100, metadata={"help": "games per evaluation opponent and budget"})
    eval_budgets: list[int] = field(default_factory=lambda: [0, 16, 32, 64], metadata={
        "help": "search budgets evaluated (0 = the raw LLM)"})
    eval_positions: int = field(default=0, metadata={"help": "fixed positions for the exact metrics (0: all)"})
    eval_openings: int = field(default=10, metadata={"help": "fixed opening positions for the search budgets"})
    opening_plies: int = field(default=2, metadata={"help": "random opening moves of the evaluation games"})
    eval_batch: int = field(default=512, metadata={"help": "positions per LLM forward in evaluation"})
    max_new_tokens: int = field(default=8, metadata={
        "help": "answer budget of the raw LLM's greedy moves at budget 0 (tokens)"})
    keep_checkpoints: int = field(default=2, metadata={"help": "checkpoints kept on disk"})
    torch_threads: int = field(default=1, metadata={"help": "torch CPU threads"})
    progress: bool = field(default=True, metadata={"help": "show progress bars"})
    max_steps: int = field(default=1000, metadata={
        "help": "trainer steps the learning-rate and beta schedules span (each round makes distill_steps)"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda | cuda:N: where the policy is loaded"})

    def validate(self) -> None:
        positive(self, "max_steps", "rounds", "games_per_round", "replay_window", "batch_size",
                 "max_new_tokens", "value_width", "eval_batch", "q_lambda", "target_tau")
        non_negative(self, "distill_steps", "value_steps", "value_lr", "eval_every", "eval_games", "eval_positions",
                     "eval_openings", "opening_plies")
        if any(b < 0 for b in self.eval_budgets):
            raise ConfigError(f"eval_budgets must be >= 0, got {self.eval_budgets}")
        try:
            if not isinstance(json.loads(self.game_args), dict):
                raise ValueError("not an object")
        except ValueError as e:
            raise ConfigError(f"game_args must be a JSON object: {e}") from None


@dataclass(frozen=True)
class SearchSelfPlayConfigs(Configs):
    """What ``recipes/search_selfplay.py`` parses: its own arguments, the search's (shared with
    AlphaZero) and each component's config; the sampling's temperature is the one the trainer
    scores its distillation targets at."""

    search: SearchSelfPlayArgs
    puct: SearchConfig
    trainer: TrainerConfig
    sampling: SamplingConfig
    target_loss: TargetLossConfig
    league: LeagueConfig
    policy: PolicyConfig
    run: RunConfig
    checkpoints: PeriodicCheckpoints

    # the trainer's and the league's own defaults suit policy-gradient runs
    defaults = {"output_dir": "runs/search_selfplay", "learning_rate": 1e-3, "beta": 0.01, "num_iterations": 1,
                "merge_identical": False, "mirror_fraction": 0.4, "recent_fraction": 0.4,
                "hall_of_fame_fraction": 0.2, "bot_fraction": 0.0, "league_add_every": 2, "league_promote_every": 4,
                "league_capacity": 6}

    def validate(self) -> None:
        """The prior is read right after ``<move>`` (no think block); a bot has no search to distil;
        ``checkpoint_every`` > 0 (the recipe checkpoints rounds and always its last one); ``top_p``
        stays 1 (no answer is sampled)."""
        positive(self.checkpoints, "checkpoint_every")
        if self.policy.enable_thinking:
            raise ConfigError("search self-play reads the LLM's prior right after <move> (no think block): "
                              "enable_thinking must be false")
        if self.league.bot_fraction > 0:
            raise ConfigError("bot_fraction must be 0: a bot gives no search to distil")
        if self.sampling.top_p != 1.0:
            raise ConfigError("top_p must be 1: search self-play samples no answers (its moves come from the "
                              "search; temperature is the one the trainer scores the policy at)")
