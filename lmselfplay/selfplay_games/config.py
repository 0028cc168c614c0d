"""The self-play recipe's configs: its own arguments (:class:`SelfPlayArgs`), the tuple it parses
(:class:`SelfPlayConfigs`) and the checks that span its parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from lmselfplay.games.base import has_enumerable_actions
from lmselfplay.lm import readout as policy_readout
from lmselfplay.lm.prompt import thinks
from lmselfplay.lm.trajectory import role_key
from lmselfplay.rl.average_policy import AverageConfig
from lmselfplay.rl.configs import PolicyGradientConfigs
from lmselfplay.rl.exact_feedback import FeedbackConfig
from lmselfplay.rl.kl import KLCoefficient
from lmselfplay.rl.league import LeagueConfig, PlayInConfig
from lmselfplay.rl.trainer import TargetLossConfig
from lmselfplay.utils.config import Config, ConfigError, non_negative, positive
from lmselfplay.utils.run import PeriodicCheckpoints


@dataclass
class SelfPlayArgs(Config):
    """The self-play recipe's own fields (the loop, its games, its evaluation); the components'
    fields are in their own configs (:class:`SelfPlayConfigs`)."""

    _argument_group_name = "self-play (lmselfplay.selfplay_games.config.SelfPlayArgs)"
    resume_fixed: ClassVar[frozenset[str]] = frozenset({"games"})
    games: str = field(default="nim,tictactoe,kuhn_poker", metadata={"help": "comma-separated registry names"})
    game_weights: str = field(default="", metadata={
        "help": "share of each step's episodes per game, e.g. 'kuhn_poker=4' (unlisted games weigh 1)"})
    torch_threads: int = field(default=0, metadata={
        "help": "torch CPU threads; 0: auto = 1 for the embedded model, else the cores other processes leave free "
                "(lmselfplay/utils/threads.py)"})
    max_steps: int = field(default=60, metadata={
        "help": "self-play steps (each one trainer.step(); the learning-rate and beta schedules span them)"})
    episodes_per_step: int = field(default=48, metadata={"help": "games played per step (split across games by game_weights)"})
    concurrency: int = field(default=128, metadata={"help": "games live at once (their pending turns share one engine call)"})
    max_new_tokens: int = field(default=12, metadata={"help": "answer budget of a move (tokens)"})
    text_max_new_tokens: int = field(default=64, metadata={
        "help": "answer budget in games whose moves are free text (Taboo)"})
    reward_shaping: str = field(default="none", metadata={
        "help": "none: every turn gets its seat's baseline advantage | spag: SPAG's per-turn weights for games "
                "that define turn_weights (Taboo): only the winner's turns, later ones more, roles rebalanced"})
    shaping_decay: float = field(default=0.8, metadata={"help": "SPAG's per-turn decay (turn k weighs decay**-k)"})
    retries: int = field(default=0, metadata={"help": "extra tries after an illegal answer before it forfeits the game"})
    illegal_penalty: float = field(default=0.0, metadata={
        "help": "> 0: an illegal answer's own turn gets advantage -illegal_penalty instead of its game's "
                "(with retries the game goes on, so the answer itself must carry the blame)"})
    max_turns: int = field(default=40, metadata={"help": "moves after which a game is cut as a draw"})
    reset_fraction: float = field(default=0.0, metadata={"help": "games started from random legal positions"})
    reset_max_plies: int = field(default=6, metadata={"help": "random moves at most before a reset game starts"})
    baseline_decay: float = field(default=0.9, metadata={"help": "EMA decay of the role baselines (per game, seat, start)"})
    baseline_key: str = field(default="role", metadata={
        "help": "role: one EMA baseline per (game, seat, start), every turn of a game gets its return minus it "
                "(SPIRAL's RAE); observation: one per (role, exact prompt), each turn gets its return minus the "
                "mean return seen from that observation (a tabular critic: for small games; the role's baseline "
                "until the observation has one)"})
    eval_every: int = field(default=10, metadata={"help": "steps between evaluations (0: only at the end)"})
    eval_suite: str = field(default="", metadata={
        "help": "a reasoning benchmark suite (e.g. 'tiny', 'default' or a YAML path) also run every eval_every steps"})
    eval_max_new_tokens: int = field(default=0, metadata={
        "help": "answer budget of the eval_suite problems (0: the suite's own max_new_tokens)"})
    readout: str = field(default="auto", metadata={
        "help": "how the exact metrics (and the average policy) read the policy: bare = teacher-forced answers "
                "right after the assistant header; sampled = readout_samples answers per position / information "
                "set, generated as played (thinking included), parsed; auto = sampled iff enable_thinking"})
    readout_samples: int = field(default=32, metadata={"help": "answers per position of the sampled readout"})
    eval_games: int = field(default=100, metadata={"help": "games per reference bot at each evaluation"})
    gnugo_level: int = field(default=0, metadata={
        "help": "also evaluate Go against GnuGo at this level (0: off; skipped with a note when gnugo is missing)"})
    gnugo_games: int = field(default=20, metadata={"help": "games against GnuGo per evaluation"})
    eval_positions: int = field(default=400, metadata={"help": "positions sampled for optimal-move rates (0: all)"})

    def validate(self) -> None:
        positive(self, "max_steps", "episodes_per_step", "concurrency", "max_new_tokens", "text_max_new_tokens", "max_turns")
        non_negative(self, "retries", "illegal_penalty", "reset_max_plies", "eval_every", "eval_games",
                     "gnugo_level", "gnugo_games", "eval_positions", "torch_threads")
        if self.baseline_key not in ("role", "observation"):
            raise ConfigError(f"baseline_key must be 'role' or 'observation', got {self.baseline_key!r}")
        policy_readout.resolve_readout(self.readout, False)  # a valid name; auto resolves with the model
        positive(self, "readout_samples")
        non_negative(self, "eval_max_new_tokens")

    def answer_budget(self) -> int:
        """The engine's answer budget (its KV cache is sized for it): the largest of a move's, a text turn's and an evaluation's."""
        return max(self.max_new_tokens, self.text_max_new_tokens, self.eval_max_new_tokens)


@dataclass(frozen=True)
class SelfPlayConfigs(PolicyGradientConfigs):
    """What ``recipes/selfplay_games.py`` parses: the trainer's, policy's, engine's and run's
    configs, its own arguments, and the target loss's (exact feedback and the average's
    distillation make target samples), average policy's, feedback's, league's, play-in's and
    checkpoints'."""

    selfplay: SelfPlayArgs
    target_loss: TargetLossConfig
    average: AverageConfig
    feedback: FeedbackConfig
    league: LeagueConfig
    play_in: PlayInConfig
    checkpoints: PeriodicCheckpoints

    defaults = {"output_dir": "runs/selfplay_games"}

    def validate(self) -> None:
        """Exact feedback and the average's distillation teach bare answers (a thinking policy
        would learn to stop thinking); the distillation runs past the loop's steps, where a
        decaying schedule has ended."""
        if self.feedback.feedback == "exact" and self.policy.enable_thinking:
            raise ConfigError("feedback: exact reads and distils a bare answer (<move> right after the assistant "
                              "header), which is not what a thinking policy plays and would train it to stop "
                              "thinking: use feedback: sampled, or enable_thinking: false")
        distils = self.average.average_policy and self.average.distill_steps
        if distils and self.policy.enable_thinking:
            raise ConfigError("distill_steps teach bare answers (<move> right after the assistant header), which "
                              "would train a thinking policy to stop thinking: use distill_steps 0 (the average is "
                              "still read by sampling and reported) or enable_thinking: false")
        schedule = self.trainer.lr_scheduler_type
        if distils and schedule not in ("constant", "constant_with_warmup"):
            raise ConfigError(f"distill_steps run past max_steps, where lr_scheduler_type {schedule!r} has "
                              "decayed: use a constant schedule or distill_steps 0")


def check_thinking(average: AverageConfig, feedback, tok) -> None:
    """Exact feedback and the average's distillation teach bare answers: ConfigError when the
    policy thinks (also when the template thinks by default, which the config alone cannot tell)."""
    if not thinks(tok):
        return
    if feedback:
        raise ConfigError("feedback: exact reads and distils bare answers, but this policy thinks (its chat "
                          "template opens a think block): use feedback: sampled, or enable_thinking: false")
    if average.average_policy and average.distill_steps:
        raise ConfigError("distill_steps teach bare answers, but this policy thinks (its chat template opens a "
                          "think block): use distill_steps 0, or enable_thinking: false")


def check_beta(beta, games):
    """A per-game ``beta`` (a KLCoefficient, or any form it parses) must name registered games
    (a shared YAML may list games this run does not play) and cover every seat of every game
    played; ConfigError otherwise."""
    from lmselfplay.games import REGISTRY, is_game_name

    beta = KLCoefficient.from_config(beta)
    bad = [str(key) for key, _ in beta.per_key or () if not is_game_name(key.game)]
    if bad:
        raise ConfigError(f"beta names unknown game(s) {bad}; games: {sorted(REGISTRY)} (or 'default')")
    for game in games:
        for seat in range(2):
            try:
                beta.of(role_key(game.name, seat), game.name)
            except KeyError as e:
                raise ConfigError(str(e)) from None


def check_bots(league: LeagueConfig, games) -> None:
    """``bot_fraction`` > 0 needs a bot for every game: a random one where moves can be enumerated,
    else the game's scripted opponent (TextArena's games have neither); ConfigError otherwise."""
    if league.bot_fraction <= 0:
        return
    bare = [g.name for g in games if not has_enumerable_actions(g) and not hasattr(g, "scripted_action")]
    if bare:
        raise ConfigError(f"bot_fraction {league.bot_fraction} needs a bot opponent, and {bare} have none (moves "
                          "are free text and no scripted opponent): set bot_fraction: 0 and give its share to "
                          "mirror_fraction")


def check_shaping(args: SelfPlayArgs, games):
    """``reward_shaping: spag`` needs a game that defines ``turn_weights``; ConfigError otherwise."""
    if args.reward_shaping not in ("none", "spag"):
        raise ConfigError(f"reward_shaping must be 'none' or 'spag', got {args.reward_shaping!r}")
    if args.reward_shaping == "spag" and not any(hasattr(g, "turn_weights") for g in games):
        raise ConfigError(f"reward_shaping: spag shapes games with turn_weights (taboo); none in {args.games!r}")
