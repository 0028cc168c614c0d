"""Speed of PUCT search with the LLM as evaluator: simulations/s at 64 trees, and where the
time goes (the LLM forward vs the tree code).

64 tic-tac-toe roots (the initial position and random legal openings), ``--sims``
simulations each, one LLM batch per wave. Two settings: the evaluation cache OFF (cleared
before every wave: every new leaf is a forward, the LLM's raw throughput) and ON (as the
recipe runs it within one weights version). Tree time = wall time - LLM forward time.

    nice -n 5 python benchmarks/bench_search_selfplay.py [--trees 64 --sims 64 --threads 1]
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from lmselfplay.alphazero.adapter import CachedGame, SearchGame
from lmselfplay.alphazero.batched_mcts import BatchedMCTS
from lmselfplay.games import make
from lmselfplay.games.base import random_legal_reset
from lmselfplay.lm.search_eval import LLMEvaluator, ValueHead, hidden_size
from lmselfplay.models.policy import load_policy
from lmselfplay.utils.results import save_results


class NoCache:
    """The evaluator with its cache emptied before every call (every leaf is a forward)."""

    def __init__(self, ev):
        self.ev = ev

    def __call__(self, states):
        self.ev.clear()
        return self.ev(states)


def run(face, roots, ev, sims, cached):
    ev.clear()
    ev.forward_seconds, ev.forwards = 0.0, 0
    search = BatchedMCTS(face, ev if cached else NoCache(ev), capacity=len(roots) * (sims + 1))
    t0 = time.perf_counter()
    search.set_roots(roots)
    search.search(sims)
    wall = time.perf_counter() - t0
    n = len(roots) * sims
    return {"cache": cached, "simulations": n, "seconds": wall, "sims_per_s": n / wall,
            "llm_positions": ev.forwards, "llm_seconds": ev.forward_seconds,
            "llm_share": ev.forward_seconds / wall, "tree_share": 1 - ev.forward_seconds / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=64)
    ap.add_argument("--sims", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--game", default="tictactoe")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_policy()
    game = make(args.game)
    face = CachedGame(SearchGame(game))
    rng = random.Random(0)
    roots = [face.position(random_legal_reset(game, rng, 2) if i else game.new_initial_state())
             for i in range(args.trees)]
    ev = LLMEvaluator(model, tok, game, ValueHead(hidden_size(model)), batch_size=256)
    rows = [run(face, roots, ev, args.sims, cached) for cached in (False, True)]
    for r in rows:
        print(f"cache {'on ' if r['cache'] else 'off'}: {r['sims_per_s']:8.1f} simulations/s  "
              f"({r['simulations']} in {r['seconds']:.1f} s; {r['llm_positions']} LLM positions)  "
              f"LLM forward {100 * r['llm_share']:.0f}%  tree code {100 * r['tree_share']:.0f}%")
    print(f"cache speed-up: {rows[1]['sims_per_s'] / rows[0]['sims_per_s']:.1f}x")
    save_results("bench_search_selfplay", {"args": vars(args), "runs": rows})


if __name__ == "__main__":
    main()
