"""Where the main job's step time goes, and what a bit-identical change saves, side by side.

    python benchmarks/bench_main_job.py [--steps 2] [--threads 2,1]

The main job (``recipes/configs/selfplay_games.yaml``) spends most of a step in the trainer:
the exact-feedback targets of Nim and Kuhn poker (a few hundred prompt rows) get
``num_iterations`` + ``target_passes`` = 6 forward/backward passes and 6 AdamW steps. This
script builds that step's real batch (exact targets + one step of sampled tic-tac-toe play),
then times, in one process and on the same batch, ``--steps`` trainer steps of each variant:

* ``old``: AdamW's per-tensor loop (``foreach=False``, PyTorch's CPU default);
* ``foreach``: the fused multi-tensor AdamW the trainer uses (``foreach=True``);
* per ``--threads`` value: the same step at that many intra-op threads.

Each variant starts from the same weights; the final weights are compared bit for bit with
``old``'s at the first thread count (``bit_identical``). Also timed: the exact-feedback read
(policy read + MMD targets) and one evaluation of the three games. Prints the ratios and
writes ``benchmarks/results/bench_main_job.json`` (with the machine's load average: on a
shared machine the times, not the bit-identity, move with the other processes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from lmselfplay.utils.recipe_loader import load_recipe
from lmselfplay.utils.results import save_results

ROOT = Path(__file__).resolve().parents[1]
sp = load_recipe("selfplay_games")  # the recipe's own helpers build the step


def make_run(cfg):
    model, tok = sp.load_policy(cfg, device="cpu")
    trainer = sp.PolicyTrainer(model, tok, cfg)
    return trainer, sp.make_engine(cfg, trainer.unwrapped, tok), tok


def step_batch(cfg, games, with_eval=True):
    """Step 0's batch of the main job: the exact targets and one step of sampled play."""
    trainer, engine, tok = make_run(cfg)
    feedback = sp.make_feedback(cfg, games)
    t0 = time.perf_counter()
    with trainer.serving(engine):
        exact, _ = sp.exact_targets(feedback, engine, tok, 0)
    read_s = time.perf_counter() - t0
    plan = [g for g in sp.episode_games(games, cfg.game_weights, cfg.episodes_per_step) if g.name not in feedback]
    league = sp.League(cfg, sp.snapshot_engines(trainer, tok))
    sampling = sp.SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                                 stop=sp.MOVE_STOP)
    play = sp.episode_plan(cfg, plan, league, sp.LLMPlayer(engine, tok, learner=True), tok, sampling, 0)(0)
    t0 = time.perf_counter()
    with trainer.serving(engine):
        finished, _ = play()  # the recipe's own step-0 play: its seed, retries and turn limit
    play_s = time.perf_counter() - t0
    samples = sp.training_samples(cfg, finished, sp.RoleBaselines(cfg.baseline_decay)) + exact
    parts = {"exact_read_s": read_s, "play_s": play_s, "exact_rows": len(exact),
             "played_rows": len(samples) - len(exact)}
    if with_eval:
        t0 = time.perf_counter()
        with trainer.serving(engine):
            sp.evaluate_games(cfg, games, sp.eval_positions(cfg, games), engine, tok, 0)
        parts["evaluate_s"] = time.perf_counter() - t0
    return samples, parts


def timed_steps(cfg, samples, steps, threads, foreach):
    """Seconds per trainer step, and the final weights, of one variant."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    trainer, _, _ = make_run(cfg)
    for group in trainer.optimizer.optimizer.param_groups:  # AdamW reads it at every step
        group["foreach"] = foreach
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.step(samples)
    per_step = (time.perf_counter() - t0) / steps
    return per_step, [p.detach().clone() for p in trainer.unwrapped.parameters()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", default="2,1", help="intra-op thread counts to time (the first is the baseline)")
    ap.add_argument("--no-eval", action="store_true", help="skip timing one evaluation")
    ap.add_argument("--results", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    cfg = sp.parse_config(sp.SelfPlayConfig, ["--config", str(ROOT / "recipes/configs/selfplay_games.yaml"),
                                              "--output_dir", "/tmp/bench_main_job"])
    games = sp.make_games(cfg.games)
    threads = [int(x) for x in args.threads.split(",")]
    torch.set_num_threads(threads[0])
    samples, parts = step_batch(cfg, games, with_eval=not args.no_eval)
    rows = {}
    base_w = None
    for n in threads:
        for foreach in (False, True):
            name = f"threads{n}/{'foreach' if foreach else 'old'}"
            s, w = timed_steps(cfg, samples, args.steps, n, foreach)
            base_w = w if base_w is None else base_w
            same = all(torch.equal(a, b) for a, b in zip(base_w, w, strict=True))
            rows[name] = {"s_per_step": s, "bit_identical": same}
            print(f"{name:<20} {s:8.2f} s/step  bit-identical to the baseline: {same}", flush=True)
    base = rows[f"threads{threads[0]}/old"]["s_per_step"]
    for r in rows.values():
        r["speedup_vs_baseline"] = base / r["s_per_step"]
    print({k: round(v["speedup_vs_baseline"], 2) for k, v in rows.items()})
    print({k: round(v, 2) if isinstance(v, float) else v for k, v in parts.items()})
    save_results("bench_main_job", {"steps": args.steps, "threads": threads, "components": parts,
                                    "trainer_step": rows, "torch": torch.__version__,
                                    "load_average_1_5_15": list(os.getloadavg())}, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
