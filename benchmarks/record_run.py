"""Record a finished recipe run's evaluations as a results file (what the README cites).

    python benchmarks/record_run.py runs/selfplay_games --name main_job

Reads ``RUN/metrics.jsonl`` and keeps the evaluation rows (those with exact game metrics,
held-out accuracies or referee-study measures), merged per step, plus the run's wall time and
config, into ``benchmarks/results/NAME.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lmselfplay.utils.results import save_results

EVAL_MARKERS = ("/win_vs_", "/optimal_move_prob", "/exploitability", "heldout", "study/")


def evaluation_rows(run: Path) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if any(m in k for k in row for m in EVAL_MARKERS):
            rows.setdefault(str(row["step"]), {}).update({k: v for k, v in row.items() if k != "step"})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--name", required=True)
    args = ap.parse_args(argv)
    if not (args.run / "metrics.jsonl").is_file():
        print(f"error: no metrics.jsonl in {args.run}", file=sys.stderr)
        return 2
    config = json.loads((args.run / "config.json").read_text()) if (args.run / "config.json").is_file() else {}
    save_results(args.name, {"evaluations": evaluation_rows(args.run), "config": config})
    return 0


if __name__ == "__main__":
    sys.exit(main())
