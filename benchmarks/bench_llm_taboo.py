"""The language model at Adversarial Taboo, before and after self-play: every metric per role.

    python benchmarks/bench_llm_taboo.py --models embedded runs/selfplay_taboo/final_model

For each model: ``--games`` self-play games (the model in both roles) and ``--games`` games
in each role against the scripted bots, on the training words and on the held-out words
(``split="test"``), sampled at temperature 1. Reported with
:func:`lmselfplay.eval.taboo_metrics.taboo_metrics`: attacker / defender / draw rates with
Wilson intervals, rule breaks per role, invalid answers per role, mean length, per-role
entropy. Results: ``benchmarks/results/llm_taboo.json`` (``--name``).
"""

from __future__ import annotations

import argparse

from lmselfplay.eval.taboo_metrics import taboo_metrics, win_rates_vs_bots
from lmselfplay.games import make
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm.engines.base import SamplingParams
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.rollout import Episode, LLMPlayer, play_episodes
from lmselfplay.models.policy import load_policy
from lmselfplay.utils.results import save_results

SHOWN = ("attacker_win", "defender_win", "draw", "attacker_rule_break_rate", "defender_rule_break_rate",
         "attacker_invalid_rate", "defender_invalid_rate", "mean_length", "attacker_entropy", "defender_entropy")


def self_play(engine, tok, game, n: int, sampling) -> dict:
    me = LLMPlayer(engine, tok, learner=True)  # learner: trajectories carry the log-probs (entropy)
    eps = [Episode(game, (me, me), seed=i) for i in range(n)]
    return taboo_metrics(list(play_episodes(eps, sampling, concurrency=64)))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["embedded"],
                    help="model folders; 'embedded' = the embedded tiny model")
    ap.add_argument("--games", type=int, default=100, help="games per (model, split, pairing)")
    ap.add_argument("--max_new_tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="llm_taboo", help="results file: benchmarks/results/NAME.json")
    args = ap.parse_args(argv)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=args.seed, stop=MOVE_STOP)
    rows = []
    for name in args.models:
        model, tok = load_policy(model_name_or_path=None if name == "embedded" else name)
        engine = HFEngine(model, tok)
        for split in ("train", "test"):
            game = make("taboo", split=split)
            row = {"model": name, "split": split, "self_play": self_play(engine, tok, game, args.games, sampling)}
            row.update(win_rates_vs_bots(engine, tok, game, args.games, sampling, seed=args.seed))
            rows.append(row)
            for pairing in ("self_play", "as_attacker", "as_defender"):
                m = row[pairing]
                print(f"{name:<36} {split:<5} {pairing:<11} " + " ".join(f"{k}={m[k]:.3f}" for k in SHOWN))
    result = {"rows": rows, "seed": args.seed, "games": args.games}
    save_results(args.name, result)
    return result


if __name__ == "__main__":
    main()
