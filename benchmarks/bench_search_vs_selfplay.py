"""Search-distilled self-play vs policy-gradient self-play on tic-tac-toe, same wall time.

One run each, one after the other, each given the same wall-clock budget (``--minutes``):

* ``search_selfplay`` — ``recipes/search_selfplay.py`` with
  ``recipes/configs/search_selfplay_tictactoe.yaml`` (PUCT with the LLM as the network,
  the visit distribution distilled back);
* ``selfplay_games`` — ``recipes/selfplay_games.py`` with
  ``recipes/configs/selfplay_games.yaml`` on tic-tac-toe alone (PPO self-play, the rules
  as referee).

Each recipe runs as a subprocess (1 torch thread, its own evaluations off, a checkpoint
after every iteration / step) and is stopped when its budget is spent: start-up, play and
training all count. The arm's result is its newest checkpoint at that moment (an
iteration still running is lost: the model a user would have at the deadline). Every
model — the starting one too — is then measured by the same code, the raw LLM with no
search (greedy answers, an illegal answer loses):

* P(optimal): the probability of a minimax-optimal move over all 4,520 decision positions
  (``eval/game_metrics.optimal_move_rates``; ``--positions N``: N of them drawn with the seed,
  the same N for every model — a smoke run's size), and the greedy answer's optimal rate;
* win rate vs a uniformly random player and loss rate vs the exact (minimax) player,
  ``--games`` games each (half as X, half as O), with 95% Wilson intervals.

Prints the side-by-side table and writes ``benchmarks/results/search_vs_selfplay.json``
(``--name``).

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/bench_search_vs_selfplay.py --minutes 8
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lmselfplay.eval import game_metrics
from lmselfplay.games import make
from lmselfplay.games.bots import reference_bots
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm.engines import HFEngine, SamplingParams
from lmselfplay.lm.readout import sampled_decision_states
from lmselfplay.models.policy import load_policy
from lmselfplay.utils.checkpoint import latest_checkpoint
from lmselfplay.utils.results import save_results

ROOT = Path(__file__).resolve().parents[1]


QUICK = {"search_selfplay": ["--games_per_round", "2", "--n_sims", "4", "--distill_steps", "1", "--batch_size", "8",
                             "--value_steps", "1"],
         "selfplay_games": ["--episodes_per_step", "4", "--max_new_tokens", "6"]}


def arms(out: Path, model: str | None, seed: int, quick: bool = False) -> dict[str, list[str]]:
    """The command line of each arm: its recipe and shipped config, evaluation off (the
    benchmark measures every model the same way afterwards), a checkpoint per round, and
    more rounds than the budget allows (the budget stops it). ``quick``: tiny rounds (QUICK),
    so that a smoke run of a minute reaches a checkpoint."""
    common = ["--seed", str(seed), "--dtype", "float32"] + (["--model_name_or_path", model] if model else [])
    return {
        "search_selfplay": [sys.executable, str(ROOT / "recipes" / "search_selfplay.py"), "--config",
                            str(ROOT / "recipes" / "configs" / "search_selfplay_tictactoe.yaml"),
                            "--output_dir", str(out / "search_selfplay"), "--rounds", "100000",
                            "--eval_every", "0", "--checkpoint_every", "1", "--torch_threads", "1",
                            "--tensorboard", "false", "--progress", "false", *common,
                            *(QUICK["search_selfplay"] if quick else [])],
        "selfplay_games": [sys.executable, str(ROOT / "recipes" / "selfplay_games.py"), "--config",
                           str(ROOT / "recipes" / "configs" / "selfplay_games.yaml"), "--games", "tictactoe",
                           "--feedback", "sampled",
                           "--output_dir", str(out / "selfplay_games"), "--max_steps", "100000",
                           "--eval_every", "0", "--checkpoint_every", "1", *common,
                           *(QUICK["selfplay_games"] if quick else [])],
    }


def run_for(cmd: list[str], seconds: float, log: Path) -> dict[str, Any]:
    """Run ``cmd`` (its own process group) until it exits or ``seconds`` pass; then SIGTERM
    the group, and SIGKILL it if it is still there 30 s later. Never leaves it running."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=seconds)
            stopped = False
        except subprocess.TimeoutExpired:
            stopped = True
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    if not stopped and proc.returncode != 0:
        raise RuntimeError(f"{cmd[1]} failed (exit {proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    return {"wall_s": time.time() - t0, "stopped_by_budget": stopped}


def measure(model_path: str | None, games: int, seed: int, positions: list[Any]) -> dict[str, Any]:
    """The raw LLM's exact metrics on ``positions`` and greedy games vs random and minimax (see
    the docstring)."""
    model, tok = load_policy(model_name_or_path=model_path, dtype="float32")
    model.eval()
    engine, game = HFEngine(model, tok), make("tictactoe")
    out: dict[str, Any] = {}
    r = game_metrics.optimal_move_rates(engine, tok, game, positions)
    out.update(positions=r["positions"], optimal_move_prob=r["expected_optimal_prob"],
               greedy_optimal_rate=r["greedy_optimal_rate"], min_optimal_prob=r["min_expected_optimal_prob"])
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0, stop=MOVE_STOP, seed=seed)
    bots = reference_bots(game)
    for name, key, ci in (("random", "win", "win_ci"), ("exact", "loss", "loss_ci")):
        wr = game_metrics.win_rates(engine, tok, game, bots[name], games, greedy, seed=seed)
        out[f"{key}_vs_{name}"], out[f"{key}_vs_{name}_ci"] = wr[key], list(wr[ci])
        out[f"games_vs_{name}"] = wr["games"]
    return out


def table(rows: dict[str, dict[str, Any]]) -> str:
    head = ("| model | trainer steps | P(optimal) | greedy optimal | win vs random [95% CI] "
            "| loss vs minimax [95% CI] |\n|---|---|---|---|---|---|")
    lines = [head]
    for name, r in rows.items():
        w, lo = r["win_vs_random_ci"], r["loss_vs_exact_ci"]
        lines.append(f"| {name} | {r.get('trainer_steps', 0)} | {r['optimal_move_prob']:.3f} | "
                     f"{r['greedy_optimal_rate']:.3f} | {r['win_vs_random']:.3f} [{w[0]:.3f}, {w[1]:.3f}] | "
                     f"{r['loss_vs_exact']:.3f} [{lo[0]:.3f}, {lo[1]:.3f}] |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of each arm")
    ap.add_argument("--games", type=int, default=200, help="evaluation games per opponent (half per seat)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--positions", type=int, default=0,
                    help="decision positions for P(optimal), drawn with the seed (0: all 4,520)")
    ap.add_argument("--model", default=None, help="starting model (default: the embedded tiny model)")
    ap.add_argument("--out", default="runs/bench_search_vs_selfplay", help="run folders (each arm's is replaced)")
    ap.add_argument("--only", choices=["search_selfplay", "selfplay_games"], default=None)
    ap.add_argument("--results", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--name", default="search_vs_selfplay", help="results file name (without .json)")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny rounds (use with --minutes 1 --games 4)")
    args = ap.parse_args(argv)
    if args.positions < 0:
        ap.error(f"--positions must be >= 0 (0: all), got {args.positions}")
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    positions = sampled_decision_states(make("tictactoe"), args.positions, args.seed)  # one set for every model
    rows: dict[str, dict[str, Any]] = {"start": measure(args.model, args.games, args.seed, positions)}
    print(table(rows), flush=True)
    for name, cmd in arms(out, args.model, args.seed, args.quick).items():
        if args.only and name != args.only:
            continue
        shutil.rmtree(out / name, ignore_errors=True)  # a fresh run, not a resumed one
        run = run_for(cmd, 60 * args.minutes, out / f"{name}.log")
        ckpt = latest_checkpoint(out / name)
        if ckpt is None:
            raise RuntimeError(f"{name}: no checkpoint within {args.minutes} min; see {out / f'{name}.log'}")
        state = torch.load(ckpt / "lmselfplay_state.pt", weights_only=False)
        rows[name] = {**run, "trainer_steps": int(state["step_count"]),
                      "iterations": int(state["extra"].get("iteration", state["step_count"])), "checkpoint": str(ckpt),
                      **measure(str(ckpt / "model"), args.games, args.seed, positions)}
        print(table(rows), flush=True)
    result = {"args": vars(args), "threads": 1, "rows": rows, "table": table(rows)}
    save_results(args.name, result, args.results)
    return result


if __name__ == "__main__":
    main()
