"""The recipe x config x stand-in matrix as a table, from pytest's junit xml.

    .venv/bin/python -m pytest -q -m slow tests/recipes/test_standin_matrix.py --junitxml=slow.xml
    .venv/bin/python -m pytest -q -m "not slow" tests/recipes/test_standin_matrix.py --junitxml=default.xml
    .venv/bin/python scripts/standin_matrix_table.py slow.xml default.xml \
        --out benchmarks/results/standin_matrix

writes ``<out>.md`` (rows: recipe / config, columns: stand-ins; each cell pass / FAIL / skip with
its seconds) and ``<out>.json`` (one record per test). A test found in several files keeps its
last result, so a rerun of some cells listed after the full run replaces those cells. The other
tests of the module (eval verbs, LoRA) are listed under the table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

CELL = re.compile(r"^test_recipe_runs_on_the_standin\[(?P<recipe>[^-\]]+)-(?P<config>[^-\]]+)-(?P<standin>[^\]]+)\]$")


def first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:160] if lines else ""


def read_cases(paths: list[Path]) -> dict[str, dict]:
    """{test name: {"outcome", "seconds", "message"}} over the files, the last file winning."""
    cases: dict[str, dict] = {}
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            raise SystemExit(f"standin_matrix_table: cannot read junit xml {path}: {e}") from None
        for case in root.iter("testcase"):
            outcome, message = "pass", ""
            for tag, name in (("failure", "FAIL"), ("error", "ERROR"), ("skipped", "skip")):
                node = case.find(tag)
                if node is not None:
                    outcome, message = name, first_line(node.get("message") or node.text or "")
                    break
            cases[case.get("name", "")] = {"outcome": outcome, "seconds": float(case.get("time") or 0.0),
                                           "message": message, "source": path.name}
    return cases


def split_cells(cases: dict[str, dict]) -> tuple[dict[tuple[str, str, str], dict], dict[str, dict]]:
    """(recipe, config, stand-in) -> case for the matrix cells; the other tests by name."""
    cells, others = {}, {}
    for name, case in cases.items():
        m = CELL.match(name)
        if m:
            cells[(m["recipe"], m["config"], m["standin"])] = case
        else:
            others[name] = case
    return cells, others


def cell_text(case: dict | None) -> str:
    if case is None:
        return "not run"
    text = f"{case['outcome']} {case['seconds']:.0f} s"
    if case["outcome"] == "skip" and case["message"]:
        text += f" ({case['message']})"
    return text


def markdown(cells: dict, others: dict, sources: list[Path], note: str = "") -> str:
    from lmselfplay.models.standins import STANDINS

    rows = sorted({(r, c) for r, c, _ in cells}, key=lambda rc: (rc[0], rc[1] != rc[0], rc[1]))
    counts = {}
    for case in cells.values():
        counts[case["outcome"]] = counts.get(case["outcome"], 0) + 1
    lines = ["# Recipe x config x stand-in matrix", "",
             f"From pytest junit xml: {', '.join(p.name for p in sources)} "
             "(`scripts/standin_matrix_table.py`; each cell is one `test_recipe_runs_on_the_standin` run: "
             "1-2 steps at the tiny sizes of tests/recipes/test_standin_matrix.py; seconds include building the "
             "stand-in the first time)." + (f" {note}" if note else ""), "",
             "Cells: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) +
             f" of {len(cells)}; total {sum(c['seconds'] for c in cells.values()):.0f} s.", "",
             "| recipe | config | " + " | ".join(STANDINS) + " |",
             "|---|---|" + "---|" * len(STANDINS)]
    for recipe, config in rows:
        lines.append(f"| {recipe} | {config}.yaml | " +
                     " | ".join(cell_text(cells.get((recipe, config, s))) for s in STANDINS) + " |")
    if others:
        lines += ["", "Other tests of the module:", "", "| test | result |", "|---|---|"]
        lines += [f"| {name} | {cell_text(case)} |" for name, case in sorted(others.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xml", nargs="+", type=Path, help="pytest --junitxml files (later ones override)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/standin_matrix"),
                    help="output path without suffix: writes .md and .json")
    ap.add_argument("--note", default="", help="a sentence added under the title (where and how it ran)")
    args = ap.parse_args(argv)
    cells, others = split_cells(read_cases(args.xml))
    if not cells:
        raise SystemExit(f"standin_matrix_table: no test_recipe_runs_on_the_standin cases in {args.xml}")
    text = markdown(cells, others, args.xml, args.note)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    records = [{"recipe": r, "config": c, "standin": s, **case} for (r, c, s), case in sorted(cells.items())]
    records += [{"test": name, **case} for name, case in sorted(others.items())]
    args.out.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
