"""The default test run's wall time: two prepared checkouts timed alternately on one machine.

Each checkout is a clone set up as README command 2 does (``bash .ci/setup``: its own ``.venv``).
A round runs the base checkout's ``pytest -q``, then the new one's, each as README command 2 runs
it (from the checkout's root, with its own interpreter), so drift of a noisy machine falls on both
sides of a round; the ratio is new / base per round and of the means. A run that does not pass
(exit status not 0) is reported and stops the benchmark: a failing suite's time means nothing.

    python benchmarks/bench_test_suite.py --base /tmp/clone_base --new /tmp/clone_new [--rounds 2]

Run it on an otherwise idle machine: the suite uses every core.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from lmselfplay.utils.results import save_results

COMMAND = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
SUMMARY = re.compile(r"^=*\s*(?P<counts>\d+ passed.*?) in [\d.]+s", re.M)


def checkout_python(path: str) -> Path:
    """The checkout's interpreter; SystemExit (one line) if ``path`` is not a set-up checkout."""
    python = Path(path) / ".venv" / "bin" / "python"
    if not (Path(path) / "pyproject.toml").is_file() or not python.exists():
        raise SystemExit(f"error: {path} is not a checkout set up with `bash .ci/setup` (no pyproject.toml "
                         f"or .venv/bin/python there)")
    return python


def time_suite(path: str, timeout_s: float) -> dict:
    """One default test run of the checkout at ``path``: wall seconds, the summary counts, exit status."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([str(checkout_python(path)), *COMMAND], cwd=path, capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"checkout": path, "wall_s": round(time.perf_counter() - t0, 3), "returncode": None,
                "summary": f"ran past {timeout_s:.0f} s"}
    found = SUMMARY.findall(proc.stdout)
    last = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
    return {"checkout": path, "wall_s": round(time.perf_counter() - t0, 3), "returncode": proc.returncode,
            "summary": found[-1] if found else last[0]}


def ratios(rounds: list[dict]) -> dict:
    """new / base per round and of the means (3 decimals)."""
    per_round = [round(r["new"]["wall_s"] / r["base"]["wall_s"], 3) for r in rounds]
    mean = (sum(r["new"]["wall_s"] for r in rounds) / sum(r["base"]["wall_s"] for r in rounds))
    return {"per_round": per_round, "of_means": round(mean, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the checkout timed first in each round")
    ap.add_argument("--new", required=True, help="the checkout timed second in each round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout_s", type=float, default=3600.0, help="one run's limit")
    ap.add_argument("--name", default="bench_test_suite", help="results file name (under benchmarks/results/)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    for path in (args.base, args.new):  # both refused before any run
        checkout_python(path)
    rounds = []
    for i in range(args.rounds):
        row = {}
        for side in ("base", "new"):
            row[side] = run = time_suite(getattr(args, side), args.timeout_s)
            print(f"round {i + 1} {side:4s} {run['wall_s']:7.1f} s  {run['summary']}  ({run['checkout']})", flush=True)
            if run["returncode"] != 0:
                print(f"error: the {side} checkout's suite did not pass (exit {run['returncode']}): no ratio",
                      file=sys.stderr)
                return 1
        rounds.append(row)
        print(f"round {i + 1} new/base {row['new']['wall_s'] / row['base']['wall_s']:.3f}", flush=True)
    result = {"rounds": rounds, "ratio_new_over_base": ratios(rounds), "cpus": os.cpu_count()}
    print(f"new/base of the means: {result['ratio_new_over_base']['of_means']:.3f}")
    save_results(args.name, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
