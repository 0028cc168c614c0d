"""AlphaZero for the language model: PUCT self-play with the LLM as the network, distilled back.

    python recipes/search_selfplay.py --config recipes/configs/search_selfplay_nim.yaml
    python recipes/search_selfplay.py --config recipes/configs/search_selfplay_tictactoe.yaml
    python recipes/search_selfplay.py --config ... --resume      # continue a killed run

The ratchet (AlphaGo Zero -> MuZero): network -> PUCT search -> better policy / value
targets -> distillation -> stronger network; here the LLM IS the network. Its prior is the
next-token distribution over the legal move tokens after ``<move>`` (one forward of prompt
+ ``<move>``; teacher-forced answer scores for tokenizers that split move names), its value
a small head on the hidden state at the end of the prompt
(:class:`lmselfplay.lm.search_eval.LLMEvaluator`). One iteration, in order:

1. opponents : per game, 40% mirror play (the learner on both seats), 40% a recent frozen
               league snapshot, 20% a hall-of-fame snapshot (the first snapshot, the initial
               policy, is permanent); frozen seats search with their own weights and never
               give labels;
2. self-play : batched PUCT (``n_sims`` per move, one LLM batch per simulation wave, states
               cached within a weights version), Dirichlet root noise, tau = 1 for the first
               ``temperature_moves`` plies then the most visited move; a fraction of games
               starts from a random legal reset;
3. replay    : only the learner's searched turns (prompt, visit distribution pi, z = final
               result for the mover) enter a window of the last ``replay_window`` iterations;
4. distill   : ``distill_steps`` trainer steps on minibatches from the window: cross-entropy
               from pi to the LLM's move-token distribution (over the whole vocabulary, so
               illegal answers are pushed down, not renormalized away) + KL to the initial
               policy on the answer tokens (``beta``, the trainer's collapse guard);
5. value     : ``value_steps`` Adam steps of (z - v)^2 for the value head on the LLM's
               (frozen) hidden state at the end of the prompt; with ``q_head`` instead a Q
               head (a bounded Q per move; the search's value is V(s) = sum_a pi(a|s) Q(s, a))
               learns the blended target c(a) Q_PUCT(a) + (1 - c(a)) Q_prior(a),
               c(a) = N(a) / (N(a) + q_lambda), plus (z - V)^2
               (:func:`lmselfplay.alphazero.llm_selfplay.blended_q_target`, ``q_loss``);
6. league    : every ``league_add_every`` iterations the learner joins the ring of frozen
               snapshots; every ``league_promote_every``-th one also the hall of fame;
7. evaluate  : every ``eval_every`` iterations, deterministic (no noise): at budget 0 the
               raw LLM (greedy answer; illegal = loss) and the exact metrics the game
               declares (``eval/game_metrics.policy_metrics``); at budgets 16/32/64 the search
               agent from fixed openings vs a random player and vs the exact solver
               (win / draw / loss, 95% Wilson intervals);
8. checkpoint: atomic, with model, value head, optimizer, scheduler, replay, league, RNG.

Game-agnostic: any perfect-information game with a search face works (Nim, tic-tac-toe;
Go 9x9 without edits here). Games with hidden information or chance (Kuhn poker) are out
of scope: PUCT searches perfect-information trees only.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from lmselfplay.alphazero.adapter import CachedGame, SearchGame
from lmselfplay.alphazero.llm_selfplay import (
    LEARNER,
    Record,
    collect,
    distill_samples,
    plan_games,
    play_match,
    q_loss,
    search_agent,
)
from lmselfplay.alphazero.net_strength import exact_agent, random_agent
from lmselfplay.alphazero.selfplay import alpha_for
from lmselfplay.eval import game_metrics
from lmselfplay.games import make
from lmselfplay.games.base import OPTIMAL_MOVES, random_legal_reset
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm import readout as policy_readout
from lmselfplay.lm.engines import HFEngine, SamplingParams
from lmselfplay.lm.prompt import thinks
from lmselfplay.lm.search_eval import LLMEvaluator, QHead, ValueHead, hidden_size
from lmselfplay.models.policy import PolicyConfig, frozen_policy, load_policy, policy_weights
from lmselfplay.rl.league import League, LeagueConfig
from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig
from lmselfplay.utils.config import ConfigError, non_negative, parse_config, positive
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import PeriodicCheckpoints, Run, RunConfig

HEAD_PREFIX = "head."  # the value / Q head's entries in a league snapshot


@dataclass
class SearchSelfPlayConfig(TrainerConfig, LeagueConfig, PolicyConfig, RunConfig, PeriodicCheckpoints):
    game: str = field(default="nim", metadata={"help": "registered game name (perfect information)"})
    game_args: str = field(default="{}", metadata={"help": "JSON dict of game parameters"})
    iterations: int = field(default=10, metadata={"help": "rounds of searched self-play + distillation"})
    games_per_iteration: int = field(default=64, metadata={"help": "self-play games per round"})
    n_sims: int = field(default=32, metadata={"help": "PUCT simulations per move"})
    c_puct: float = field(default=1.5, metadata={"help": "PUCT exploration constant"})
    dirichlet_eps: float = field(default=0.25, metadata={"help": "weight of the Dirichlet noise on the root prior"})
    dirichlet_alpha: float = field(default=0.0, metadata={"help": "0 = 10 / mean legal moves"})
    temperature_moves: int = field(default=4, metadata={"help": "moves sampled from the visits before play turns greedy"})
    target_tau: float = field(default=1.0, metadata={"help": "temperature of the visit distribution distilled"})
    reset_fraction: float = field(default=0.25, metadata={"help": "games started from a random legal position"})
    reset_max_plies: int = field(default=4, metadata={"help": "random moves at most before a reset game starts"})
    replay_window: int = field(default=4, metadata={"help": "iterations of self-play kept"})
    distill_steps: int = field(default=20, metadata={"help": "trainer steps per iteration"})
    batch_size: int = field(default=128, metadata={"help": "distillation samples per trainer step"})
    value_steps: int = field(default=50, metadata={"help": "value-head optimizer steps per round"})
    value_lr: float = field(default=1e-3, metadata={"help": "value-head learning rate"})
    value_width: int = field(default=64, metadata={"help": "value-head (or Q-head) hidden width"})
    q_head: bool = field(default=False, metadata={
        "help": "a Q head (bounded Q per move, V = sum_a pi(a|s) Q(s, a)) instead of the value head"})
    q_lambda: float = field(default=4.0, metadata={
        "help": "lambda_Q: Q target = c Q_search + (1 - c) Q_prior with c = N / (N + lambda_Q)"})
    eval_every: int = field(default=2, metadata={"help": "iterations between evaluations (0: never)"})
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
    max_staleness: int = field(default=0, metadata={
        "help": "must be 0: search self-play has no rollouts to overlap or drop (see validate)"})
    # recipe defaults (the trainer's and league's own defaults suit policy-gradient runs)
    learning_rate: float = 1e-3
    beta: float = 0.01
    num_iterations: int = 1
    merge_identical: bool = False
    max_steps: int = 1000
    mirror_fraction: float = 0.4
    recent_fraction: float = 0.4
    hall_of_fame_fraction: float = 0.2
    bot_fraction: float = 0.0
    league_add_every: int = 2
    league_promote_every: int = 4
    league_capacity: int = 6

    run_name = "search_selfplay"  # output_dir defaults to runs/search_selfplay

    def validate(self) -> None:
        positive(self, "iterations", "games_per_iteration", "n_sims", "replay_window", "batch_size", "checkpoint_every",
                 "max_new_tokens", "value_width", "eval_batch", "q_lambda", "target_tau")
        non_negative(self, "distill_steps", "value_steps", "value_lr", "eval_every", "eval_games", "eval_positions",
                     "eval_openings", "opening_plies")
        if any(b < 0 for b in self.eval_budgets):
            raise ConfigError(f"eval_budgets must be >= 0, got {self.eval_budgets}")
        if self.enable_thinking:
            raise ConfigError("search self-play reads the LLM's prior right after <move> (no think block): "
                              "enable_thinking must be false")
        if self.max_staleness != 0:
            raise ConfigError(f"max_staleness must be 0 for search self-play (got {self.max_staleness}): its games are "
                              "played by PUCT on the trainer's own forward passes and value head (no engine holds "
                              "their weights), and it trains on search targets from a window of the last "
                              "replay_window iterations, off-policy by design, which replay_window already bounds")
        if self.bot_fraction > 0:
            raise ConfigError("bot_fraction must be 0: a bot gives no search to distil")
        try:
            if not isinstance(json.loads(self.game_args), dict):
                raise ValueError("not an object")
        except ValueError as e:
            raise ConfigError(f"game_args must be a JSON object: {e}") from None


# --- pieces the loop names -------------------------------------------------------------

def make_head(cfg: SearchSelfPlayConfig, model: Any, game: Any) -> ValueHead | QHead:
    """The value head, or with ``q_head`` the Q head, sized for ``model`` and ``game``."""
    if cfg.q_head:
        return QHead(hidden_size(model), game.n_actions, cfg.value_width)
    return ValueHead(hidden_size(model), cfg.value_width)


def snapshot(trainer: PolicyTrainer, head: ValueHead | QHead) -> dict[str, torch.Tensor]:
    """The learner's policy weights (adapters only under LoRA) + its head, on CPU."""
    out = policy_weights(trainer.unwrapped)
    out.update({HEAD_PREFIX + k: v.detach().clone() for k, v in head.state_dict().items()})
    return out


def snapshot_engines(template: Any, tok: Any, game: Any, cfg: SearchSelfPlayConfig):
    """The league's engine factory: ``frozen_evaluator(weights, version)``, a frozen LLM evaluator."""

    def frozen_evaluator(weights: dict[str, torch.Tensor], version: int) -> LLMEvaluator:
        head = make_head(cfg, template, game)
        head.load_state_dict({k[len(HEAD_PREFIX):]: v for k, v in weights.items() if k.startswith(HEAD_PREFIX)})
        model = frozen_policy(template, {k: v for k, v in weights.items() if not k.startswith(HEAD_PREFIX)})
        return LLMEvaluator(model, tok, game, head.eval(), cfg.eval_batch)

    return frozen_evaluator


def train_head(head: ValueHead | QHead, opt: torch.optim.Optimizer, evaluator: LLMEvaluator,
               replay: list[Record], cfg: SearchSelfPlayConfig, rng: random.Random) -> dict[str, float]:
    """``value_steps`` steps on minibatches of the window: (z - v)^2 for the value head, or
    :func:`~lmselfplay.alphazero.llm_selfplay.q_loss` for the Q head. The LLM is frozen here, so
    each distinct prompt's hidden state (and its prior over the move tokens) is computed
    once and reused by every step."""
    index: dict[tuple[int, ...], int] = {}
    for r in replay:
        index.setdefault(tuple(r.prompt_ids), len(index))
    prompts = list(index)
    with torch.no_grad():
        parts = [evaluator.forward([list(p) for p in prompts[i : i + cfg.eval_batch]])
                 for i in range(0, len(prompts), cfg.eval_batch)]
    hidden = torch.cat([h.float() for _, h in parts])
    prior = torch.cat([torch.softmax(lg, -1)[:, evaluator.tokens] for lg, _ in parts]) if cfg.q_head else None
    losses = []
    for _ in range(cfg.value_steps):
        batch = rng.sample(replay, min(cfg.batch_size, len(replay)))
        rows = torch.tensor([index[tuple(r.prompt_ids)] for r in batch])
        z = torch.tensor([r.z for r in batch])
        if cfg.q_head:
            legal = torch.zeros(len(batch), head.n_actions)
            for i, r in enumerate(batch):
                legal[i, r.legal] = 1.0
            target = torch.tensor([r.q_target for r in batch], dtype=torch.float)
            loss = q_loss(head(hidden[rows]), prior[rows], legal, target, z)
        else:
            loss = ((head(hidden[rows]) - z) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {f"train/{'q' if cfg.q_head else 'value'}_loss": float(np.mean(losses))} if losses else {}


def distill(trainer: PolicyTrainer, replay: list[Record], tok: Any, game: Any, tokens: list[int],
            cfg: SearchSelfPlayConfig, rng: random.Random) -> dict[str, float]:
    stats: dict[str, list[float]] = {}
    for _ in range(cfg.distill_steps):
        batch = rng.sample(replay, min(cfg.batch_size, len(replay)))
        for k, v in trainer.step(distill_samples(batch, tok, game, tokens, trainer.step_count)).items():
            stats.setdefault(k, []).append(v)
    return {f"train/{k}": float(np.mean(v)) for k, v in stats.items()}


def openings(face: Any, cfg: SearchSelfPlayConfig) -> list[Any]:
    """Fixed evaluation starts: the initial position and random legal openings (seeded)."""
    rng = random.Random(f"{cfg.seed}/openings")
    starts = [face.game.new_initial_state()]
    starts += [random_legal_reset(face.game, rng, cfg.opening_plies) for _ in range(cfg.eval_openings - 1)]
    return [face.position(s) for s in starts]


def strength_per_budget(face: Any, evaluator: LLMEvaluator, model: Any, tok: Any, cfg: SearchSelfPlayConfig,
                        it: int) -> dict[str, float]:
    """Step 7: budget 0 = the raw LLM (exact metrics + greedy games vs the game's reference
    bots), then every budget from the fixed openings vs random and (if solvable) exact."""
    game = face.game
    out: dict[str, float] = {}
    greedy = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=0.0, stop=MOVE_STOP, seed=cfg.seed)
    positions = None
    if game.exact_metric == OPTIMAL_MOVES and cfg.eval_positions > 0:
        positions = policy_readout.sampled_decision_states(game, cfg.eval_positions, f"{cfg.seed}/positions")
    raw = game_metrics.policy_metrics(HFEngine(model, tok), tok, game, positions, n_games=cfg.eval_games,
                                sampling=greedy, seed=cfg.seed, max_new_tokens=cfg.max_new_tokens)
    out.update({f"eval/raw_{k}": v for k, v in raw.items()})
    if game.exact_metric == OPTIMAL_MOVES:
        out["eval/raw_illegal_mass"] = illegal_mass(evaluator, face)
    starts = openings(face, cfg)
    opponents = {"random": random_agent(face, cfg.seed)}
    if game.exact_metric == OPTIMAL_MOVES:
        opponents["exact"] = exact_agent(face, cfg.seed)
    for k in cfg.eval_budgets:
        me = search_agent(face, evaluator, k, cfg.c_puct)
        for name, opp in opponents.items():
            r = play_match(face, me, opp, starts)
            out[f"eval/sims{k}_vs_{name}_win"], out[f"eval/sims{k}_vs_{name}_loss"] = r["win"], r["loss"]
            out[f"eval/sims{k}_vs_{name}_draw"] = r["draw"]
            out[f"eval/sims{k}_vs_{name}_loss_ci_high"] = r["loss_ci"][1]
    return out


def illegal_mass(evaluator: LLMEvaluator, face: Any) -> float:
    """Mean probability of a token that is not a legal move, after ``<move>``, over all positions."""
    states = policy_readout.decision_states(face.game)
    total = 0.0
    for i in range(0, len(states), evaluator.batch_size):
        part = states[i : i + evaluator.batch_size]
        logits, _ = evaluator.forward([evaluator.prompt_ids(s) for s in part])
        p = torch.softmax(logits, -1)
        for row, s in enumerate(part):
            legal = [evaluator.tokens[a] for a in face.game.legal_actions(s)]
            total += 1.0 - float(p[row, legal].sum())
    return total / max(1, len(states))




@dataclass
class SearchSelfPlay:
    """What the loop works on, built once by :func:`build` (a resume then restores it)."""

    game: Any
    face: CachedGame
    tok: Any
    trainer: PolicyTrainer
    head: ValueHead | QHead
    head_opt: torch.optim.Optimizer
    evaluator: LLMEvaluator
    league: League
    rng: random.Random
    np_rng: np.random.Generator
    replay: list[list[Record]]


def build(cfg: SearchSelfPlayConfig, run: Run) -> SearchSelfPlay:
    """The game, the policy, its trainer, value head, evaluator and league, fresh."""
    game = make(cfg.game, **json.loads(cfg.game_args))
    face = CachedGame(SearchGame(game))
    model, tok = load_policy(cfg)
    if thinks(tok):  # a template that thinks by default (Qwen3), which the config alone cannot tell
        raise ConfigError("search self-play reads the LLM's prior right after <move> (no think block), but this "
                          "policy's chat template opens one: set enable_thinking: false")
    trainer = PolicyTrainer(model, tok, cfg, accelerator=run.acc)
    head = make_head(cfg, trainer.unwrapped, game)
    head_opt = torch.optim.Adam(head.parameters(), lr=cfg.value_lr)
    evaluator = LLMEvaluator(trainer.unwrapped, tok, game, head, cfg.eval_batch)
    if evaluator.tokens is None:
        raise ConfigError(f"game {cfg.game!r}: distillation needs every move answer to be one token after <move>")
    league = League(cfg, snapshot_engines(trainer.unwrapped, tok, game, cfg))
    return SearchSelfPlay(game, face, tok, trainer, head, head_opt, evaluator, league,
                          random.Random(cfg.seed), np.random.default_rng(cfg.seed), [])


def restore(run: Run, s: SearchSelfPlay) -> int:
    """--resume: trainer, head, replay, league and RNGs from ``run.checkpoint``; else the
    initial policy joins the league's hall of fame (permanent). The iteration to go on from."""
    if run.checkpoint is None:
        s.league.hall.append(s.league.add(0, snapshot(s.trainer, s.head)))
        return 1
    extra = s.trainer.load_checkpoint(run.checkpoint)
    s.head.load_state_dict(extra["head"])
    s.head_opt.load_state_dict(extra["head_opt"])
    s.replay = [[Record(**r) for r in part] for part in extra["replay"]]
    s.league.load_state_dict(extra["league"])
    s.rng.setstate(extra["rng"])
    s.np_rng.bit_generator.state = extra["np_rng"]
    torch.set_rng_state(extra["torch_rng"])
    return extra["iteration"] + 1


def save(s: SearchSelfPlay, cfg: SearchSelfPlayConfig, it: int) -> None:
    """Step 8: the trainer's atomic checkpoint carries the rest of ``s`` as ``extra`` (what
    :func:`restore` reads back)."""
    extra = {"iteration": it, "head": s.head.state_dict(), "head_opt": s.head_opt.state_dict(),
             "replay": [[asdict(r) for r in part] for part in s.replay], "league": s.league.state_dict(),
             "rng": s.rng.getstate(), "np_rng": s.np_rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
             "config": asdict(cfg)}
    path = s.trainer.save_checkpoint(cfg.output_dir, extra, keep=cfg.keep_checkpoints)
    s.head.save(path / "model")


def opponent_evaluators(s: SearchSelfPlay, games: list[Any]) -> dict[str, LLMEvaluator]:
    """The learner's evaluator and one frozen evaluator per league opponent of this round."""
    evaluators = {LEARNER: s.evaluator}
    for g in games:
        if g.opponent != "mirror" and g.opponent not in evaluators:
            evaluators[g.opponent] = s.league.engine_for(next(x for x in s.league.ring + s.league.hall
                                                              if x.name == g.opponent))
    return evaluators


def plot_run(cfg: SearchSelfPlayConfig, logger: Any) -> None:
    rows = logger.rows()
    keys = sorted({k for r in rows for k in r if k.startswith("eval/sims") and k.endswith(("_win", "_loss"))})
    logger.plot(keys, "budgets.png", title=f"search self-play on {cfg.game}: strength per budget")
    refs = game_metrics.reference_lines(make(cfg.game, **json.loads(cfg.game_args)))  # what the game declares
    references = {f"eval/raw_{m}": refs.get(m, []) for m in ("optimal_move_prob", "greedy_optimal_rate")}
    logger.plot(["eval/raw_optimal_move_prob", "eval/raw_greedy_optimal_rate", "eval/raw_illegal_mass"],
                "raw_policy.png", title="raw LLM (budget 0)", references=references)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse_config(SearchSelfPlayConfig, argv)
    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    with Run(cfg) as run:
        s = build(cfg, run)
        evaluator, face, rng = s.evaluator, s.face, s.rng
        alpha = cfg.dirichlet_alpha or alpha_for(face, s.game, seed=cfg.seed)
        start = restore(run, s)
        run.report_start(start, "iteration")
        run.open_log(start - 1 if run.checkpoint is not None else None)
        t_start, metrics = time.time(), {}
        if start == 1 and cfg.eval_every > 0:  # the starting point of every curve
            run.log(0, {**strength_per_budget(face, evaluator, s.trainer.unwrapped, s.tok, cfg, 0),
                        "time/wall_s": 0.0})
        for it in tqdm(range(start, cfg.iterations + 1), desc="search self-play", disable=not cfg.progress,
                       initial=start - 1, total=cfg.iterations):
            t0, forwards = time.time(), evaluator.forwards
            evaluator.clear()  # new weights since the last search
            # 1. opponents
            games = plan_games(face, cfg.games_per_iteration, rng, lambda r: opponent_name(s.league, r),
                               cfg.reset_fraction, cfg.reset_max_plies)
            # 2. self-play with search
            with tqdm(desc="self-play turns", disable=not cfg.progress, leave=False) as bar:
                records, metrics = collect(face, games, opponent_evaluators(s, games), cfg.n_sims, rng, cfg.c_puct,
                                           cfg.dirichlet_eps, alpha, cfg.temperature_moves, progress=bar,
                                           target_tau=cfg.target_tau, q_lambda=cfg.q_lambda)
            metrics["time/selfplay_s"] = time.time() - t0
            metrics["selfplay/llm_positions"] = float(evaluator.forwards - forwards)  # cache misses
            # 3. replay window (learner turns only)
            s.replay = (s.replay + [records])[-cfg.replay_window:]
            window = [r for part in s.replay for r in part]
            # 4. distill the search into the policy; 5. the value head
            t1 = time.time()
            if window:
                metrics.update(distill(s.trainer, window, s.tok, s.game, evaluator.tokens, cfg, rng))
                evaluator.clear()
                metrics.update(train_head(s.head, s.head_opt, evaluator, window, cfg, rng))
            metrics["time/train_s"] = time.time() - t1
            evaluator.clear()
            # 6. league
            if s.league.due(it):
                s.league.add(it, snapshot(s.trainer, s.head))
            # 7. evaluate
            if cfg.eval_every > 0 and (it % cfg.eval_every == 0 or it == cfg.iterations):
                metrics.update(strength_per_budget(face, evaluator, s.trainer.unwrapped, s.tok, cfg, it))
            metrics["time/iteration_s"] = time.time() - t0
            metrics["time/wall_s"] = time.time() - t_start
            run.log(it, metrics)
            # 8. checkpoint
            if run.checkpoint_due(it, last=it == cfg.iterations):
                save(s, cfg, it)
        plot_run(cfg, run.logger)
    return metrics


def opponent_name(league: League, rng: random.Random) -> str:
    kind, snap = league.sample_opponent(rng)
    return "mirror" if snap is None else snap.name


if __name__ == "__main__":
    sys.exit(run_main(main))
