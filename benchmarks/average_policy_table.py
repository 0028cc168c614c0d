"""The average policy of a logged self-play run, information set by information set.

Reads the iterates that ``bench_selfplay_learning.py --variants average`` stores (every
``average_every`` steps, exact tabular policies), averages those from step S on (reach-weighted,
:class:`lmselfplay.rl.average_policy.AveragePolicy`) and prints each set's probabilities next
to the game's equilibrium, with the exploitability of the average.

    python benchmarks/average_policy_table.py benchmarks/results/kuhn_average_probe.json --from 40 [--name NAME]
"""

from __future__ import annotations

import argparse
import json

from lmselfplay.utils.results import save_results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--from", dest="start", type=int, default=0, help="first step averaged")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    from lmselfplay.games import make
    from lmselfplay.games.exploitability import exploitability
    from lmselfplay.rl.average_policy import AveragePolicy

    res = json.load(open(args.results))["results"]
    game = make(res["game"])
    out = {}
    for variant, runs in res["per_seed"].items():
        for run in runs:
            if not run.get("iterates"):
                continue
            avg = AveragePolicy(game)
            for step, pol in run["iterates"]:
                if step >= args.start:
                    avg.add(pol)
            pol, nash = avg.policy(), game.nash_policy()
            expl = exploitability(game, pol)
            print(f"\n{variant} seed {run['seed']}: average of the iterates from step {args.start} "
                  f"({avg.count} iterates), exploitability {expl:.3f}")
            print(f"{'set':<8} {'average':>24} {'equilibrium':>24}")
            for k in sorted(pol):
                fmt = lambda p: " ".join(f"{game.action_text(a)}:{x:.2f}" for a, x in enumerate(p))  # noqa: E731
                print(f"{k:<8} {fmt(pol[k]):>24} {fmt(nash[k]):>24}")
            out[f"{variant}/seed{run['seed']}"] = {"from": args.start, "exploitability": expl, "policy": pol}
    if args.name:
        print(f"results: {save_results(args.name, out)}")


if __name__ == "__main__":
    main()
