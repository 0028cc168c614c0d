"""The main job on Leduc poker (``openspiel:leduc_poker``): exploitability before and after, over seeds,
and the distance of the learned policy to a CFR+ solution of the same game.

For each seed, one after the other: ``recipes/selfplay_games.py --config recipes/configs/selfplay_leduc.yaml
--seed S`` in a subprocess (its wall time measured as it ran, under whatever else ran), then from its
``metrics.jsonl`` the exploitability of the policy read off the model before training (step 0) and after
(the final evaluation), both by OpenSpiel's ``exploitability`` on the bare readout. Then this project's
CFR+ (:mod:`lmselfplay.game_theory.cfr`) solves the same game through the same adapter, and each final
model's policy is compared with it: the gap in exploitability and the mean total-variation distance
over the 936 information states. Mean, worst and a 95% t-interval over seeds go to
``benchmarks/results/<name>.json``.

    python benchmarks/bench_selfplay_leduc.py [--seeds 0 1 2] [--cfr-iterations 2000] [--name selfplay_leduc] [-- RECIPE FLAGS]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lmselfplay.games import make
from lmselfplay.utils.results import save_results

ROOT = Path(__file__).resolve().parents[1]
GAME = "openspiel:leduc_poker"
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(values: list[float]) -> list[float]:
    """95% t-interval of the mean (the value itself for one seed)."""
    m = float(np.mean(values))
    if len(values) < 2:
        return [m, m]
    half = T95.get(len(values) - 1, 1.96) * float(np.std(values, ddof=1)) / math.sqrt(len(values))
    return [m - half, m + half]


def run_seed(seed: int, out: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, str(ROOT / "recipes" / "selfplay_games.py"), "--config",
           str(ROOT / "recipes" / "configs" / "selfplay_leduc.yaml"), "--seed", str(seed),
           "--output_dir", str(out), *extra]
    t0 = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                   stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    key = f"{GAME}/exploitability"
    evals = [(r["step"], r[key]) for r in rows if key in r]
    read = [(r["step"], r[f"{GAME}/read_exploitability"]) for r in rows if f"{GAME}/read_exploitability" in r]
    before = evals[0][1] if evals and evals[0][0] == 0 else read[0][1]
    print(f"seed {seed}: exploitability {before:.4f} -> {evals[-1][1]:.4f} in {wall:.0f} s", flush=True)
    return {"seed": seed, "wall_s": wall, "before": before, "after": evals[-1][1], "curve": evals,
            "read_curve": read, "model": str(out / "final_model")}


def policy_of(model_dir: str, game) -> dict[str, list[float]]:
    from lmselfplay.lm.engines import HFEngine
    from lmselfplay.lm.readout import tabular_policy
    from lmselfplay.models.policy import load_policy

    model, tok = load_policy(model_name_or_path=model_dir)
    return tabular_policy(HFEngine(model, tok), tok, game)


def distance(policy: dict[str, list[float]], reference: dict[str, np.ndarray], game) -> float:
    """Mean total-variation distance over the reference's information states (legal actions only)."""
    out = []
    for key, ref in reference.items():
        p = np.asarray(policy[key], dtype=float)
        legal = np.asarray(ref) > 0
        q = np.asarray(ref, dtype=float)
        mask = legal | (p > 0)
        out.append(0.5 * float(np.abs(p[mask] / max(p[mask].sum(), 1e-12) - q[mask]).sum()))
    return float(np.mean(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cfr-iterations", type=int, default=2000)
    ap.add_argument("--name", default="selfplay_leduc")
    ap.add_argument("--out", default=None, help="run folders go here (default: a temporary folder)")
    ap.add_argument("recipe_flags", nargs="*", help="after --: flags for the recipe (reduced sizes)")
    args = ap.parse_args()
    from lmselfplay.game_theory.cfr import CFRPlusSolver

    game = make(GAME)
    t0 = time.time()
    cfr = CFRPlusSolver(game).run(args.cfr_iterations)
    reference = cfr.average_policy()
    cfr_expl = cfr.exploitability()
    print(f"CFR+ {args.cfr_iterations} iterations: exploitability {cfr_expl:.5f} ({time.time() - t0:.0f} s)", flush=True)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.out or tmp)
        for seed in args.seeds:
            r = run_seed(seed, base / f"seed_{seed}", args.recipe_flags)
            pol = policy_of(r.pop("model"), game)
            r["tv_distance_to_cfr"] = distance(pol, reference, game)
            r["exploitability_gap_to_cfr"] = r["after"] - cfr_expl
            runs.append(r)
    before, after = [r["before"] for r in runs], [r["after"] for r in runs]
    results = {
        "game": GAME, "config": "recipes/configs/selfplay_leduc.yaml", "threads": 1, "runs": runs,
        "before_mean": float(np.mean(before)), "before_ci95": interval(before),
        "after_mean": float(np.mean(after)), "after_worst": max(after), "after_ci95": interval(after),
        "drop_mean": float(np.mean(before) - np.mean(after)),
        "falls_beyond_interval": bool(interval(after)[1] < min(before) and all(a < b for a, b in zip(after, before))),
        "wall_s_max": max(r["wall_s"] for r in runs),
        "cfr_plus_iterations": args.cfr_iterations, "cfr_plus_exploitability": cfr_expl,
        "tv_distance_to_cfr_mean": float(np.mean([r["tv_distance_to_cfr"] for r in runs])),
        "uniform_exploitability": game.exact_exploitability({}),
    }
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=1))
    save_results(args.name, results)


if __name__ == "__main__":
    main()
