"""Can the model represent an equilibrium of a small imperfect-information game at all?

Supervised distillation of a known equilibrium (the game's ``nash_policy``) into the model
with the self-play trainer's target loss (:func:`lmselfplay.rl.average_policy.distill_samples`,
the same samples the average-policy option distils with). Printed every few steps: the exact
exploitability of the model's policy and the largest gap to the target at any information
set. If this reaches ~0 quickly while self-play does not, the learning signal, not the
model, is what stops self-play short of equilibrium.

    python benchmarks/bench_distill_equilibrium.py [--game kuhn_poker] [--steps 60] [--lr 1e-3]
"""

from __future__ import annotations

import argparse
import os
import time

from lmselfplay.utils.results import save_results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--game", default="kuhn_poker")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--model", default=None, help="model path (default: the embedded model)")
    ap.add_argument("--name", default="distill_equilibrium")
    args = ap.parse_args()
    import torch
    from tqdm.auto import tqdm

    torch.set_num_threads(1)
    from lmselfplay.games import make
    from lmselfplay.games.exploitability import exploitability
    from lmselfplay.lm.engines import HFEngine
    from lmselfplay.lm.readout import tabular_policy
    from lmselfplay.models.policy import PolicyConfig, load_policy
    from lmselfplay.rl.average_policy import distill_samples
    from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig

    game = make(args.game)
    cfg = PolicyConfig() if args.model is None else PolicyConfig(model_name_or_path=args.model)
    model, tok = load_policy(cfg, device="cpu")
    trainer = PolicyTrainer(model, tok, TrainerConfig(learning_rate=args.lr, beta=0.0), total_steps=args.steps)
    target = game.nash_policy()
    samples = distill_samples(game, tok, target)
    curve, t0, load = [], time.time(), os.getloadavg()[0]
    for step in tqdm(range(args.steps + 1), desc="distil equilibrium"):
        if step % args.every == 0 or step == args.steps:
            pol = tabular_policy(HFEngine(trainer.unwrapped, tok), tok, game)
            gap = max(abs(p - q) for k in pol for p, q in zip(pol[k], target[k]))
            curve.append({"step": step, "wall_s": time.time() - t0, "exploitability": exploitability(game, pol),
                          "max_gap": gap})
        if step < args.steps:
            trainer.step(samples)
    print(f"\n{args.game}: supervised distillation of an equilibrium, lr {args.lr} (load {load:.1f})")
    print(f"{'step':>5} {'exploitability':>14} {'max |dP|':>9} {'wall(s)':>8}")
    for r in curve:
        print(f"{r['step']:5d} {r['exploitability']:14.3f} {r['max_gap']:9.3f} {r['wall_s']:8.0f}")
    path = save_results(args.name, {"game": args.game, "lr": args.lr, "steps": args.steps, "load_start": load,
                                    "curve": curve})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
