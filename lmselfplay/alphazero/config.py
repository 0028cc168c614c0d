"""The AlphaZero recipe's config (``recipes/alphazero.py``): the game, the search, the replay
window, the network, the bank of frozen opponents, the gate and the evaluation; and the search
settings every self-play and evaluation call derives from it.

Rules: ``game_args`` is a JSON object; fractions are in [0, 1]; ``fpu_reduction`` < 0 means the
reference rule (an unvisited move has Q = 0); ``dirichlet_alpha`` 0 means 10 / the mean number
of legal moves (measured on the game, :func:`~lmselfplay.alphazero.searched_games.alpha_for`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import ClassVar

from lmselfplay.alphazero.searched_games import SelfPlaySettings
from lmselfplay.utils.config import Config, ConfigError, Configs, non_negative, positive
from lmselfplay.utils.run import PeriodicCheckpoints, RunConfig


@dataclass
class SearchConfig(Config):
    """The PUCT search of self-play and how its games start, shared by AlphaZero and search
    self-play: simulations, exploration, the root's Dirichlet noise, the moves sampled from the
    visit counts, and the games started from a random legal position."""

    _argument_group_name = "search (lmselfplay.alphazero.config.SearchConfig)"
    n_sims: int = field(default=32, metadata={"help": "PUCT simulations per move"})
    c_puct: float = field(default=1.5, metadata={"help": "PUCT exploration constant"})
    dirichlet_eps: float = field(default=0.25, metadata={"help": "weight of the Dirichlet noise on the root prior"})
    dirichlet_alpha: float = field(default=0.0, metadata={"help": "0 = 10 / mean legal moves"})
    temperature_moves: int = field(default=4, metadata={"help": "moves sampled from the visit counts before play turns greedy"})
    reset_fraction: float = field(default=0.25, metadata={"help": "games started from a random legal position"})
    reset_max_plies: int = field(default=4, metadata={"help": "random moves at most before a reset game starts"})

    def validate(self) -> None:
        positive(self, "n_sims")
        for name in ("dirichlet_eps", "reset_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")


@dataclass
class AlphaZeroArgs(Config):
    """AlphaZero's own fields (the game, the search, the network, the evaluation); the run's
    fields are in its own configs (:class:`AlphaZeroConfigs`)."""

    _argument_group_name = "alphazero (lmselfplay.alphazero.config.AlphaZeroArgs)"
    resume_fixed: ClassVar[frozenset[str]] = frozenset({"game", "game_args", "network", "hidden", "blocks",
                                                        "replay_window", "bank_size"})
    game: str = field(default="nim", metadata={"help": "registered game name"})
    game_args: str = field(default="{}", metadata={"help": "JSON dict of game parameters"})
    iterations: int = field(default=10, metadata={"help": "rounds of self-play + training"})
    max_minutes: float = field(default=0.0, metadata={
        "help": "stop after the round in which this process's wall time passes this many "
                "minutes (evaluated and saved); 0 = run all iterations"})
    games_per_iteration: int = field(default=128, metadata={"help": "self-play games per round (played as one batch)"})
    prune_root: bool = field(default=False, metadata={
        "help": "self-play roots search only the game's selfplay_actions (Go: no pass while "
                "behind on the board unless the opponent just passed)"})
    pass_injection: float = field(default=0.0, metadata={
        "help": "probability that a self-play move is replaced by a pass (games with a pass; never a "
                "game-ending one): shows the network opponents that pass on an unsettled board"})
    fpu_reduction: float = field(default=-1.0, metadata={
        "help": "first-play urgency: an unvisited move is worth the node's mean Q minus this "
                "(Leela Zero); < 0 = Q 0, the reference rule"})
    tree_reuse: bool = field(default=False, metadata={"help": "keep subtrees between moves"})
    score_weight: float = field(default=0.0, metadata={
        "help": "value target = (1-w) outcome + w tanh(margin / score_scale); games with "
                "score_margins (Go); 0 = the outcome alone"})
    score_scale: float = field(default=10.0, metadata={"help": "points of margin that give tanh(1)"})
    replay_window: int = field(default=4, metadata={"help": "iterations of self-play kept"})
    train_steps: int = field(default=200, metadata={"help": "optimizer steps per round"})
    batch_size: int = field(default=128, metadata={"help": "positions per optimizer step"})
    learning_rate: float = field(default=1e-3, metadata={"help": "Adam learning rate"})
    c_reg: float = field(default=1e-4, metadata={"help": "L2 weight regularisation (the paper's c)"})
    network: str = field(default="mlp", metadata={
        "help": "mlp (any encode) or conv (board planes [C, N, N]; hidden = channels)"})
    hidden: int = field(default=128, metadata={"help": "hidden width (mlp) or channels (conv)"})
    blocks: int = field(default=2, metadata={"help": "residual blocks"})
    table_entries: int = field(default=1_000_000, metadata={
        "help": "states memoised by the search's rule table before it starts afresh"})
    augment: bool = field(default=True, metadata={
        "help": "train on a random board symmetry per minibatch (games with symmetry_actions)"})
    bank_size: int = field(default=12, metadata={"help": "frozen past networks kept as opponents"})
    bank_every: int = field(default=2, metadata={"help": "rounds between additions to the bank"})
    bank_fraction: float = field(default=0.2, metadata={"help": "self-play games against a bank member"})
    gate: bool = field(default=False, metadata={"help": "keep a new network only if it beats the best one"})
    gate_threshold: float = field(default=0.55, metadata={"help": "score the new network needs to pass the gate"})
    gate_games: int = field(default=40, metadata={"help": "games of the gate match"})
    eval_every: int = field(default=1, metadata={"help": "rounds between evaluations"})
    eval_games: int = field(default=40, metadata={"help": "games per evaluation opponent and budget"})
    eval_budgets: list[int] = field(default_factory=lambda: [0, 16, 32, 64], metadata={
        "help": "search budgets evaluated (0 = the raw network)"})
    winrate_games: int = field(default=20, metadata={"help": "games against each earlier checkpoint (win-rate matrix)"})
    keep_checkpoints: int = field(default=2, metadata={"help": "checkpoints kept on disk"})
    torch_threads: int = field(default=1, metadata={"help": "torch CPU threads"})
    progress: bool = field(default=True, metadata={"help": "show progress bars"})

    def validate(self) -> None:
        try:
            args = json.loads(self.game_args)
        except json.JSONDecodeError as e:
            raise ConfigError(f"game_args must be a JSON object: {e}") from None
        if not isinstance(args, dict):
            raise ConfigError("game_args must be a JSON object, e.g. '{\"start\": 15}'")
        positive(self, "iterations", "games_per_iteration", "train_steps", "batch_size", "bank_size",
                 "bank_every", "eval_every", "replay_window", "hidden", "torch_threads")
        non_negative(self, "learning_rate", "c_reg", "blocks", "eval_games", "gate_games", "winrate_games")
        for name in ("bank_fraction", "gate_threshold", "score_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.network not in ("mlp", "conv"):
            raise ConfigError(f"network must be mlp or conv, got {self.network!r}")
        if self.max_minutes < 0:
            raise ConfigError(f"max_minutes must be >= 0, got {self.max_minutes}")
        if self.score_scale <= 0:
            raise ConfigError(f"score_scale must be > 0, got {self.score_scale}")
        if any(b < 0 for b in self.eval_budgets):
            raise ConfigError(f"eval_budgets must be >= 0, got {self.eval_budgets}")


@dataclass(frozen=True)
class AlphaZeroConfigs(Configs):
    """What ``recipes/alphazero.py`` parses: its own arguments, the search's and the run's configs."""

    alphazero: AlphaZeroArgs
    puct: SearchConfig
    run: RunConfig
    checkpoints: PeriodicCheckpoints

    defaults = {"output_dir": "runs/alphazero"}

    def validate(self) -> None:
        """``checkpoint_every`` > 0 (the recipe checkpoints rounds and always its last one)."""
        positive(self.checkpoints, "checkpoint_every")


def fpu(cfg: AlphaZeroArgs) -> float | None:
    """The search's first-play urgency reduction (None: unvisited moves have Q = 0)."""
    return cfg.fpu_reduction if cfg.fpu_reduction >= 0 else None


def selfplay_settings(cfg: AlphaZeroArgs, puct: SearchConfig, alpha: float) -> SelfPlaySettings:
    """Step 1's search and game settings; ``alpha`` = the Dirichlet alpha (given or measured)."""
    return SelfPlaySettings(
        n_sims=puct.n_sims, c_puct=puct.c_puct, dirichlet_eps=puct.dirichlet_eps, dirichlet_alpha=alpha,
        temperature_moves=puct.temperature_moves, reset_fraction=puct.reset_fraction,
        reset_max_plies=puct.reset_max_plies, tree_reuse=cfg.tree_reuse, score_weight=cfg.score_weight,
        score_scale=cfg.score_scale, fpu_reduction=fpu(cfg), prune_root=cfg.prune_root,
        pass_injection=cfg.pass_injection)
