"""The main job's step time alone and beside CPU-bound processes, per torch thread policy.

    python benchmarks/bench_threads_under_load.py [--steps 6] [--loads 0,1,2]
        [--policies default,one,free,passive,auto] [--extra "--episodes_per_step 48"]

Runs the README's main job (``recipes/selfplay_games.py --config recipes/configs/selfplay_games.yaml``,
``--max_steps --steps``, no evaluation, no checkpoints) once per thread policy and load, in one
run, the policies interleaved within each load so that they see the same machine, and reads
each step's time from the run's ``metrics.jsonl`` (``wall_s`` differences; the first step,
which warms up, is dropped). A load is that many ``while True: pass`` processes started
before the job and killed after it. Policies:

* ``default``: torch's default thread count (the usable cores), OpenMP's default (spinning) wait;
* ``one``: 1 thread;
* ``free``: the cores the load leaves free (usable cores less the load, at least 1);
* ``passive``: the default thread count with ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep);
* ``auto``: the job's default (``--torch_threads 0``: lmselfplay/utils/threads.py).

It prints, per policy, the median step time at each load and the ratios loaded / alone and
alone / ``default`` alone, and writes ``benchmarks/results/bench_threads_under_load.json``
(``save_results``: with the machine, date and commit; ``$LMSELFPLAY_RESULTS_DIR`` overrides the folder). The numbers mean something only on a
machine where nothing else runs: the load must be the one this script makes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lmselfplay.utils.results import save_results

ROOT = Path(__file__).resolve().parents[1]
JOB = [sys.executable, "recipes/selfplay_games.py", "--config", "recipes/configs/selfplay_games.yaml",
       "--eval_every", "0", "--checkpoint_every", "0", "--tensorboard", "false"]
BUSY = [sys.executable, "-c", "while True: pass"]


def cores() -> int:
    return len(os.sched_getaffinity(0))


def policy_run(policy: str, load: int) -> tuple[list[str], dict[str, str]]:
    """The job's extra flags and environment for ``policy`` beside ``load`` busy processes."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")}
    n = cores()
    threads = {"default": n, "one": 1, "free": max(1, n - load), "passive": n, "auto": 0}[policy]
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return ["--torch_threads", str(threads)], env


def step_times(policy: str, load: int, steps: int, extra: list[str]) -> list[float]:
    """Seconds per step of one run (the first step dropped)."""
    flags, env = policy_run(policy, load)
    busy = [subprocess.Popen(BUSY) for _ in range(load)]
    try:
        with tempfile.TemporaryDirectory() as out:
            subprocess.run([*JOB, "--max_steps", str(steps), "--output_dir", f"{out}/run", *flags, *extra],
                           cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
            rows = [json.loads(line) for line in Path(out, "run", "metrics.jsonl").read_text().splitlines()]
    finally:
        for p in busy:
            p.kill()
            p.wait()
    walls = [r["wall_s"] for r in rows if "wall_s" in r]
    return [b - a for a, b in zip(walls, walls[1:])]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="steps per run (the first is dropped)")
    ap.add_argument("--loads", default="0,1,2", help="numbers of CPU-bound processes beside the job")
    ap.add_argument("--policies", default="default,one,free,passive,auto")
    ap.add_argument("--extra", default="", help="more flags for the job (e.g. a smaller --episodes_per_step)")
    args = ap.parse_args(argv)
    loads = [int(x) for x in args.loads.split(",")]
    policies = args.policies.split(",")
    t0 = time.time()
    times: dict[str, dict[int, list[float]]] = {p: {} for p in policies}
    for load in loads:
        for policy in policies:
            times[policy][load] = step_times(policy, load, args.steps, args.extra.split())
            print(f"{policy:8s} load {load}: median {statistics.median(times[policy][load]):.2f} s a step", flush=True)
    base = statistics.median(times[policies[0]][loads[0]]) if loads[0] == 0 else None
    summary = {}
    for policy in policies:
        med = {load: statistics.median(ts) for load, ts in times[policy].items()}
        row = {"median_step_s": {str(k): round(v, 3) for k, v in med.items()}}
        if 0 in med:
            row["ratio_to_alone"] = {str(k): round(v / med[0], 2) for k, v in med.items()}
            if base:
                row["alone_over_first_policy_alone"] = round(med[0] / base, 2)
        summary[policy] = row
        print(f"{policy:8s} " + "  ".join(f"load {k}: {v:.2f} s" + (f" ({v / med[0]:.2f}x alone)" if 0 in med else "")
                                          for k, v in med.items()))
    result = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "cores": cores(), "steps": args.steps, "extra": args.extra, "policies": summary,
              "step_times_s": {p: {str(k): [round(x, 3) for x in v] for k, v in d.items()} for p, d in times.items()},
              "load_average_at_end": os.getloadavg(), "seconds": round(time.time() - t0, 1)}
    save_results("bench_threads_under_load", result)
    return result


if __name__ == "__main__":
    main()
