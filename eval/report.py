"""Per-task and overall tables of pass@k with 95% intervals; JSON and CSV written atomically.

A *record* is one problem's outcome: ``{"id", "task", "n", "correct", "mean_score"}``
(``n`` samples, ``correct`` of them fully right, ``mean_score`` the benchmark's own score
averaged over the samples, in [0, 1]). pass@k per problem is the unbiased estimator
(:func:`lmselfplay.utils.stats.pass_at_k`); a table row averages it over problems
(macro over problems, so "overall" weighs every problem once), with :func:`mean_ci`.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmselfplay.utils.checkpoint import atomic_write_text
from lmselfplay.utils.stats import mean_ci, pass_at_k


def summarize_group(records: Sequence[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    n_min = min((r["n"] for r in records), default=0)
    out: dict[str, Any] = {"problems": len(records), "samples": n_min}
    if not records:
        return out
    for k in sorted(set(ks) | {1}):
        if k > n_min:
            continue
        vals = [pass_at_k(r["n"], r["correct"], k) for r in records]
        out[f"pass@{k}"] = sum(vals) / len(vals)
        out[f"pass@{k}_ci"] = list(mean_ci(vals))
    scores = [r["mean_score"] for r in records]
    out["mean_score"] = sum(scores) / len(scores)
    out["mean_score_ci"] = list(mean_ci(scores))
    return out


def summarize(records: Sequence[dict[str, Any]], ks: Sequence[int] = (1,)) -> dict[str, Any]:
    """``{"tasks": {task: row}, "overall": row}`` in first-seen task order."""
    tasks: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        tasks.setdefault(r["task"], []).append(r)
    return {"tasks": {t: summarize_group(rs, ks) for t, rs in tasks.items()},
            "overall": summarize_group(records, ks)}


def table_rows(summary: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    """Flat rows (one per task + overall) for printing and CSV."""
    rows = []
    for task, row in [*summary["tasks"].items(), ("OVERALL", summary["overall"])]:
        flat: dict[str, Any] = {"mode": mode, "task": task}
        for k, v in row.items():
            if isinstance(v, list):
                flat[f"{k}_lo"], flat[f"{k}_hi"] = round(v[0], 4), round(v[1], 4)
            else:
                flat[k] = round(v, 4) if isinstance(v, float) else v
        rows.append(flat)
    return rows


def format_table(summary: dict[str, Any], title: str) -> str:
    metrics = [k for k in summary["overall"] if k.startswith("pass@") and not k.endswith("_ci")]
    metrics.append("mean_score")
    head = f"{'task':<24}{'n':>6}{'samples':>8}" + "".join(f"{m + ' [95% CI]':>26}" for m in metrics)
    lines = [f"== {title} ==", head]
    for task, row in [*summary["tasks"].items(), ("OVERALL", summary["overall"])]:
        cells = ""
        for m in metrics:
            if m in row:
                lo, hi = row[f"{m}_ci"]
                cells += f"{row[m]:>10.3f} [{lo:.3f}, {hi:.3f}]"
            else:
                cells += f"{'-':>26}"
        lines.append(f"{task:<24}{row['problems']:>6}{row['samples']:>8}{cells}")
    return "\n".join(lines)


def write_results(out_dir: str | Path, stem: str, payload: dict[str, Any],
                  rows: list[dict[str, Any]]) -> tuple[Path, Path]:
    """``stem.json`` (everything) and ``stem.csv`` (the table rows), each atomically."""
    out = Path(out_dir)
    jpath, cpath = out / f"{stem}.json", out / f"{stem}.csv"
    atomic_write_text(jpath, json.dumps(payload, indent=1, default=str))
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(cpath, buf.getvalue())
    return jpath, cpath


def render(result: dict[str, Any], out_dir: str | Path | None, stem: str) -> str:
    """The printed tables of a result (modes ``greedy``/``sampled``/``completions``);
    JSON + CSV under ``out_dir`` when given."""
    modes = [m for m in ("greedy", "sampled", "completions") if m in result]
    text = "\n\n".join(format_table(result[m], f"{result['suite']} / {m}") for m in modes)
    if out_dir is not None:
        rows = [row for m in modes for row in table_rows(result[m], m)]
        j, c = write_results(out_dir, stem, result, rows)
        text += f"\nwrote {j} and {c}"
    return text
