"""AlphaZero from the rules alone: PUCT self-play -> replay window -> train -> evaluate.

    python recipes/alphazero.py --config recipes/configs/alphazero_nim.yaml
    python recipes/alphazero.py --config recipes/configs/alphazero_tictactoe.yaml --iterations 20
    python recipes/alphazero.py --config ... --resume      # continue a killed run

One iteration, in the order of the algorithm box (Silver et al. 2017/2018):

1. self-play: batched PUCT search with root Dirichlet noise (eps, alpha ~ 1 / typical
   number of legal moves), tau = 1 for the first ``temperature_moves`` plies then greedy;
   a fraction of games starts from a random legal reset, a fraction is played against a
   bank of frozen checkpoints (only the learner's moves are stored);
2. store (position, search policy, outcome for the player to move) in a replay window;
3. train on minibatches: (z - v)^2 - pi^T log p + c_reg ||theta||^2;
4. optional gate (AlphaGo Zero): the candidate replaces the self-play network only if it
   scores >= ``gate_threshold`` against it; off by default (AlphaZero);
5. every ``bank_every`` iterations a frozen copy joins the bank (the oldest leaves);
6. evaluate: strength at each search budget vs random and exact players, raw-policy optimal
   move rate, and the win-rate matrix against every earlier checkpoint.

Metrics go to ``output_dir/metrics.jsonl``, TensorBoard and PNG plots; checkpoints are
atomic ``output_dir/checkpoint-<iteration>`` directories holding everything to resume
exactly (networks, optimizer, replay window, bank, history, RNG states).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from lmselfplay.alphazero.adapter import CachedGame, SearchGame
from lmselfplay.alphazero.net_strength import (
    match,
    net_agent,
    optimal_argmax_fraction,
    strength,
    winrate_row,
)
from lmselfplay.alphazero.network import ConvPolicyValueNet, PolicyValueNet, alphazero_loss
from lmselfplay.alphazero.selfplay import Samples, SelfPlaySettings, alpha_for, play_games
from lmselfplay.eval.game_metrics import reference_lines
from lmselfplay.games import make
from lmselfplay.games.base import OPTIMAL_MOVES
from lmselfplay.utils.checkpoint import atomic_dir, prune_checkpoints
from lmselfplay.utils.config import (
    ConfigError,
    non_negative,
    parse_config,
    positive,
    to_dict,
)
from lmselfplay.utils.curves import heatmap
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import PeriodicCheckpoints, Run, RunConfig


@dataclass
class AlphaZeroConfig(RunConfig, PeriodicCheckpoints):
    game: str = field(default="nim", metadata={"help": "registered game name"})
    game_args: str = field(default="{}", metadata={"help": "JSON dict of game parameters"})
    seed: int = field(default=0, metadata={"help": "seed of self-play, search noise and training"})
    iterations: int = field(default=10, metadata={"help": "rounds of self-play + training"})
    max_minutes: float = field(default=0.0, metadata={
        "help": "stop after the round in which this process's wall time passes this many "
                "minutes (evaluated and saved); 0 = run all iterations"})
    games_per_iteration: int = field(default=128, metadata={"help": "self-play games per round (played as one batch)"})
    n_sims: int = field(default=32, metadata={"help": "PUCT simulations per move"})
    c_puct: float = field(default=1.5, metadata={"help": "PUCT exploration constant"})
    prune_root: bool = field(default=False, metadata={
        "help": "self-play roots search only the game's selfplay_actions (Go: no pass while "
                "behind on the board unless the opponent just passed)"})
    pass_injection: float = field(default=0.0, metadata={
        "help": "probability that a self-play move is replaced by a pass (games with a pass; never a "
                "game-ending one): shows the network opponents that pass on an unsettled board"})
    fpu_reduction: float = field(default=-1.0, metadata={
        "help": "first-play urgency: an unvisited move is worth the node's mean Q minus this "
                "(Leela Zero); < 0 = Q 0, the reference rule"})
    dirichlet_eps: float = field(default=0.25, metadata={"help": "weight of the Dirichlet noise on the root prior"})
    dirichlet_alpha: float = field(default=0.0, metadata={"help": "0 = 10 / mean legal moves"})
    temperature_moves: int = field(default=4, metadata={"help": "moves sampled from the visit counts before play turns greedy"})
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
    reset_fraction: float = field(default=0.25, metadata={"help": "games started from a random legal position"})
    reset_max_plies: int = field(default=4, metadata={"help": "random moves at most before a reset game starts"})
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

    run_name = "alphazero"  # output_dir defaults to runs/alphazero

    def validate(self) -> None:
        try:
            args = json.loads(self.game_args)
        except json.JSONDecodeError as e:
            raise ConfigError(f"game_args must be a JSON object: {e}") from None
        if not isinstance(args, dict):
            raise ConfigError("game_args must be a JSON object, e.g. '{\"start\": 15}'")
        positive(self, "iterations", "games_per_iteration", "n_sims", "train_steps", "batch_size", "bank_size",
                 "bank_every", "eval_every", "checkpoint_every", "replay_window", "hidden", "torch_threads")
        non_negative(self, "learning_rate", "c_reg", "blocks", "eval_games", "gate_games", "winrate_games")
        for name in ("dirichlet_eps", "reset_fraction", "bank_fraction", "gate_threshold",
                     "score_weight"):
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


def fpu(cfg: AlphaZeroConfig) -> float | None:
    """The search's first-play urgency reduction (None: unvisited moves have Q = 0)."""
    return cfg.fpu_reduction if cfg.fpu_reduction >= 0 else None


def build(cfg: AlphaZeroConfig) -> tuple[Any, Any, PolicyValueNet]:
    game = make(cfg.game, **json.loads(cfg.game_args))
    if not hasattr(game, "encode"):
        raise ConfigError(f"game {cfg.game!r} has no encode(state): AlphaZero needs one")
    if cfg.prune_root and not hasattr(game, "selfplay_actions"):
        raise ConfigError(f"prune_root needs {cfg.game!r} to have selfplay_actions(state)")
    if cfg.score_weight > 0 and not hasattr(game, "score_margins"):
        raise ConfigError(f"score_weight needs final score margins; {cfg.game!r} has no "
                          "score_margins(state)")
    face = CachedGame(SearchGame(game), max_entries=cfg.table_entries)
    x = face.encode(face.position(game.new_initial_state()))
    if cfg.network == "conv":
        if np.ndim(x) != 3:
            raise ConfigError(f"network conv needs board planes [C, N, N], {cfg.game} encodes "
                              f"{np.shape(x)}")
        return game, face, ConvPolicyValueNet(np.shape(x), face.n_actions, cfg.hidden, cfg.blocks)
    net = PolicyValueNet(int(np.prod(x.shape)), face.n_actions, cfg.hidden, cfg.blocks)
    return game, face, net


def frozen(net: PolicyValueNet, state: dict[str, torch.Tensor]) -> PolicyValueNet:
    other = copy.deepcopy(net)
    other.load_state_dict(state)
    return other.eval()


def snapshot(net: PolicyValueNet) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def symmetry(game: Any, batch: tuple[np.ndarray, ...], k: int) -> tuple[np.ndarray, ...]:
    """Board symmetry k of (planes, legal, pi, z): planes turn, action columns permute."""
    x, legal, pi, z = batch
    perm = game.symmetry_actions(k)
    moved_legal, moved_pi = np.empty_like(legal), np.empty_like(pi)
    moved_legal[:, perm], moved_pi[:, perm] = legal, pi
    return game.transform_planes(x, k), moved_legal, moved_pi, z


def train(net: PolicyValueNet, opt: torch.optim.Optimizer, data: Samples, cfg: AlphaZeroConfig,
          np_rng: np.random.Generator, game: Any = None) -> dict[str, float]:
    net.train()
    augment = cfg.augment and hasattr(game, "symmetry_actions")
    totals: dict[str, float] = {}
    for _ in tqdm(range(cfg.train_steps), desc="train", leave=False, disable=not cfg.progress):
        idx = np_rng.integers(0, len(data), size=cfg.batch_size)
        batch = (data.x[idx], data.legal[idx], data.pi[idx], data.z[idx])
        if augment:
            batch = symmetry(game, batch, int(np_rng.integers(8)))
        x, legal, pi, z = (torch.from_numpy(np.ascontiguousarray(b)) for b in batch)
        loss, parts = alphazero_loss(net, x, legal, pi, z, cfg.c_reg)
        opt.zero_grad()
        loss.backward()
        opt.step()
        for k, v in parts.items():
            totals[k] = totals.get(k, 0.0) + v / cfg.train_steps
    net.eval()
    return {f"train/{k}": v for k, v in totals.items()}


def save(cfg: AlphaZeroConfig, it: int, state: dict[str, Any]) -> None:
    with atomic_dir(Path(cfg.output_dir) / f"checkpoint-{it}") as tmp:
        torch.save(state, tmp / "state.pt")
        (tmp / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
    prune_checkpoints(cfg.output_dir, cfg.keep_checkpoints)


def plot_matrix(rows: list[list[float]], path: Path) -> None:
    n = len(rows)
    m = np.full((n, n), np.nan)
    for i, row in enumerate(rows):
        m[i, : len(row)] = row
    names = [str(i) for i in range(n)]
    heatmap(m, names, names, path, "raw-policy score vs every earlier checkpoint", xlabel="earlier checkpoint",
            ylabel="checkpoint", colour_label="score share", annotate=n <= 12)  # digits fit up to 12 cells


@dataclass
class Progress:
    """What a checkpoint holds besides the network and its optimizer."""

    rng: random.Random
    np_rng: np.random.Generator
    best: dict[str, torch.Tensor]  # the self-play network when gating
    replay: list[Samples] = field(default_factory=list)
    bank: list[dict[str, torch.Tensor]] = field(default_factory=list)
    history: list[dict[str, torch.Tensor]] = field(default_factory=list)  # every evaluated checkpoint
    matrix: list[list[float]] = field(default_factory=list)


def restore(run: Run, cfg: AlphaZeroConfig, net: Any, opt: Any, p: Progress) -> int:
    """--resume: network, optimizer, replay, bank, matrix and RNGs from ``run.checkpoint``
    (the game and network shape must match); the iteration to go on from."""
    if run.checkpoint is None:
        return 1
    st = torch.load(run.checkpoint / "state.pt", weights_only=False)
    saved = st["config"]
    changed = [f"{k}={saved.get(k)!r}" for k in ("game", "game_args", "hidden", "blocks")
               if saved.get(k) != getattr(cfg, k)]
    if saved.get("network", "mlp") != cfg.network:
        changed.append(f"network={saved.get('network', 'mlp')!r}")
    if changed:
        raise ConfigError(f"--resume: {run.checkpoint} was trained with {', '.join(changed)}; "
                          "use the same values or another output_dir")
    net.load_state_dict(st["net"])
    opt.load_state_dict(st["opt"])
    p.replay = [Samples(**r) for r in st["replay"]]
    p.bank, p.history, p.matrix, p.best = st["bank"], st["history"], st["matrix"], st["best"]
    p.rng.setstate(st["rng"])
    p.np_rng.bit_generator.state = st["np_rng"]
    torch.set_rng_state(st["torch_rng"])
    return st["iteration"] + 1


def checkpoint_state(cfg: AlphaZeroConfig, it: int, net: Any, opt: Any, p: Progress) -> dict[str, Any]:
    return {"iteration": it, "net": net.state_dict(), "opt": opt.state_dict(),
            "replay": [dataclasses.asdict(r) for r in p.replay], "bank": p.bank,
            "history": p.history, "matrix": p.matrix, "best": p.best,
            "rng": p.rng.getstate(), "np_rng": p.np_rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(), "config": to_dict(cfg)}


def gate(cfg: AlphaZeroConfig, face: Any, net: Any, p: Progress, it: int) -> dict[str, float]:
    """Keep the new network as the self-play one (with ``gate``: only if it beats the best)."""
    if not cfg.gate:
        p.best = snapshot(net)
        return {}
    r = match(face, net_agent(face, net, cfg.n_sims, cfg.c_puct, fpu(cfg)),
              net_agent(face, frozen(net, p.best), cfg.n_sims, cfg.c_puct, fpu(cfg)),
              cfg.gate_games, seed=it, opening_plies=2)
    if r["all"] >= cfg.gate_threshold:
        p.best = snapshot(net)
    return {"gate/score": r["all"]}


def evaluate_strength(cfg: AlphaZeroConfig, face: Any, net: Any, p: Progress, it: int, exact: bool) -> dict:
    """Strength per search budget (and optimal-move rates where the solver labels moves),
    and the win rates against every earlier evaluated network (a row of the matrix)."""
    metrics = strength(face, net, cfg.eval_budgets, cfg.eval_games, seed=it, c_puct=cfg.c_puct, exact=exact,
                       fpu_reduction=fpu(cfg))
    if exact:
        metrics.update(optimal_argmax_fraction(face, net))
    row = winrate_row(face, net, [frozen(net, s) for s in p.history], cfg.winrate_games, seed=it)
    p.matrix.append(row)
    p.history.append(snapshot(net))
    if row:
        metrics["eval/winrate_vs_past_mean"] = float(np.mean(row))
        metrics["eval/winrate_vs_previous"] = row[-1]
    return metrics


def plot_run(cfg: AlphaZeroConfig, run: Run, p: Progress) -> None:
    logger = run.logger
    keys = sorted({k for r in logger.rows() for k in r if k.startswith(("eval/sims", "train/"))
                   and not k.endswith("_losses")})
    logger.plot(keys, "curves.png", title=f"AlphaZero on {cfg.game}")
    optimal = reference_lines(make(cfg.game, **json.loads(cfg.game_args))).get("greedy_optimal_rate", [])
    logger.plot(["eval/raw_optimal_fraction", "eval/raw_optimal_fraction_winning",
                 "eval/winrate_vs_past_mean"], "progress.png", title=f"AlphaZero on {cfg.game}: the raw network",
                references={"eval/raw_optimal_fraction": optimal, "eval/raw_optimal_fraction_winning": optimal})
    if p.matrix:
        plot_matrix(p.matrix, run.out / "winrate_matrix.png")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse_config(AlphaZeroConfig, argv)
    torch.set_num_threads(cfg.torch_threads)
    with Run(cfg, trains_with="state") as run:
        torch.manual_seed(cfg.seed)
        game, face, net = build(cfg)
        exact = game.exact_metric == OPTIMAL_MOVES  # the solver labels every move: exact opponent and rates
        opt = torch.optim.Adam(net.parameters(), lr=cfg.learning_rate)
        alpha = cfg.dirichlet_alpha or alpha_for(face, game, seed=cfg.seed)
        settings = SelfPlaySettings(
            n_sims=cfg.n_sims, c_puct=cfg.c_puct, dirichlet_eps=cfg.dirichlet_eps, dirichlet_alpha=alpha,
            temperature_moves=cfg.temperature_moves, reset_fraction=cfg.reset_fraction,
            reset_max_plies=cfg.reset_max_plies, tree_reuse=cfg.tree_reuse, score_weight=cfg.score_weight,
            score_scale=cfg.score_scale, fpu_reduction=fpu(cfg), prune_root=cfg.prune_root,
            pass_injection=cfg.pass_injection)
        p = Progress(random.Random(cfg.seed), np.random.default_rng(cfg.seed), snapshot(net))
        start = restore(run, cfg, net, opt, p)
        run.report_start(start, "iteration")
        run.open_log(start - 1 if run.checkpoint is not None else None)
        metrics: dict[str, Any] = {}
        started = time.time()
        for it in tqdm(range(start, cfg.iterations + 1), desc="alphazero", disable=not cfg.progress,
                       initial=start - 1, total=cfg.iterations):
            t0 = time.time()
            player = frozen(net, p.best) if cfg.gate else net
            opponents = [frozen(net, s) for s in p.bank]
            samples, metrics = play_games(face, player, cfg.games_per_iteration, settings, p.rng,
                                          opponents, cfg.bank_fraction)
            p.replay = (p.replay + [samples])[-cfg.replay_window:]
            metrics.update(train(net, opt, Samples.concat(p.replay), cfg, p.np_rng, game))
            metrics.update(gate(cfg, face, net, p, it))
            if it % cfg.bank_every == 0:
                p.bank = (p.bank + [snapshot(net)])[-cfg.bank_size:]
            metrics["bank/size"] = len(p.bank)
            out_of_time = cfg.max_minutes > 0 and time.time() - started >= 60 * cfg.max_minutes
            last = it == cfg.iterations or out_of_time
            if it % cfg.eval_every == 0 or last:
                metrics.update(evaluate_strength(cfg, face, net, p, it, exact))
            metrics["time/iteration_s"] = time.time() - t0
            run.log(it, metrics)
            if run.checkpoint_due(it, last):
                save(cfg, it, checkpoint_state(cfg, it, net, opt, p))
            if out_of_time:
                print(f"max_minutes={cfg.max_minutes:g} reached after iteration {it}", file=sys.stderr)
                break
        plot_run(cfg, run, p)
    return metrics


if __name__ == "__main__":
    sys.exit(run_main(main))
