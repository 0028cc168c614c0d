"""The self-play recipe's evaluation (``recipes/selfplay_games.py``, step 8 and the end of the run),
over the loop's :class:`~lmselfplay.selfplay_games.steps.SelfPlay`:

* :func:`eval_positions` — the fixed positions of the optimal-move metrics, once per run;
* :func:`evaluate_games` — the exact metrics each game declares (optimal-move rates or
  exploitability; win rates vs its reference bots), plus win rates vs GnuGo (:func:`gnugo_metrics`);
* :func:`log_evaluation` — step 8: those, the average policy's exploitability and the
  reasoning suite, logged and plotted (:func:`plot_curves`);
* :func:`final_metrics`, :func:`distilled_metrics`, :func:`log_final`, :func:`print_final` — the end
  of the run: the final evaluation, the distilled average's, the last row and the summary.

Each measures the weights the engine serves; the recipe serves them (``trainer.serving``) and
trains: evaluation never touches the trainer.
"""

from __future__ import annotations

import sys
import time

from lmselfplay.eval import game_metrics
from lmselfplay.eval.reasoning import eval_callback
from lmselfplay.games.base import OPTIMAL_MOVES, has_enumerable_actions
from lmselfplay.games.bots import BotPlayer
from lmselfplay.games.gtp import GTPError, find_gnugo, game_gnugo_player, plays_gtp
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm import readout as policy_readout
from lmselfplay.lm.engines import SamplingParams
from lmselfplay.rl.average_policy import averageable
from lmselfplay.selfplay_games.steps import (
    SelfPlay,
    average_metrics,
    fold_averages,
    resolved_readout,
)


def eval_positions(cfg, games):
    """The fixed positions of the optimal-move metrics (all, or a seeded subset), per game."""
    out = {}
    for game in games:
        if game.exact_metric == OPTIMAL_MOVES:
            out[game.name] = policy_readout.sampled_decision_states(game, cfg.selfplay.eval_positions, cfg.run.seed)
    return out


def evaluate_games(cfg, games, positions, engine, tok, step):
    """Step 8: the exact metrics of the current policy, per game (``game/metric``), sampled at
    the rollouts' temperature over the whole distribution (top-p 1)."""
    sampling = SamplingParams(max_new_tokens=cfg.selfplay.max_new_tokens, temperature=cfg.sampling.temperature, seed=cfg.run.seed + step,
                              stop=MOVE_STOP)
    out = {}
    for game in games:
        game_sampling = sampling if has_enumerable_actions(game) else \
            SamplingParams(**{**vars(sampling), "max_new_tokens": cfg.selfplay.text_max_new_tokens})
        result = game_metrics.policy_metrics(engine, tok, game, positions.get(game.name), cfg.selfplay.eval_games, game_sampling,
                                       seed=step, max_new_tokens=cfg.selfplay.max_new_tokens, readout=resolved_readout(cfg.selfplay, tok),
                                       readout_samples=cfg.selfplay.readout_samples)
        out.update({f"{game.name}/{k}": v for k, v in result.items()})
        out.update(gnugo_metrics(cfg.selfplay, game, engine, tok, game_sampling, step))
    return out


def gnugo_metrics(args, game, engine, tok, sampling, step):
    """Win rate against GnuGo (``gnugo_level`` > 0, Go only, gnugo installed); the engine
    process lives only for this evaluation. The engine is an outside program and only
    measures: when it fails (a :class:`GTPError`) the failure is logged as a warning and as
    ``<key>_failed``, and the run goes on with its step and checkpoint."""
    if args.gnugo_level <= 0 or not plays_gtp(game) or find_gnugo() is None:
        return {}
    key = f"{game.name}/win_vs_gnugo_l{args.gnugo_level}"
    try:
        with game_gnugo_player(game, args.gnugo_level) as gnugo:
            wr = game_metrics.win_rates(engine, tok, game, BotPlayer(gnugo, gnugo.name), args.gnugo_games,
                                        sampling, seed=step)
    except GTPError as e:
        print(f"warning: step {step}: the evaluation against GnuGo failed ({e}); the run goes on", file=sys.stderr)
        return {f"{key}_failed": 1}
    return {key: wr["win"], f"{key}_ci_low": wr["win_ci"][0], f"{key}_ci_high": wr["win_ci"][1]}


def log_evaluation(cfg, run, sp: SelfPlay, step, t0) -> None:
    """Step 8 on the weights ``sp.engine`` serves (the caller serves them; under ZeRO-3 every rank
    evaluates in step, any forward may need all ranks); rank 0 logs."""
    result = {**evaluate_games(cfg, sp.games, sp.positions, sp.engine, sp.tok, step), **average_metrics(sp.averages)}
    if run.is_main:  # whole weights are served: no collective inside
        eval_callback(step, sp.engine, sp.tok, cfg.selfplay.eval_suite, cfg.selfplay.eval_every, run.logger,
                      max_new_tokens=cfg.selfplay.eval_max_new_tokens or None)
        run.log(step, {**result, "wall_s": time.time() - t0})
        plot_curves(run.logger, sp.games)


def final_metrics(cfg, sp: SelfPlay) -> dict:
    """The final evaluation on the weights ``sp.engine`` serves (the caller serves them): the
    averages take the final policy in first (when it is due), then the exact metrics."""
    if sp.averages and cfg.average.averaged_at(cfg.selfplay.max_steps):
        fold_averages(cfg, sp.averages, sp.engine, sp.tok, cfg.selfplay.max_steps)
    return {**evaluate_games(cfg, sp.games, sp.positions, sp.engine, sp.tok, cfg.selfplay.max_steps),
            **average_metrics(sp.averages)}


def distilled_metrics(cfg, sp: SelfPlay, distilled: dict) -> dict:
    """The exact metrics of the distilled average policy ``sp.engine`` serves, and the distillation's
    last cross-entropy (``distilled``: its trainer metrics)."""
    out = {f"distilled/{k}": v for k, v in
           evaluate_games(cfg, sp.games, sp.positions, sp.engine, sp.tok, cfg.selfplay.max_steps).items()}
    out["distilled/target_ce"] = distilled.get("target_ce", float("nan"))
    return out


def log_final(cfg, run, sp: SelfPlay, final: dict, t0) -> object:
    """The final row of the log and its curves (rank 0); the figure's path."""
    run.log(cfg.selfplay.max_steps, {**final, "wall_s": time.time() - t0})
    return plot_curves(run.logger, sp.games) if run.is_main else None


def print_final(run, final: dict, png, model_dir) -> None:
    """The summary rank 0 prints: the final exact metrics, where the curves, log and model are."""
    if run.is_main:
        print("\nfinal exact metrics:")
        for k, v in final.items():
            if "ci_" not in k:
                print(f"  {k:<36} {v}" if isinstance(v, str) else f"  {k:<36} {v:.3f}")
        print(f"\ncurves: {png}\nmetrics: {run.logger.path}\nmodel: {model_dir}")


def plot_curves(logger, games):
    """``curves.png``: each game's headline metrics (and its average's exploitability), the
    policy's entropy, the invalid rate and the first seat's win rate in mirror games."""
    keys = [f"{g.name}/{k}" for g in games for k in game_metrics.headline_metrics(g)]
    keys += [f"{g.name}/avg_exploitability" for g in games if averageable(g)]
    keys += ["train/entropy", "rollout/invalid_rate", "rollout/selfplay_first_seat_win_rate"]
    references, titles = game_metrics.plot_annotations([g.name for g in games])  # optimal, Nash, uniform
    return logger.plot(keys, "curves.png", title="self-play on text games", references=references, titles=titles)

