"""Search speed: batched PUCT (ours) vs OpenSpiel's Python MCTSBot and C++ pyspiel.MCTSBot.

    python benchmarks/bench_alphazero_speed.py [--trees 1024] [--sims 200] [--repeats 3]

Workload: tic-tac-toe from the empty board, uniform prior, zero value.
Everything is measured in this one run, side by side, as simulations per second:

* ``batched`` — :class:`BatchedMCTS` over ``--trees`` roots, one evaluate call per wave;
  "cold" is the first search (the rule table is empty), "warm" the best later repeat;
* ``mcts`` — the unbatched reference :func:`mcts` (readable, one simulation at a time);
* ``openspiel-python`` — ``open_spiel.python.algorithms.mcts.MCTSBot`` with an evaluator
  returning a uniform prior and zero value, PUCT selection, ``solve=False``;
* ``openspiel-c++`` — ``pyspiel.MCTSBot``; its evaluator must be a C++ one, so it runs
  ``RandomRolloutEvaluator(n_rollouts=1)`` (one random playout per leaf: *more* work per
  leaf than a zero value — the comparison favours us less than it looks).

Goal: batched >= 10x the Python MCTSBot.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from lmselfplay.utils.results import save_results


def rate(fn, sims: int, repeats: int) -> tuple[float, float]:
    """(first-call sims/s, best later sims/s)."""
    out = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        fn()
        out.append(sims / (time.perf_counter() - t))
    return out[0], max(out[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=1024)
    ap.add_argument("--sims", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--openspiel_sims", type=int, default=2000)
    args = ap.parse_args()

    import pyspiel
    from open_spiel.python.algorithms import mcts as osmcts

    from lmselfplay.alphazero.adapter import CachedGame, SearchGame
    from lmselfplay.alphazero.batched_mcts import batched_mcts
    from lmselfplay.alphazero.mcts import mcts, uniform_prior, zero_value
    from lmselfplay.games import TicTacToe

    game = TicTacToe()
    face = CachedGame(SearchGame(game))
    root = face.position(game.new_initial_state())
    c_puct = 2.0

    def evaluate(states):
        return np.ones((len(states), 9)), np.zeros(len(states))

    rows = []
    total = args.trees * args.sims
    cold, warm = rate(lambda: batched_mcts(face, [root] * args.trees, evaluate, args.sims,
                                           c_puct=c_puct), total, args.repeats)
    rows.append(("batched (cold rule table)", cold))
    rows.append((f"batched ({args.trees} trees x {args.sims} sims)", warm))
    plain = SearchGame(game)
    _, ref = rate(lambda: mcts(plain, root, uniform_prior, zero_value, args.sims, c_puct=c_puct),
                  args.sims, args.repeats)
    rows.append(("mcts (unbatched reference)", ref))

    class UniformZero(osmcts.Evaluator):
        def evaluate(self, state):
            return np.zeros(2)

        def prior(self, state):
            legal = state.legal_actions()
            return [(a, 1.0 / len(legal)) for a in legal]

    os_game = pyspiel.load_game("tic_tac_toe")
    os_root = os_game.new_initial_state()
    py_bot = osmcts.MCTSBot(os_game, c_puct, args.openspiel_sims, UniformZero(), solve=False,
                            random_state=np.random.RandomState(0),
                            child_selection_fn=osmcts.SearchNode.puct_value)
    _, py = rate(lambda: py_bot.mcts_search(os_root), args.openspiel_sims, args.repeats)
    rows.append(("openspiel python MCTSBot", py))
    cpp_bot = pyspiel.MCTSBot(os_game, pyspiel.RandomRolloutEvaluator(1, 0), c_puct,
                              args.openspiel_sims, 1000, False, 0, False,
                              pyspiel.ChildSelectionPolicy.PUCT)
    _, cpp = rate(lambda: cpp_bot.step(os_root), args.openspiel_sims, args.repeats)
    rows.append(("openspiel C++ MCTSBot (1 rollout/leaf)", cpp))

    print(f"{'search':45s} {'sims/s':>12s} {'x python bot':>13s}")
    for name, r in rows:
        print(f"{name:45s} {r:12,.0f} {r / py:13.1f}")
    print(f"goal: batched >= 10x python MCTSBot -> {'met' if warm >= 10 * py else 'NOT met'} "
          f"({warm / py:.1f}x warm, {cold / py:.1f}x cold); vs C++ bot: {warm / cpp:.2f}x")
    save_results("bench_alphazero_speed", {"sims_per_s": dict(rows), "batched_warm_over_python_bot": warm / py,
                                           "batched_cold_over_python_bot": cold / py,
                                           "batched_warm_over_cpp_bot": warm / cpp})


if __name__ == "__main__":
    main()
