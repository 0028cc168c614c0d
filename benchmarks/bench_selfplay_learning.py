"""Which ingredients make text-game self-play learn? Variants side by side, per seed.

Each variant runs `recipes/selfplay_games.py` on the embedded model for the same number
of steps and seeds, evaluating the exact metrics every few steps. Printed per run: start,
final and best value of the game's headline metric (Nim: the optimal-move probability,
expected under the policy; Kuhn: exploitability), the first step and wall time it reached
the target, the policy entropy at the end (collapse shows as entropy -> 0), the run's wall
time, and the machine's load average (wall times on a shared machine are not speed claims).
The curves of every run go to the results JSON and a PNG beside it.

    python benchmarks/bench_selfplay_learning.py [--game nim] [--steps 40] [--seeds 0 1]
                                                 [--variants plain,kl,kl_clip,full] [--name NAME]

Variants (the first four add to the one before, as in the issue's probe):
  plain    REINFORCE on the answer tokens, RAE baselines, mirror self-play only
  kl       + KL to the initial policy (the config's beta)
  kl_clip  + PPO clipping 0.2 with 2 passes per batch (the config's)
  full     + league (frozen snapshots, 10% random bot): the recipe config as it is
  resets   full + 30% random legal resets (baselines kept per start condition)
  fixed    full with the KL reference fixed at the initial policy (ref_update_every 0)
  magnet   full + magnetic mirror descent: the KL reference moves to the current policy
           every 10 steps
  exact_kl fixed with the exact KL(ref || policy) over the vocabulary at every answer token
           instead of the sampled token's k3 term (kl_estimator: exact)
  anneal   full with the KL to the initial policy annealed: beta 0.5 -> 0.05 (cosine)
  anneal_floor  the same, 0.5 -> 0.15
  average  fixed + the average policy (games whose exact metric is exploitability): the
           reach-weighted average of the policy every 5 steps, distilled into the model at the
           end (100 supervised steps); printed: the average's exploitability (avg), the
           distilled model's (dist), and the average of the iterates from step S on, for
           every evaluated S (computed from the logged policies, no extra run)
  exact    the game is not played (exact_games: the game; Kuhn poker or Nim): every step the
           referee computes the exact value of every action at every information set
           (Nim: position) against the policy read off the model, and the magnetic-mirror-descent target (eta 1, alpha 0.3,
           magnet moved every 10 steps) is distilled into it (feedback: exact; no league: no
           game is played); 2 passes over the targets per step (the config's num_iterations)
  exact_6passes  the same with 6 passes per step, so the model gets close to each target before
           the next is computed; printed for both: the largest |P(read) - P(previous target)|
           (distill gap) and the largest |P(target) - P(read)| (MMD step), mean of the last 10 steps
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

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
    "fixed": dict(ref_update_every=0),
    "magnet": dict(ref_update_every=10),
    "exact_kl": dict(ref_update_every=0, kl_estimator="exact"),
    "anneal": dict(beta=0.5, beta_schedule="cosine", beta_final_ratio=0.1, ref_update_every=0),
    "anneal_floor": dict(beta=0.5, beta_schedule="cosine", beta_final_ratio=0.3, ref_update_every=0),
    "average": dict(ref_update_every=0, average_policy="true", average_every=5, distill_steps=100),
    "exact": dict(feedback="exact", mmd_eta=1.0, mmd_alpha=0.3, mmd_magnet_every=10, ref_update_every=0,
                  league_add_every=0),
    "exact_6passes": dict(feedback="exact", mmd_eta=1.0, mmd_alpha=0.3, mmd_magnet_every=10, ref_update_every=0,
                          league_add_every=0, num_iterations=6),
}
# Per game: episodes per step (Kuhn hands are 1-3 short turns: cheap, and very noisy) and
# the level that counts as "reached" (optimal-move prob >=, exploitability <=).
GAME_SETTINGS = {"nim": dict(episodes_per_step=48), "nim_misere": dict(episodes_per_step=48),
                 "tictactoe": dict(episodes_per_step=48), "kuhn_poker": dict(episodes_per_step=128)}
TARGET = {"nim": 0.95, "nim_misere": 0.95, "tictactoe": 0.8, "kuhn_poker": 0.05}


def run(game, variant, seed, steps, eval_every, out, extra):
    # sampled feedback, role baselines and no extra target passes unless a variant says so, whatever the main
    # job's config does (its recorded results were measured so)
    args = {"games": game, "max_steps": steps, "seed": seed, "eval_every": eval_every, "eval_games": 60,
            "eval_positions": 200, "checkpoint_every": 0, "output_dir": str(out), "feedback": "sampled",
            "baseline_key": "role", "target_passes": 0, **GAME_SETTINGS.get(game, {}),
            **VARIANTS[variant], **extra}
    if args.get("feedback") == "exact":  # the benchmarked game is the one learning from exact feedback
        args.setdefault("exact_games", game)
    argv = ["--config", str(ROOT / "recipes" / "configs" / "selfplay_games.yaml")]
    for k, v in args.items():
        argv += [f"--{k}", str(v)]
    from lmselfplay.utils.recipe_loader import run_recipe

    run_recipe("selfplay_games", argv)
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def headline(game):
    """(metric key, lower is better) of a game, from what it declares it can measure."""
    from lmselfplay.games import make
    from lmselfplay.games.base import OPTIMAL_MOVES

    if make(game).exact_metric == OPTIMAL_MOVES:
        return f"{game}/optimal_move_prob", False
    return f"{game}/exploitability", True


def summarize(rows, game, target):
    key, lower = headline(game)
    evals = [(r["step"], r["wall_s"], r[key]) for r in rows if key in r]
    ent = [r["train/entropy"] for r in rows if "train/entropy" in r]
    values = [v for _, _, v in evals]
    reached = [(s, w) for s, w, v in evals if (v <= target if lower else v >= target)]
    worst = [r.get(f"{game}/min_optimal_prob", float("nan")) for r in rows if key in r][-1]
    win = [r.get(f"{game}/win_vs_random", float("nan")) for r in rows if key in r]
    out = {"start": values[0], "final": values[-1], "best": min(values) if lower else max(values),
           "step_hit": reached[0][0] if reached else float("nan"), "t_hit": reached[0][1] if reached else float("nan"),
           "worst_pos": worst, "win_vs_random": win[-1], "entropy_end": ent[-1] if ent else float("nan"),
           "wall": rows[-1]["wall_s"], "curve": [[s, w, v] for s, w, v in evals]}
    return {**out, **summarize_average(rows, game, target), **summarize_exact(rows, game)}


def summarize_exact(rows, game):
    """With exact feedback: the distillation gap and the MMD step, mean of the last 10 steps."""
    gaps = [r[f"{game}/distill_gap"] for r in rows if f"{game}/distill_gap" in r][-10:]
    steps = [r[f"{game}/mmd_step"] for r in rows if f"{game}/mmd_step" in r][-10:]
    if not gaps:
        return {}
    return {"distill_gap_end": sum(gaps) / len(gaps), "mmd_step_end": sum(steps) / len(steps)}


def summarize_average(rows, game, target):
    """With the average policy on: its exploitability at each evaluation (``avg_curve``),
    the distilled model's at the end, where the average first reached the target, and the
    average of the iterates from step S to the end for every logged S (``avg_from``: would
    leaving out the early iterates help?)."""
    key = f"{game}/avg_exploitability"
    curve = [[r["step"], r["wall_s"], r[key]] for r in rows if key in r]
    if not curve:
        return {}
    from lmselfplay.games import make
    from lmselfplay.games.exploitability import exploitability
    from lmselfplay.rl.average_policy import AveragePolicy

    iterates = [(r["step"], r[f"{game}/iterate_policy"]) for r in rows if f"{game}/iterate_policy" in r]
    avg_from = {}
    for start, _ in iterates:
        avg = AveragePolicy(make(game))
        for step, pol in iterates:
            if step >= start:
                avg.add(pol)
        avg_from[start] = exploitability(avg.game, avg.policy())
    hit = [(s, w) for s, w, v in curve if v <= target]
    return {"avg_final": curve[-1][2], "avg_best": min(v for _, _, v in curve),
            "avg_step_hit": hit[0][0] if hit else float("nan"), "avg_t_hit": hit[0][1] if hit else float("nan"),
            "distilled": rows[-1].get(f"distilled/{game}/exploitability", float("nan")),
            "distill_ce": rows[-1].get("distilled/target_ce", float("nan")),
            "avg_curve": curve, "avg_from": avg_from, "iterates": iterates}


def plot(table, game, path, target, extra=None):
    """The headline metric of every run: a colour per variant, a shade per seed, the
    game's reference lines and the target; settings every run shares go in the title, so
    a legend names a variant only for runs that are that variant."""
    from lmselfplay.eval.game_metrics import plot_annotations
    from lmselfplay.utils.curves import Line, Reference, plot_lines

    key = headline(game)[0]
    lines = []
    for variant, runs in table.items():
        for r in runs:
            lines.append(Line(variant, [(s, v) for s, _, v in r["curve"]], seed=r["seed"]))
            if r.get("avg_curve"):
                lines.append(Line(variant, [(s, v) for s, _, v in r["avg_curve"]], seed=r["seed"],
                                  note="average policy", style="--"))
    references, titles = plot_annotations([game])
    refs = [*references.get(key, []), Reference(target, f"target ({target:g})")]
    shared = ", ".join(f"{k}={v}" for k, v in (extra or {}).items())
    title = f"Which ingredients make self-play learn {titles.get(game, game)}?" + (f" (all runs: {shared})"
                                                                                  if shared else "")
    return plot_lines({key: lines}, path, title, {key: refs}, titles, xlabel="self-play step")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--game", default="nim")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--variants", default="plain,kl,kl_clip,full")
    ap.add_argument("--target", type=float, default=None, help="the level that counts as reached")
    ap.add_argument("--name", default=None, help="results file name (default bench_selfplay_learning_GAME)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (a shared machine: 1)")
    ap.add_argument("--set", nargs="*", default=[], help="extra key=value for every run")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    extra = dict(kv.split("=", 1) for kv in args.set)
    target = TARGET.get(args.game, 0.95) if args.target is None else args.target
    name = args.name or f"bench_selfplay_learning_{args.game}"
    table = {}
    for variant in args.variants.split(","):
        res = []
        for seed in args.seeds:
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory() as d:
                rows = run(args.game, variant, seed, args.steps, args.eval_every, d, extra)
                res.append({"seed": seed, **summarize(rows, args.game, target), "load_start": load,
                            "load_end": os.getloadavg()[0]})
            print(f"[{variant} seed {seed}] " + ", ".join(f"{k}={v:.3f}" for k, v in res[-1].items()
                                                        if isinstance(v, float)), flush=True)
            table[variant] = res
            save_results(name, {"game": args.game, "target": target, "seeds": args.seeds, "steps": args.steps,
                                "extra": extra, "per_seed": table, "partial": True})  # a killed run keeps its seeds
    key, lower = headline(args.game)
    print(f"\n{args.game}: {key} ({args.steps} steps, evaluated every {args.eval_every}; hit: first eval at "
          f"{'<=' if lower else '>='} {target}; load: 1-min load average at start/end of the run)")
    print(f"{'variant':<10} {'seed':>4} {'start':>6} {'final':>6} {'best':>6} {'step_hit':>8} {'t_hit(s)':>8} "
          f"{'entropy':>7} {'wall(s)':>7} {'load':>9}  curve (step:value)")
    for v, res in table.items():
        for r in res:
            curve = " ".join(f"{s}:{x:.3f}" for s, _, x in r["curve"])
            print(f"{v:<10} {r['seed']:>4} {r['start']:6.3f} {r['final']:6.3f} {r['best']:6.3f} {r['step_hit']:8.0f} "
                  f"{r['t_hit']:8.0f} {r['entropy_end']:7.3f} {r['wall']:7.0f} {r['load_start']:4.1f}/{r['load_end']:<4.1f}"
                  f"  {curve}")
            if r.get("avg_curve"):
                curve = " ".join(f"{s}:{x:.3f}" for s, _, x in r["avg_curve"])
                tail = " ".join(f"{s}:{x:.3f}" for s, x in r["avg_from"].items())
                print(f"{'':<10} {'':>4} average: final {r['avg_final']:.3f} best {r['avg_best']:.3f} hit step "
                      f"{r['avg_step_hit']:.0f} ({r['avg_t_hit']:.0f} s); distilled {r['distilled']:.3f} "
                      f"(target CE {r['distill_ce']:.3f})  curve {curve}\n{'':<16}average from step S to the end: {tail}")
    path = save_results(name, {"game": args.game, "metric": key, "target": target, "seeds": args.seeds,
                               "steps": args.steps, "extra": extra, "per_seed": table})
    png = path.with_suffix(".png")
    plot(table, args.game, png, target, extra)
    print(f"curves: {png}")


if __name__ == "__main__":
    main()
