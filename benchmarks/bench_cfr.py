"""CFR iterations per second on Kuhn poker: ours vs OpenSpiel (Python and C++), one run.

All solvers run the same algorithm (alternating updates; CFR+ adds regret matching+
and linear averaging) for the same number of iterations, so they reach the same
NashConv; the table shows it (computed by ``pyspiel.nash_conv`` for every solver, and
by our exact best response for ours) next to the speed. Goal: >= 10x OpenSpiel's Python
``CFRSolver``.

    python benchmarks/bench_cfr.py [--iterations 1000] [--repeats 3]

Speed is the best of ``--repeats`` timings of the iteration loop alone (setup, i.e.
building the tree / info-state tables, is reported separately).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyspiel
from open_spiel.python import policy as os_policy
from open_spiel.python.algorithms import cfr as os_cfr

from lmselfplay.game_theory.cfr import CFRPlusSolver, CFRSolver
from lmselfplay.games.kuhn_poker import KuhnPoker
from lmselfplay.utils.results import save_results


def to_openspiel(game, ours: dict[str, np.ndarray]) -> os_policy.TabularPolicy:
    """Our "J:pb" keys -> OpenSpiel's "0pb"."""
    tab = os_policy.TabularPolicy(game)
    for key, row in tab.state_lookup.items():
        tab.action_probability_array[row] = ours["JQK"[int(key[0])] + ":" + key[1:]]
    return tab


def timed(make, iterations: int, repeats: int):
    best, solver, setup = float("inf"), None, 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        solver = make()
        t1 = time.perf_counter()
        for _ in range(iterations):
            solver.evaluate_and_update_policy()
        t2 = time.perf_counter()
        setup, best = t1 - t0, min(best, t2 - t1)
    return solver, iterations / best, setup


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    os_game = pyspiel.load_game("kuhn_poker")
    ours_game = KuhnPoker()

    rows = []
    for algo, ours_cls, py_cls, cpp_cls in [
        ("CFR", CFRSolver, os_cfr.CFRSolver, pyspiel.CFRSolver),
        ("CFR+", CFRPlusSolver, os_cfr.CFRPlusSolver, pyspiel.CFRPlusSolver),
    ]:
        ours, ours_ips, ours_setup = timed(lambda c=ours_cls: c(ours_game),
                                           args.iterations, args.repeats)
        py, py_ips, py_setup = timed(lambda c=py_cls: c(os_game), args.iterations, args.repeats)
        cpp, cpp_ips, cpp_setup = timed(lambda c=cpp_cls: c(os_game),
                                        args.iterations, args.repeats)
        ours_avg = ours.average_policy()
        ours_nc_os = pyspiel.nash_conv(
            os_game, os_policy.python_policy_to_pyspiel_policy(to_openspiel(os_game, ours_avg)))
        ours_nc = ours.nash_conv()
        py_nc = pyspiel.nash_conv(
            os_game, os_policy.python_policy_to_pyspiel_policy(py.average_policy()))
        cpp_nc = pyspiel.nash_conv(os_game, cpp.average_policy())
        rows += [(algo, "lmselfplay (numpy)", ours_ips, ours_setup, ours_nc_os, ours_nc),
                 (algo, "OpenSpiel Python", py_ips, py_setup, py_nc, None),
                 (algo, "OpenSpiel C++", cpp_ips, cpp_setup, cpp_nc, None)]
        print(f"{algo:5s} ours/Python = {ours_ips / py_ips:6.1f}x   "
              f"ours/C++ = {ours_ips / cpp_ips:5.2f}x   "
              f"(NashConv after {args.iterations} it: ours {ours_nc_os:.3e}, "
              f"Python {py_nc:.3e}, C++ {cpp_nc:.3e})")

    print(f"\nKuhn poker, {args.iterations} iterations, best of {args.repeats}")
    print(f"{'algo':5s} {'solver':20s} {'it/s':>10s} {'setup s':>8s} "
          f"{'NashConv (pyspiel)':>19s} {'NashConv (ours)':>16s}")
    for algo, name, ips, setup, nc, nc_ours in rows:
        ours_col = f"{nc_ours:16.3e}" if nc_ours is not None else f"{'':16s}"
        print(f"{algo:5s} {name:20s} {ips:10.0f} {setup:8.3f} {nc:19.3e} {ours_col}")
    save_results("bench_cfr", [{"algo": algo, "solver": name, "it_per_s": ips, "setup_s": setup,
                                "nash_conv": nc} for algo, name, ips, setup, nc, _ in rows])


if __name__ == "__main__":
    main()
