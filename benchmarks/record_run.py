"""Record a finished recipe run's evaluations as a results file (what the README cites), and
draw a recorded file's figure (what the docs show).

    python benchmarks/record_run.py runs/selfplay_games --name main_job
    python benchmarks/record_run.py --plot benchmarks/results/main_job_v6.json

Recording reads ``RUN/metrics.jsonl`` and keeps the evaluation rows (those with exact game
metrics, held-out accuracies or referee-study measures), merged per step, plus the run's wall
time and config, into ``benchmarks/results/NAME.json``.

``--plot FILE`` draws FILE's curves as a PNG beside it (``--out`` elsewhere): a results file's
evaluation rows as a grid, a row per game with the metrics the game declares worth a curve and
their reference lines (optimal play, Nash equilibrium, the uniform random policy); a referee
study's rows (``.jsonl``) as its measures per referee.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lmselfplay.utils.results import save_results

EVAL_MARKERS = ("/win_vs_", "/optimal_move_prob", "/exploitability", "heldout", "study/", "eval/raw_")


def evaluation_rows(run: Path) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if any(m in k for k in row for m in EVAL_MARKERS):
            rows.setdefault(str(row["step"]), {}).update({k: v for k, v in row.items() if k != "step"})
    return rows


def plot_evaluations(results: Path, out: Path) -> Path | None:
    """The grid of a results file's evaluation rows: the games' headline metrics per step."""
    from lmselfplay.eval.game_metrics import headline_metrics, plot_annotations
    from lmselfplay.games import make
    from lmselfplay.utils.curves import group_of, plot_curves

    data = json.loads(results.read_text())
    rows = [{"step": int(step), **row} for step, row in data["results"]["evaluations"].items()]
    references, titles = plot_annotations(group_of(k) for r in rows for k in r if "/" in k)
    keys = [f"{g}/{m}" for g in titles for m in headline_metrics(make(g))]
    return plot_curves(sorted(rows, key=lambda r: r["step"]), keys, out, references=references, titles=titles,
                       title=f"{data['name']}: the policy's exact metrics per self-play step (95% intervals shaded)")


def plot_file(path: Path, out: Path | None) -> Path | None:
    out = out or path.with_suffix(".png")
    if path.suffix == ".jsonl":  # a referee study's rows
        from lmselfplay.referee_study import plot
        from lmselfplay.utils.metrics_logger import read_jsonl

        return plot(path.parent, read_jsonl(path), out)
    return plot_evaluations(path, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, nargs="?", help="the run folder to record")
    ap.add_argument("--name", help="results file name (benchmarks/results/NAME.json)")
    ap.add_argument("--plot", type=Path, help="draw this results file's figure instead of recording")
    ap.add_argument("--out", type=Path, help="the figure's path (default: beside --plot's file, .png)")
    args = ap.parse_args(argv)
    if args.plot:
        png = plot_file(args.plot, args.out)
        print(f"figure: {png}" if png else f"error: nothing to plot in {args.plot}", file=sys.stdout if png else sys.stderr)
        return 0 if png else 2
    if args.run is None or args.name is None:
        ap.error("recording needs RUN and --name (or --plot FILE)")
    if not (args.run / "metrics.jsonl").is_file():
        print(f"error: no metrics.jsonl in {args.run}", file=sys.stderr)
        return 2
    config = json.loads((args.run / "config.json").read_text()) if (args.run / "config.json").is_file() else {}
    save_results(args.name, {"evaluations": evaluation_rows(args.run), "config": config})
    return 0


if __name__ == "__main__":
    sys.exit(main())
