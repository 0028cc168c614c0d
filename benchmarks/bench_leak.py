"""No slow leaks: the main job's loop (``recipes/selfplay_games.py`` with
``recipes/configs/selfplay_games.yaml``, the embedded model) for ``--steps`` steps, with the
process's RSS and the step time recorded at every step.

Prints RSS and step time at 10%, 50% and 100% of the run (steps 50 / 250 / 500 by default),
their growth from the first point to the last and their slopes per 100 steps. Goal: RSS
growth < 5% and step-time growth < 10%. A step's time is the median over the 10 steps up to
the point, so the evaluation steps (every ``eval_every``) do not decide it.

    OMP_NUM_THREADS=1 python benchmarks/bench_leak.py [--steps 500]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_mb() -> float:
    """Resident set size of this process (Linux /proc; else the peak from resource)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def record_steps(trace: list[tuple[int, float, float]]):
    """Wrap MetricsLogger.log: every training-step row appends (step, time, RSS)."""
    from lmselfplay.utils.metrics_logger import MetricsLogger

    real = MetricsLogger.log

    def log(self, step, values):
        real(self, step, values)
        if "train/loss" in values:
            trace.append((int(step), time.perf_counter(), rss_mb()))

    MetricsLogger.log = log


def summarize(trace: list[tuple[int, float, float]], steps: int) -> dict:
    dt = {s: t - trace[i - 1][1] for i, (s, t, _) in enumerate(trace) if i > 0}
    rss = {s: r for s, _, r in trace}
    points = sorted({max(2, steps // 10), max(3, steps // 2), steps})
    rows = []
    for p in points:
        window = [dt[s] for s in range(max(2, p - 9), p + 1) if s in dt]
        rows.append({"step": p, "rss_mb": rss[p], "step_s": statistics.median(window)})
    first, last = rows[0], rows[-1]
    span = (last["step"] - first["step"]) / 100
    return {"steps": steps, "points": rows,
            "rss_growth_pct": 100 * (last["rss_mb"] / first["rss_mb"] - 1),
            "step_time_growth_pct": 100 * (last["step_s"] / first["step_s"] - 1),
            "rss_slope_mb_per_100_steps": (last["rss_mb"] - first["rss_mb"]) / span,
            "step_time_slope_s_per_100_steps": (last["step_s"] - first["step_s"]) / span}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--config", default=str(ROOT / "recipes" / "configs" / "selfplay_games.yaml"))
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 episodes per step, no evaluation or "
                    "checkpoints (the numbers mean nothing; use with --steps 3)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    from lmselfplay.utils.recipe_loader import run_recipe
    from lmselfplay.utils.results import save_results

    trace: list[tuple[int, float, float]] = []
    record_steps(trace)
    with tempfile.TemporaryDirectory() as out:
        t0 = time.time()
        quick = ["--episodes_per_step", "4", "--eval_every", "0", "--checkpoint_every", "0"] if args.quick else []
        run_recipe("selfplay_games", ["--config", args.config, "--max_steps", str(args.steps), "--output_dir", out,
                                      *quick])
        wall = time.time() - t0
    res = summarize(trace, args.steps)
    res["wall_s"] = wall
    print(f"\n{'step':>6} {'RSS MB':>9} {'step s':>8}")
    for r in res["points"]:
        print(f"{r['step']:>6} {r['rss_mb']:>9.1f} {r['step_s']:>8.3f}")
    print(f"RSS growth {res['rss_growth_pct']:+.1f}% (goal < 5%), slope {res['rss_slope_mb_per_100_steps']:+.2f} MB/100 steps")
    print(f"step-time growth {res['step_time_growth_pct']:+.1f}% (goal < 10%), "
          f"slope {res['step_time_slope_s_per_100_steps']:+.4f} s/100 steps")
    save_results("leak", res)


if __name__ == "__main__":
    main()
