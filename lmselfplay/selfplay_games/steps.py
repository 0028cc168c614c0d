"""The steps of self-play on text games with the rules as the referee (SPIRAL-style), the
algorithm of ``recipes/selfplay_games.py``, whose docstring is its box (steps 1-10).

What the loop works on is one :class:`SelfPlay` (made by :func:`make_selfplay`, restored by
:func:`load_state`, saved by :func:`save_checkpoint`); the steps are functions of it:

* steps 1-2, who plays whom from where: :func:`episode_games` (each episode's game),
  :func:`make_episodes` (opponents and starts, seeded by seed, step and rank), :func:`episode_plan`;
* step 5, advantages: :func:`turn_advantages` (role or observation baselines),
  :func:`shaped_advantages` (SPAG's shaping, the illegal-answer penalty), :func:`training_samples` (both);
* step 7, the league: :func:`snapshot_engines` (its engine factory), :func:`snapshot_score`
  (a new snapshot's play-in games);
* exact feedback (``feedback: exact``): :func:`make_feedback`, :func:`exact_feedback_step`;
* the average policy (``average_policy``): :func:`make_averages`, :func:`fold_averages`,
  :func:`average_metrics`, :func:`distill_averages`;
* the step's log row: :func:`step_row`.

Its configs are :mod:`lmselfplay.selfplay_games.config`, its evaluation (step 8 and the end of
the run) :mod:`lmselfplay.selfplay_games.metrics`: the steps never import evaluation.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from lmselfplay.games import split_names
from lmselfplay.games.base import has_enumerable_actions, random_legal_reset
from lmselfplay.games.bots import league_bot
from lmselfplay.games.gtp import find_gnugo, plays_gtp
from lmselfplay.games.model_texts import make_game_for
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm import readout as policy_readout
from lmselfplay.lm.engines import (
    HFEngine,
    make_engine,
)
from lmselfplay.lm.prompt import thinks
from lmselfplay.lm.rollout import Episode, LLMPlayer, RolloutStats, play_episodes
from lmselfplay.models.policy import frozen_policy, load_policy, resolve_model_path
from lmselfplay.rl.advantages import RoleBaselines, observation_key
from lmselfplay.rl.average_policy import AverageConfig, AveragePolicy, averageable, distill_samples
from lmselfplay.rl.exact_feedback import ExactFeedback, FeedbackConfig, exact_feedback_games
from lmselfplay.rl.kl import reference_policy
from lmselfplay.rl.league import League
from lmselfplay.rl.trainer import PolicyTrainer
from lmselfplay.selfplay_games.config import SelfPlayArgs, SelfPlayConfigs, check_thinking
from lmselfplay.utils.config import (
    ConfigError,
    parse_weights,
)


def resolved_readout(args: SelfPlayArgs, tok) -> str:
    """The readout of the exact metrics and the average policy: ``bare``, or ``sampled`` when
    ``readout: auto`` and the policy thinks (its prompt style, on the tokenizer)."""
    return policy_readout.resolve_readout(args.readout, thinks(tok))


def make_games(names: str, model_name_or_path: str | None = None):
    """The games of this run, by registry name, with the texts the policy ``model_name_or_path``
    was built to read (:func:`~lmselfplay.games.model_texts.make_game_for`); a ConfigError names an
    unknown one."""
    model_dir = resolve_model_path(model_name_or_path)
    try:
        return [make_game_for(name, model_dir) for name in split_names(names)]
    except (KeyError, ValueError) as e:
        raise ConfigError(f"games: {e.args[0] if e.args else e}") from None


def episode_games(games, weights: str, n: int):
    """The game of each of a step's ``n`` episodes: counts proportional to the weights
    (largest remainder; every game with weight > 0 gets at least one episode when n allows).
    A registered game that this run does not play may be named (a shared YAML): ignored."""
    from lmselfplay.games import REGISTRY

    w = parse_weights(weights, {g.name: 1.0 for g in games}, "game_weights", ignore=list(REGISTRY))
    total = sum(w.values())
    exact = [n * w[g.name] / total for g in games]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(games)), key=lambda i: counts[i] - exact[i])[: n - sum(counts)]:
        counts[i] += 1
    for i, g in enumerate(games):  # a weighted game never vanishes from a step
        if w[g.name] > 0 and counts[i] == 0 and max(counts) > 1:
            counts[counts.index(max(counts))] -= 1
            counts[i] = 1
    return [g for g, c in zip(games, counts) for _ in range(c)]


def turn_advantages(baseline_key, baselines, trajs):
    """Each learner turn's return minus its baseline (``id(trajectory)`` -> one per turn): the
    role's (game, seat, start) for every turn (``baseline_key`` "role"), or with "observation"
    the baseline of the exact observation the turn answered (the role's until it has one)."""
    if baseline_key == "role":
        roles = baselines.advantages([t.role for t in trajs], [t.reward for t in trajs])
        return {id(t): [float(a)] * len(t.turns) for t, a in zip(trajs, roles)}
    keys = [observation_key(t.role, turn.prompt_ids) for t in trajs for turn in t.turns]
    flat = iter(baselines.advantages(keys, [t.reward for t in trajs for _ in t.turns],
                                     fallback=[t.role for t in trajs for _ in t.turns]))
    baselines.advantages([t.role for t in trajs], [t.reward for t in trajs])  # the fallbacks learn too
    return {id(t): [float(next(flat)) for _ in t.turns] for t in trajs}


def training_samples(args: SelfPlayArgs, finished, baselines):
    """Step 5: the learner's samples, each turn with its advantage (:func:`turn_advantages`,
    then :func:`shaped_advantages`)."""
    trajs = [t for f in finished for t in f.trajectories]
    adv = shaped_advantages(args, finished, turn_advantages(args.baseline_key, baselines, trajs))
    return [s for t in trajs for s in t.samples(adv[id(t)])]


def shaped_advantages(args: SelfPlayArgs, finished, adv):
    """Every learner turn's advantage (``adv``: its seat's return minus its baseline, per
    ``id(trajectory)``), shaped: with ``reward_shaping: spag``, turns of games that define
    ``turn_weights`` get SPAG's weights instead (per game kind, over this step's games, as SPAG
    balances per batch). A turn with no utterance in the final state (an illegal answer) keeps
    the plain advantage, so breaking the rules is still punished; with ``illegal_penalty`` > 0
    every illegal answer's turn gets ``-illegal_penalty`` instead."""
    trajs = [t for f in finished for t in f.trajectories]
    shaped: dict[int, list[float]] = {}
    if args.reward_shaping == "spag":
        kinds: dict[str, list] = {}
        for f in finished:
            if hasattr(f.episode.game, "turn_weights"):
                kinds.setdefault(f.episode.game.name, []).append(f)
        for group in kinds.values():
            weights = group[0].episode.game.turn_weights([f.final_state for f in group], args.shaping_decay)
            for f, w in zip(group, weights):
                for t in f.trajectories:
                    mine = iter(w[t.seat::2])
                    shaped[id(t)] = [a if turn.invalid else next(mine, a) for turn, a in zip(t.turns, adv[id(t)])]
    if args.illegal_penalty > 0:
        for t in trajs:
            per_turn = shaped.get(id(t), adv[id(t)])
            shaped[id(t)] = [-args.illegal_penalty if turn.invalid else a for turn, a in zip(t.turns, per_turn)]
    return {id(t): shaped.get(id(t), adv[id(t)]) for t in trajs}


def make_episodes(cfg, step_games, league, me, tok, step, rank):
    """Step 1-2: who plays whom (``step_games``: each episode's game, from :func:`episode_games`),
    from where. Seeded by (seed, step, rank): resumable."""
    rng = random.Random(f"{cfg.run.seed}/{step}/{rank}")
    episodes = []
    for game in step_games:
        kind, snap = league.sample_opponent(rng)
        if kind == "mirror":
            players = (me, me)
        else:
            opp = league_bot(game) if kind == "bot" else \
                LLMPlayer(league.engine_for(snap), tok, learner=False, name=snap.name)
            players = (me, opp) if rng.random() < 0.5 else (opp, me)
        start, state = "initial", None
        if rng.random() < cfg.selfplay.reset_fraction and has_enumerable_actions(game):
            start, state = "reset", random_legal_reset(game, rng, cfg.selfplay.reset_max_plies)
        episodes.append(Episode(game, players, state, start, seed=rng.randrange(2**31),
                                sampling=text_sampling(cfg, game)))
    return episodes


def text_sampling(cfg, game):
    """Free-text games (Taboo) answer in sentences, not move names: their own answer budget.
    ``None`` (the step's sampling) for every other game."""
    if has_enumerable_actions(game):
        return None
    return cfg.sampling.params(cfg.selfplay.text_max_new_tokens, stop=MOVE_STOP)


def snapshot_score(cfg, games, league, tok, step):
    """score(a, b) for :meth:`League.play_in`: a's mean result (win 1, draw 0, loss -1) over
    ``league_eval_games`` games against b, seats alternating, games cycling. Seeded by the
    pair, so every rank plays the same games and keeps the same table."""
    sampling = cfg.sampling.params(cfg.selfplay.max_new_tokens, hash((cfg.run.seed, step)) % (2**31), stop=MOVE_STOP)

    def score(a, b):
        pa = LLMPlayer(league.engine_for(a), tok, learner=False, name=a.name)
        pb = LLMPlayer(league.engine_for(b), tok, learner=False, name=b.name)
        eps = [Episode(games[i % len(games)], (pa, pb) if i % 2 == 0 else (pb, pa), seed=cfg.run.seed * 7919 + i,
                       sampling=text_sampling(cfg, games[i % len(games)]))
               for i in range(cfg.play_in.league_eval_games)]
        results = [float(np.sign(f.returns[0 if f.episode.players[0] is pa else 1]))
                   for f in play_episodes(eps, sampling, concurrency=cfg.selfplay.concurrency, max_turns=cfg.selfplay.max_turns)]
        return float(np.mean(results))

    return score


def make_averages(average: AverageConfig, games):
    """One running average policy per game that supports it (``average_policy``), else none."""
    if not average.average_policy:
        return {}
    avg = {g.name: AveragePolicy(g) for g in games if averageable(g)}
    if not avg:
        raise ConfigError("average_policy needs a game whose exact_metric is 'exploitability' "
                          f"(games: {[g.name for g in games]})")
    return avg


def make_feedback(feedback: FeedbackConfig, games):
    """Step 1-6 for the games learning from exact feedback (``feedback: exact``): one
    :class:`ExactFeedback` per game of ``exact_games`` (default: the exploitability games);
    none with sampled feedback."""
    if feedback.feedback != "exact":
        return {}
    chosen = exact_feedback_games(games, feedback.exact_games)
    if not chosen:
        raise ConfigError("feedback: exact needs a played game whose exact_metric is 'exploitability' "
                          f"(kuhn_poker) or one named in exact_games ({feedback.exact_games!r}); games: "
                          f"{[g.name for g in games]}; --feedback sampled plays them all")
    return {g.name: ExactFeedback(g, feedback.mmd_eta, feedback.mmd_alpha, feedback.mmd_magnet_every) for g in chosen}


def exact_targets(feedback, engine, tok, step):
    """Every exact-feedback game's MMD target samples for this step, and its metrics
    (``GAME/mmd_step``, ``GAME/distill_gap``, ``GAME/read_exploitability``)."""
    samples, metrics = [], {}
    for name, fb in feedback.items():
        part, m = fb.targets(engine, tok, step)
        samples += part
        metrics.update({f"{name}/{'read_exploitability' if k == 'exploitability' else k}": v for k, v in m.items()})
    return samples, metrics


def fold_averages(cfg, averages, engine, tok, step):
    """Read the current policy off every information set and fold it into each game's
    average (weight per ``average_weighting``); returns the policies read (for the log)."""
    out = {}
    sampling = cfg.sampling.params(cfg.selfplay.max_new_tokens, cfg.run.seed + step, stop=MOVE_STOP)
    for name, avg in averages.items():
        out[name] = policy_readout.tabular_policy(engine, tok, avg.game, resolved_readout(cfg.selfplay, tok), cfg.selfplay.readout_samples, sampling)
        avg.add(out[name], cfg.average.weight_at(step))
    return out


def average_metrics(averages):
    """``game/avg_exploitability`` of each non-empty average."""
    from lmselfplay.games.exploitability import exploitability

    return {f"{name}/avg_exploitability": exploitability(avg.game, avg.policy())
            for name, avg in averages.items() if avg.count}


def distill_averages(trainer, averages, tok, steps, logger=None, engine=None):
    """``steps`` trainer steps of pure target cross-entropy toward every average policy
    (no completion tokens: no policy-gradient or KL term); the last step's metrics. The
    cross-entropy of every 10th step goes to the log as ``distill/target_ce``."""
    samples = [s for avg in averages.values() for s in distill_samples(avg.game, tok, avg.policy())]
    metrics = {}
    for i in tqdm(range(steps), desc="distil average", disable=not trainer.accelerator.is_main_process):
        metrics = trainer.step(samples, engine=engine)
        if logger is not None and (i % 10 == 0 or i == steps - 1):
            logger.log(trainer.step_count, {"distill/step": i + 1, "distill/target_ce": metrics["target_ce"]})
    return metrics


def episode_plan(cfg, step_games, league, me, tok, sampling, process_index):
    """``step -> play``: the step's episodes and seed are made in the caller (they read the
    league); ``play()`` plays them, returning (finished episodes, stats)."""
    def at(step):
        episodes = make_episodes(cfg, step_games, league, me, tok, step, process_index)
        sp, stats = dataclasses.replace(sampling, seed=hash((cfg.run.seed, step, process_index)) % (2**31)), RolloutStats()
        return lambda: (list(play_episodes(episodes, sp, concurrency=cfg.selfplay.concurrency, retries=cfg.selfplay.retries,
                                           max_turns=cfg.selfplay.max_turns, stats=stats)), stats)
    return at


def snapshot_engines(trainer, tok):
    """The league's engine factory: a frozen HF engine serving a snapshot's weights."""
    return lambda weights, version: HFEngine(frozen_policy(trainer.unwrapped, weights), tok, version=version)


@dataclass
class SelfPlay:
    """What the loop works on, built once by :func:`make_selfplay` (a resume then restores it)."""

    games: list
    feedback: dict
    step_games: list  # each episode's game, the same every step (the games with exact feedback left out)
    positions: dict
    tok: object
    trainer: PolicyTrainer
    engine: object
    baselines: RoleBaselines
    league: League
    averages: dict
    me: LLMPlayer


def make_selfplay(cfg: SelfPlayConfigs, run, games, feedback, positions) -> SelfPlay:
    """The policy, its trainer and engine, and the loop's state, fresh, each component from its
    own config. ``positions`` are the evaluation's fixed positions per game
    (``metrics.eval_positions``), computed once and reused by every evaluation."""
    if cfg.selfplay.gnugo_level > 0 and any(plays_gtp(g) for g in games) and find_gnugo() is None:
        run.acc.print("gnugo_level is set but gnugo is not installed (apt-get install gnugo): no GnuGo games")
    # the same every step; games with exact feedback learn without playing
    args = cfg.selfplay
    step_games = [g for g in episode_games(games, args.game_weights, args.episodes_per_step) if g.name not in feedback]
    device = str(run.acc.device)
    model, tok = load_policy(cfg.policy, device=device)
    check_thinking(cfg.average, feedback, tok)
    trainer = PolicyTrainer(model, tok, cfg.trainer, accelerator=run.acc, total_steps=args.max_steps,
                            ref_model=reference_policy(cfg.policy, cfg.trainer.beta, model, device),
                            surrogate=cfg.surrogate, target_loss=cfg.target_loss,
                            temperature=cfg.sampling.temperature, seed=cfg.run.seed)
    engine = run.closing(make_engine(cfg.engine, trainer.unwrapped, tok, answer_budget=args.answer_budget(),  # hf | vllm | ...
                                     temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p, seed=cfg.run.seed))
    league = League(cfg.league, snapshot_engines(trainer, tok), play_in=cfg.play_in)
    return SelfPlay(games, feedback, step_games, positions, tok, trainer, engine, RoleBaselines(args.baseline_decay), league,
                    make_averages(cfg.average, games), LLMPlayer(engine, tok, learner=True))


def load_state(sp: SelfPlay, extra: dict) -> None:
    """What :func:`save_checkpoint` saved besides the trainer: baselines, league, averages, feedback."""
    sp.baselines.load_state_dict(extra["baselines"])
    sp.league.load_state_dict(extra["league"])
    for key, parts in (("averages", sp.averages), ("feedback", sp.feedback)):
        for name, state in extra.get(key, {}).items():
            parts[name].load_state_dict(state)


def save_checkpoint(run, sp: SelfPlay) -> None:
    """Step 9: the trainer's atomic checkpoint carries the loop's state as ``extra``."""
    sp.trainer.save_checkpoint(run.out, {"baselines": sp.baselines.state_dict(), "league": sp.league.state_dict(),
                                         "averages": {k: a.state_dict() for k, a in sp.averages.items()},
                                         "feedback": {k: f.state_dict() for k, f in sp.feedback.items()}})


def log_iterate_policies(cfg, run, sp: SelfPlay, step) -> None:
    """Fold the current policy into the averages (the checkpoint holds them up to step - 1)."""
    with sp.trainer.serving(sp.engine):
        read = fold_averages(cfg, sp.averages, sp.engine, sp.tok, step)
    run.log(step, {f"{name}/iterate_policy": pol for name, pol in read.items()})


def exact_feedback_step(run, sp: SelfPlay, step) -> list:
    """The referee's exact values, read off the policy before this step's update (logged)."""
    if not sp.feedback:
        return []
    with sp.trainer.serving(sp.engine):
        exact, exact_metrics = exact_targets(sp.feedback, sp.engine, sp.tok, step)
    run.log(step, exact_metrics)
    return exact


def step_row(sp: SelfPlay, metrics, stats, finished, stale, t0) -> dict:
    """The step's log row: trainer (its weight-sync check included), rollout, league, dropped-rollout
    and role-baseline metrics."""
    trajs = [t for f in finished for t in f.trajectories]
    mirror = [f for f in finished if f.episode.players[0] is f.episode.players[1]]
    return {**{f"train/{k}": v for k, v in metrics.items()},
            "rollout/invalid_rate": stats.as_dict()["invalid_rate"],
            "rollout/over_long_prompts": stats.over_long_prompts,  # forfeited: longer than the engine takes
            "rollout/mean_return": float(np.mean([t.reward for t in trajs])) if trajs else 0.0,
            "rollout/selfplay_first_seat_win_rate":
                float(np.mean([f.returns[0] > 0 for f in mirror])) if mirror else float("nan"),
            "rollout/tokens": stats.generated_tokens, "league/size": len(sp.league.ring), **stale,
            **{f"baseline/{k}": v for k, v in sp.baselines.values.items() if "|" not in k},  # roles only
            "wall_s": time.time() - t0}



def __getattr__(name: str):
    if name == "build":
        raise AttributeError("selfplay_games.steps.build is make_selfplay(cfg, run, games, feedback, positions)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
