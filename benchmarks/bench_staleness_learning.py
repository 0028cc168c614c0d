"""Does overlapping generation with training (``max_staleness: 1``) change what self-play learns?

Side by side, per seed: `recipes/selfplay_games.py` on Nim (sampled self-play, the recipe's
config otherwise) with ``engine: vllm-server`` against a generation server that holds its own
copy of the embedded model and follows the weight push
(``tests/hf_server.py``, in its own process, CPU), ``max_staleness`` 0
(on-policy: push, play, train) vs 1 (the next step's games are played while this step trains,
one weight version behind), and 1 with ``tis_cap: 2`` (truncated importance sampling of that
lag). A simulated server would not do: its answers do not depend on the weights, so every
setting would learn the same by construction.

Printed per run: Nim's exact P(optimal move) at the start and end, the last step's loss,
the mean staleness age and the games dropped; then per setting the mean and spread over seeds,
and each setting's difference from the first one's mean beside the seed-to-seed noise of such
a difference.

    python benchmarks/bench_staleness_learning.py [--steps 30] [--seeds 0 1 2] [--settings k0,k1,k1_tis]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the CPU servers

from sim_server import ServerProcess  # noqa: E402

from lmselfplay.utils.results import save_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KEY = "nim/optimal_move_prob"
# each setting's overrides of the run; the first is the on-policy baseline the others are set against
SETTINGS = {"k0": {"max_staleness": 0}, "k1": {"max_staleness": 1},
            "k1_tis": {"max_staleness": 1, "tis_cap": 2.0}}  # + truncated importance sampling of the lag


def run(model: str, setting: dict, seed: int, steps: int, eval_every: int, episodes: int, out: Path) -> list[dict]:
    from lmselfplay.utils.recipe_loader import run_recipe

    args = {"model_name_or_path": model, "games": "nim", "max_steps": steps, "seed": seed, "eval_every": eval_every,
            "eval_games": 60, "eval_positions": 200, "checkpoint_every": 0, "output_dir": str(out),
            "feedback": "sampled", "baseline_key": "role", "target_passes": 0, "episodes_per_step": episodes, "engine": "vllm-server",
            "vllm_server_timeout": 120, "vllm_push_timeout": 120, **setting}
    argv = ["--config", str(ROOT / "recipes" / "configs" / "selfplay_games.yaml")]
    for key, v in args.items():
        argv += [f"--{key}", str(v)]
    with ServerProcess("hf_server", "--model", model) as server:
        run_recipe("selfplay_games", argv + ["--vllm_server_urls", server.url])
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def summarize(rows: list[dict]) -> dict:
    evals = [(r["step"], r[KEY]) for r in rows if KEY in r]
    train = [r for r in rows if "train/loss" in r]
    ages = [r["staleness/age"] for r in train if "staleness/age" in r]
    return {"start": evals[0][1], "final": evals[-1][1], "curve": evals, "final_loss": train[-1]["train/loss"],
            "mean_loss_last5": statistics.mean(r["train/loss"] for r in train[-5:]),
            "mean_age": statistics.mean(ages) if ages else 0.0,
            "dropped": sum(r.get("staleness/dropped", 0.0) for r in train), "wall_s": rows[-1]["wall_s"]}


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--eval_every", type=int, default=15)
    ap.add_argument("--episodes", type=int, default=48, help="Nim games per step")
    ap.add_argument("--settings", default="k0,k1,k1_tis", help=f"comma-separated, of {', '.join(SETTINGS)}")
    ap.add_argument("--name", default="bench_staleness_learning", help="results file name")
    ap.add_argument("--out_dir", default=None)
    args = ap.parse_args()
    import torch

    from lmselfplay.models.cache import ensure_tiny_model

    names = args.settings.split(",")
    if unknown := [n for n in names if n not in SETTINGS]:
        raise SystemExit(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    torch.set_num_threads(1)
    model = str(ensure_tiny_model(progress=False))
    runs: dict[str, list[dict]] = {n: [] for n in names}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for n in names:
                r = summarize(run(model, SETTINGS[n], seed, args.steps, args.eval_every, args.episodes,
                                  Path(tmp) / f"{n}_s{seed}"))
                runs[n].append({"seed": seed, **r})
                print(f"{n} seed {seed}: {KEY} {r['start']:.3f} -> {r['final']:.3f}, loss {r['final_loss']:.4f}, "
                      f"mean age {r['mean_age']:.2f}, dropped {r['dropped']:.0f}, {r['wall_s']:.0f} s", flush=True)
    table = {}
    for n, rs in runs.items():
        finals = [r["final"] for r in rs]
        table[n] = {**SETTINGS[n], "final_mean": statistics.mean(finals), "final_sd": spread(finals),
                    "loss_mean": statistics.mean(r["final_loss"] for r in rs),
                    "loss_sd": spread([r["final_loss"] for r in rs]), "start_mean": statistics.mean(r["start"] for r in rs)}
        print(f"{n}: final {KEY} {table[n]['final_mean']:.3f} +- {table[n]['final_sd']:.3f} (sd over {len(rs)} seeds), "
              f"final loss {table[n]['loss_mean']:.4f} +- {table[n]['loss_sd']:.4f}")
    base, versus = names[0], {}
    for n in names[1:]:
        diff = table[n]["final_mean"] - table[base]["final_mean"]
        # the noise of a difference of two means of n seeds each: sd x sqrt(2 / n), both settings' sd pooled
        sd = ((table[n]["final_sd"] ** 2 + table[base]["final_sd"] ** 2) / 2) ** 0.5
        noise = sd * (2 / len(args.seeds)) ** 0.5
        versus[n] = {"final_diff": diff, "noise_of_diff": noise, "within_2_noise": abs(diff) <= 2 * noise}
        print(f"final {KEY}: {n} - {base} = {diff:+.3f}; seed noise of that difference (pooled sd x sqrt(2/n)) "
              f"{noise:.3f} -> {'within' if abs(diff) <= 2 * noise else 'OUTSIDE'} 2 x noise")
    save_results(args.name, {"settings": {n: SETTINGS[n] for n in names}, "runs": runs, "table": table,
                             "versus_" + base: versus, "total_wall_s": time.time() - t0,
                             "load_average_1_5_15": list(os.getloadavg()), "args": vars(args)}, args.out_dir)


if __name__ == "__main__":
    main()
