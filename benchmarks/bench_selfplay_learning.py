"""Which ingredients make text-game self-play learn? An ablation, side by side, in one run.

Each variant runs `recipes/selfplay_games.py` on the embedded model for the same number
of steps and seeds, evaluating the exact metrics every few steps. Printed per variant
(mean over seeds): the final and best Nim optimal-move probability (expected under the
policy over all positions), the first wall time it reached 0.95, the worst position,
and the training-policy entropy at the end (collapse shows as entropy -> 0).

    python benchmarks/bench_selfplay_learning.py [--game nim] [--steps 40] [--seeds 0 1]
                                                 [--variants plain,kl,kl_clip,full]

Variants (each adds to the one before, as in the issue's probe):
  plain    REINFORCE on the answer tokens, RAE baselines, mirror self-play only
  kl       + KL to the initial policy (the config's beta, 0.2)
  kl_clip  + PPO clipping 0.2 with 2 passes per batch (the config's)
  full     + league (frozen snapshots, 10% random bot)
  resets   + 30% random legal resets (baselines kept per start condition)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from lmselfplay.utils.results import save_results

ROOT = Path(__file__).resolve().parents[1]

MIRROR_ONLY = dict(mirror_fraction=1.0, recent_fraction=0.0, hall_of_fame_fraction=0.0, bot_fraction=0.0)
# The KL coefficient, PPO clip and passes of kl / kl_clip / full are the recipe config's own
# (recipes/configs/selfplay_games.yaml); plain switches all of them off.
VARIANTS = {
    "plain": dict(beta=0.0, num_iterations=1, epsilon=1e9, **MIRROR_ONLY),
    "kl": dict(num_iterations=1, epsilon=1e9, **MIRROR_ONLY),
    "kl_clip": dict(**MIRROR_ONLY),
    "full": dict(),
    "resets": dict(reset_fraction=0.3),
}
# Per game: episodes per step (Kuhn hands are 1-3 short turns: cheap, and very noisy) and
# the level that counts as "reached" (optimal-move prob >=, exploitability <=).
GAME_SETTINGS = {"nim": dict(episodes_per_step=48), "nim_misere": dict(episodes_per_step=48),
                 "tictactoe": dict(episodes_per_step=48), "kuhn_poker": dict(episodes_per_step=128)}
TARGET = {"nim": 0.95, "nim_misere": 0.95, "tictactoe": 0.8, "kuhn_poker": 0.15}


def load_recipe():
    from lmselfplay.utils.recipe_loader import load_recipe as _load

    return _load("selfplay_games")


def run(recipe, game, variant, seed, steps, eval_every, out, extra):
    args = {"games": game, "max_steps": steps, "seed": seed, "eval_every": eval_every, "eval_games": 60,
            "eval_positions": 200, "checkpoint_every": 0, "output_dir": str(out), **GAME_SETTINGS.get(game, {}),
            **VARIANTS[variant], **extra}
    argv = ["--config", str(ROOT / "recipes" / "configs" / "selfplay_games.yaml")]
    for k, v in args.items():
        argv += [f"--{k}", str(v)]
    recipe.main(argv)
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def summarize(rows, game):
    key = f"{game}/optimal_move_prob" if game != "kuhn_poker" else "kuhn_poker/exploitability"
    evals = [(r["step"], r["wall_s"], r[key]) for r in rows if key in r]
    ent = [r["train/entropy"] for r in rows if "train/entropy" in r]
    better = (lambda a, b: a < b) if game == "kuhn_poker" else (lambda a, b: a > b)
    best = evals[0][2]
    for _, _, v in evals:
        best = v if better(v, best) else best
    target = TARGET.get(game, 0.95)
    hit = next((w for _, w, v in evals if (v <= target if game == "kuhn_poker" else v >= target)), float("nan"))
    worst = [r.get(f"{game}/min_optimal_prob", float("nan")) for r in rows if key in r][-1]
    win = [r.get(f"{game}/win_vs_random", float("nan")) for r in rows if key in r]
    return {"start": evals[0][2], "final": evals[-1][2], "best": best, "t_hit": hit, "worst_pos": worst,
            "win_vs_random": win[-1], "entropy_end": ent[-1] if ent else float("nan"), "wall": rows[-1]["wall_s"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--game", default="nim")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--variants", default="plain,kl,kl_clip,full")
    ap.add_argument("--set", nargs="*", default=[], help="extra key=value for every run")
    args = ap.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.set)
    recipe = load_recipe()
    table = {}
    for variant in args.variants.split(","):
        res = []
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as d:
                rows = run(recipe, args.game, variant, seed, args.steps, args.eval_every, d, extra)
                res.append(summarize(rows, args.game))
                print(f"[{variant} seed {seed}] {res[-1]}", flush=True)
        table[variant] = res
    metric = "exploitability" if args.game == "kuhn_poker" else "optimal-move prob"
    print(f"\n{args.game}: {metric} (mean over seeds {args.seeds}, {args.steps} steps; "
          f"t_hit: first wall time at {'<=' if args.game == 'kuhn_poker' else '>='} {TARGET.get(args.game, 0.95)})")
    print(f"{'variant':<10} {'start':>7} {'final':>7} {'best':>7} {'worst pos':>9} {'win/rand':>8} "
          f"{'entropy':>8} {'t_hit(s)':>9} {'wall(s)':>8}")
    for v, res in table.items():
        m = {k: float(np.nanmean([r[k] for r in res])) if not all(np.isnan(r[k]) for r in res) else float("nan")
             for k in res[0]}
        print(f"{v:<10} {m['start']:7.3f} {m['final']:7.3f} {m['best']:7.3f} {m['worst_pos']:9.3f} "
              f"{m['win_vs_random']:8.3f} {m['entropy_end']:8.3f} {m['t_hit']:9.0f} {m['wall']:8.0f}")
    save_results(f"bench_selfplay_learning_{args.game}", {"seeds": args.seeds, "steps": args.steps, "per_seed": table})


if __name__ == "__main__":
    main()
