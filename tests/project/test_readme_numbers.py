"""Every number a table of the README or of ``docs/`` shows was measured: it appears in a
results file under ``benchmarks/results/`` (written by the benchmark scripts), rounded as the
table rounds it."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DECIMAL = re.compile(r"(?<![\w.-])(-?\d+\.\d+)(?![\w.])")  # a minus sign is part of the number


def table_numbers(markdown: str) -> list[str]:
    """Decimal numbers in the body rows of every markdown table (headers skipped)."""
    out, in_table, header_seen = [], False, False
    for line in markdown.splitlines():
        if not line.lstrip().startswith("|"):
            in_table = header_seen = False
            continue
        if not in_table:
            in_table = True  # the header row
            continue
        if re.fullmatch(r"\s*\|[\s:|-]+\|\s*", line):
            header_seen = True
            continue
        if header_seen:
            out += DECIMAL.findall(line)
    return out


def measured_values(folder: Path) -> list[float]:
    values: list[float] = []

    def walk(x):
        if isinstance(x, bool):
            return
        if isinstance(x, int | float):
            values.append(float(x))
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for path in sorted(folder.glob("*.json")):
        walk(json.loads(path.read_text()))
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            walk(json.loads(line))
    return values


def appears(number: str, values: list[float]) -> bool:
    decimals = len(number.split(".")[1])
    return any(f"{v:.{decimals}f}" == number for v in values)


def test_table_parser_reads_body_rows_only():
    md = "| a | 0.5 |\n|---|---|\n| x | 0.25 / 1.50 | -7.63 ± 1.11 |\ntext 9.99\n"
    assert table_numbers(md) == ["0.25", "1.50", "-7.63", "1.11"]
    assert appears("-7.63", [-7.6312]) and not appears("-7.63", [7.63])
    assert appears("0.25", [0.2501]) and not appears("0.25", [0.26])


def documented_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_pages_are_checked():
    names = {p.name for p in documented_pages()}
    assert {"README.md", "selfplay_games.md", "spin.md"} <= names


def test_every_table_number_is_in_a_results_file():
    values = measured_values(ROOT / "benchmarks" / "results")
    missing = {page.name: bad for page in documented_pages()
               if (bad := [n for n in table_numbers(page.read_text()) if not appears(n, values)])}
    assert missing == {}, f"table numbers with no results file behind them: {missing}"
