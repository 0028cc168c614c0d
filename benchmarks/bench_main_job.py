"""Where the main job's step time goes, what packing its target rows saves, and what it learns.

    python benchmarks/bench_main_job.py [--steps 2] [--threads 2,1]
    python benchmarks/bench_main_job.py --grouping [--steps 2] [--threads 1] [--repeats 3]
    python benchmarks/bench_main_job.py --main-job --seeds 0,1 --label packed [--code DIR]

The exact-feedback main job (``recipes/configs/selfplay_games_exact.yaml``) spends most of a step in the trainer:
the exact-feedback targets of Nim and Kuhn poker (``distill_samples``: per information set
one row for ``<move>``, one for the move token, one per legal answer for ``</move>``, each row
the whole prompt) get ``num_iterations`` + ``target_passes`` = 6 forward/backward passes. The
trainer packs the rows that are prefixes of another into that one (``pack_targets``: the
same loss, summed in another order). This script builds that step's real batch (exact
targets + one step of sampled tic-tac-toe play), then times, in one process and on the same
batch, ``--steps`` trainer steps of each variant, per ``--threads`` value:

* ``rows_per_target``: one forward row per target sample, as ``distill_samples`` makes them;
* ``packed``: the trainer as it is.

Each variant starts from the same weights; ``max_abs_weight_diff`` is the largest difference
of the final weights from ``rows_per_target``'s at the same thread count. Also timed: the
exact-feedback read (policy read + MMD targets) and one evaluation of the three games.

``--grouping`` times instead the sampled main job's step (``recipes/configs/selfplay_games.yaml``: step 0's
played batch, no exact targets) with its micro-batches cut in the shuffled order (``shuffled``) and
longest first (``by_length``, the trainer as it is), ``--repeats`` alternating runs of each, and counts the
padding of every forward the trainer collates (``real_over_padded_tokens``: prompt + completion tokens /
rows x widest row).

``--main-job`` instead runs the README's main job (the default torch threads; on a shared
machine run the script under ``nice``, which the job inherits) once per seed with the code of
``--code`` (default: this checkout) and records, under ``--label``,
each run's command, wall time and final evaluation: the learning check of a change that is
not bit-identical (old code vs new code, same seeds). Both modes update their own part of
``benchmarks/results/bench_main_job.json`` (with the machine's load average: on a shared
machine the times move with the other processes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from record_run import EVAL_MARKERS, evaluation_rows

import lmselfplay.rl.trainer as sp_trainer  # where the trainer looks pack_targets up
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm.engines import make_engine
from lmselfplay.lm.rollout import LLMPlayer
from lmselfplay.models.policy import load_policy
from lmselfplay.rl.advantages import RoleBaselines
from lmselfplay.rl.league import League
from lmselfplay.rl.trainer import PolicyTrainer
from lmselfplay.selfplay_games.config import SelfPlayConfigs
from lmselfplay.selfplay_games.metrics import eval_positions, evaluate_games
from lmselfplay.selfplay_games.steps import (
    episode_games,
    episode_plan,
    exact_targets,
    make_feedback,
    make_games,
    snapshot_engines,
    training_samples,
)
from lmselfplay.utils.results import results_dir, save_results

ROOT = Path(__file__).resolve().parents[1]


def make_run(cfg):
    model, tok = load_policy(cfg.policy, device="cpu")
    trainer = PolicyTrainer(model, tok, cfg.trainer, total_steps=cfg.selfplay.max_steps, target_loss=cfg.target_loss,
                            temperature=cfg.sampling.temperature, seed=cfg.run.seed)
    return trainer, make_engine(cfg.engine, trainer.unwrapped, tok, answer_budget=cfg.selfplay.answer_budget(),
                                temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                                seed=cfg.run.seed), tok


def step_batch(cfg, games, with_eval=True):
    """Step 0's batch of the main job: the exact targets and one step of sampled play."""
    trainer, engine, tok = make_run(cfg)
    feedback = make_feedback(cfg.feedback, games)
    t0 = time.perf_counter()
    with trainer.serving(engine):
        exact, _ = exact_targets(feedback, engine, tok, 0)
    read_s = time.perf_counter() - t0
    args = cfg.selfplay
    step_games = [g for g in episode_games(games, args.game_weights, args.episodes_per_step) if g.name not in feedback]
    league = League(cfg.league, snapshot_engines(trainer, tok), play_in=cfg.play_in)
    sampling = cfg.sampling.params(args.max_new_tokens, stop=MOVE_STOP)
    play = episode_plan(cfg, step_games, league, LLMPlayer(engine, tok, learner=True), tok, sampling, 0)(0)
    t0 = time.perf_counter()
    with trainer.serving(engine):
        finished, _ = play()  # the recipe's own step-0 play: its seed, retries and turn limit
    play_s = time.perf_counter() - t0
    samples = training_samples(args, finished, RoleBaselines(args.baseline_decay)) + exact
    parts = {"exact_read_s": read_s, "play_s": play_s, "exact_rows": len(exact),
             "played_rows": len(samples) - len(exact)}
    if with_eval:
        t0 = time.perf_counter()
        with trainer.serving(engine):
            evaluate_games(cfg, games, eval_positions(cfg, games), engine, tok, 0)
        parts["evaluate_s"] = time.perf_counter() - t0
    return samples, parts


def timed_steps(cfg, samples, steps, threads, pack, group=True, padding=None):
    """Seconds per trainer step, and the final weights, of one variant (``group`` False: micro-batches
    cut in the shuffled order). ``padding``, a dict, gets the real and padded tokens of every collate."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    trainer, _, _ = make_run(cfg)
    packing, grouping, collate = sp_trainer.pack_targets, sp_trainer.by_length, sp_trainer.collate
    sp_trainer.pack_targets = packing if pack else (lambda batch, branching=False: batch)
    sp_trainer.by_length = grouping if group else list
    if padding is not None:
        sp_trainer.collate = counting_collate(collate, padding)
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            trainer.step(samples)
        per_step = (time.perf_counter() - t0) / steps
    finally:
        sp_trainer.pack_targets, sp_trainer.by_length, sp_trainer.collate = packing, grouping, collate
    return per_step, [p.detach().clone() for p in trainer.unwrapped.parameters()]


def counting_collate(collate, padding):
    """``collate`` adding each batch's real tokens, padded tokens and rows to ``padding``."""
    def counted(batch, *args, **kwargs):
        lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in batch]
        padding["real"] = padding.get("real", 0) + sum(lengths)
        padding["padded"] = padding.get("padded", 0) + len(lengths) * max(lengths, default=0)
        padding["forwards"] = padding.get("forwards", 0) + 1
        return collate(batch, *args, **kwargs)
    return counted


def grouping_variants(cfg, samples, steps, threads, repeats):
    """Per thread count: seconds per trainer step (the mean over ``repeats`` alternating runs of each,
    so a change in the machine's load falls on both), padding and weight difference of the shuffled
    cut and the length-grouped one, on the same batch from the same weights."""
    rows = {}
    for n in threads:
        times, weights, padding = {False: [], True: []}, {}, {False: {}, True: {}}
        for group in (False, True) * repeats:
            s, weights[group] = timed_steps(cfg, samples, steps, n, pack=True, group=group, padding=padding[group])
            times[group].append(s)
        for group in (False, True):
            s = sum(times[group]) / repeats
            diff = max(float((a - b).abs().max()) for a, b in zip(weights[False], weights[group], strict=True))
            name = f"threads{n}/{'by_length' if group else 'shuffled'}"
            rows[name] = {"s_per_step": s, "s_per_step_runs": times[group],
                          "speedup_vs_shuffled": sum(times[False]) / repeats / s, "max_abs_weight_diff": diff,
                          "forwards_per_step": padding[group]["forwards"] / steps / repeats,
                          "real_over_padded_tokens": padding[group]["real"] / padding[group]["padded"]}
            print(f"{name:<22} {s:7.2f} s/step  x{rows[name]['speedup_vs_shuffled']:.2f}  real/padded "
                  f"{rows[name]['real_over_padded_tokens']:.3f}  forwards/step {rows[name]['forwards_per_step']:.0f}"
                  f"  max |weight diff| {diff:.2e}", flush=True)
    return rows


def main_job_run(code: Path, seed: int, out: Path) -> dict:
    """One run of the README's main job with the code in ``code``: its wall time and final evaluation."""
    cmd = [sys.executable, "recipes/selfplay_games.py", "--config", "recipes/configs/selfplay_games.yaml",
           "--seed", str(seed), "--output_dir", str(out), "--overwrite_output_dir", "true"]
    out.mkdir(parents=True, exist_ok=True)
    load = list(os.getloadavg())
    t0 = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, cwd=code, env={**os.environ, "PYTHONPATH": str(code)}, stdout=log, stderr=log, check=True)
    wall = time.perf_counter() - t0
    return {"command": " ".join(cmd), "code": str(code), "wall_s": wall, "load_average_before": load,
            "load_average_after": list(os.getloadavg()), **evaluations(out)}


def evaluations(out: Path) -> dict:
    """The evaluations a run's ``metrics.jsonl`` holds (a run still going, or killed, included):
    its exact metrics per evaluated step, the last step reached, and the last evaluation as ``final``."""
    evals = {int(step): {k: v for k, v in row.items() if any(m in k for m in EVAL_MARKERS)}
             for step, row in evaluation_rows(out).items()}
    last = max(evals)
    steps_done = max(json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines())
    return {"step": last, "steps_done": steps_done, "final": evals[last], "evaluations": evals}


def update_results(part: str, value, out_dir) -> None:
    """Replace one part of the results file, keeping the others."""
    path = Path(out_dir or results_dir()) / "bench_main_job.json"
    results = json.loads(path.read_text())["results"] if path.is_file() else {}
    if part == "main_job_runs":
        runs = results.get(part, {})
        runs.update(value)
        value = runs
    results[part] = value
    save_results("bench_main_job", results, out_dir)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", default="2,1", help="intra-op thread counts to time")
    ap.add_argument("--no-eval", action="store_true", help="skip timing one evaluation")
    ap.add_argument("--results", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--grouping", action="store_true",
                    help="time the sampled main job's trainer step with shuffled vs length-grouped micro-batches")
    ap.add_argument("--repeats", type=int, default=3, help="--grouping: alternating timed runs of each variant")
    ap.add_argument("--main-job", action="store_true", help="run the main job per --seeds instead")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--label", default="this", help="--main-job: the name its runs are recorded under")
    ap.add_argument("--code", type=Path, default=ROOT, help="--main-job: the checkout whose code runs")
    ap.add_argument("--runs-dir", type=Path, default=Path("/tmp/bench_main_job_runs"))
    ap.add_argument("--collect", type=Path, default=None,
                    help="record the evaluations the run in this folder reached (--label, one --seeds) without running")
    args = ap.parse_args(argv)
    if args.collect:
        update_results("main_job_runs", {f"{args.label}/seed{args.seeds}": {"run": str(args.collect),
                                                                         **evaluations(args.collect)}}, args.results)
        return 0
    if args.main_job:
        for seed in [int(x) for x in args.seeds.split(",")]:
            run = main_job_run(args.code.resolve(), seed, args.runs_dir / f"{args.label}_seed{seed}")
            print(f"{args.label} seed {seed}: {run['wall_s']:.0f} s  {run['final']}", flush=True)
            update_results("main_job_runs", {f"{args.label}/seed{seed}": run}, args.results)
        return 0
    config = "selfplay_games.yaml" if args.grouping else "selfplay_games_exact.yaml"
    cfg = SelfPlayConfigs.parse(["--config", str(ROOT / "recipes/configs" / config), "--output_dir", "/tmp/bench_main_job"])
    games = make_games(cfg.selfplay.games)
    threads = [int(x) for x in args.threads.split(",")]
    torch.set_num_threads(threads[0])
    samples, parts = step_batch(cfg, games, with_eval=not args.no_eval)
    if args.grouping:
        rows = grouping_variants(cfg, samples, args.steps, threads, args.repeats)
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in parts.items()})
        update_results("trainer_step_grouping", {"config": f"recipes/configs/{config}", "steps": args.steps,
                                                 "repeats": args.repeats,
                                                 "threads": threads, "components": parts, "variants": rows,
                                                 "torch": torch.__version__,
                                                 "load_average_1_5_15": list(os.getloadavg())}, args.results)
        return 0
    merged = sp_trainer.merge_identical(samples)
    parts.update(rows_per_target=len(merged), packed_rows_chains=len(sp_trainer.pack_targets(merged)),
                 packed_rows_tree=len(sp_trainer.pack_targets(merged, branching=True)))
    rows = {}
    for n in threads:
        base_s, base_w = None, None
        for pack in (False, True):
            name = f"threads{n}/{'packed' if pack else 'rows_per_target'}"
            s, w = timed_steps(cfg, samples, args.steps, n, pack)
            base_s, base_w = (s, w) if base_w is None else (base_s, base_w)
            diff = max(float((a - b).abs().max()) for a, b in zip(base_w, w, strict=True))
            rows[name] = {"s_per_step": s, "speedup_vs_rows_per_target": base_s / s, "max_abs_weight_diff": diff}
            print(f"{name:<28} {s:8.2f} s/step  x{base_s / s:.2f}  max |weight diff| {diff:.2e}", flush=True)
    print({k: round(v, 2) if isinstance(v, float) else v for k, v in parts.items()})
    update_results("trainer_step", {"steps": args.steps, "threads": threads, "components": parts, "variants": rows,
                                    "torch": torch.__version__, "load_average_1_5_15": list(os.getloadavg())},
                   args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
