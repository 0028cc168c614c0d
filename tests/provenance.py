"""Where each number of a README/docs table comes from, and whether it still says so.

The convention (docs/contributing.md, "Numbers in tables"): a markdown table whose body shows
measured numbers is followed, directly under its last row, by a results block::

    | run | Nim P(optimal) | Kuhn exploitability |
    |---|---|---|
    | seed 0 | 0.970 | 0.110 |
    <!-- results main_job_v7_seed0.json
    results.evaluations["100"]["nim/optimal_move_prob"]
    results.evaluations["100"]["kuhn_poker/exploitability"]
    -->

The block names a default file (under ``benchmarks/results/``) and then one key per table number,
in reading order (row by row, left to right). A line ``other.json: KEY`` cites another file for that
number. A key is a path into the JSON: ``name`` or ``["any key"]`` for an object's member, ``[3]``
or ``[-1]`` for a list's item (a ``.jsonl`` file is the list of its lines), joined with ``.``.

A line ``mean(KEY; KEY; ...)`` (or ``min``, ``max``, ``sum``, ``ratio(A; B)`` = A / B; each KEY optionally
``file.json: KEY``)
cites a number the table derives from several results, such as a mean over seeds; a line may end
in `` * 100`` (any integer) when the table shows a fraction as a count or a percentage.

A table number is a decimal (``0.963``, ``-7.63``, ``1.13x``, ``45.2%``) in a body row of a table.
Three kinds of decimals are not measurements, and the rules name them explicitly:
  * text in backticks is a configuration value or a command (``--beta 0.05``);
  * a number right after a comparison (``≥ 0.95``, ``< 0.10``) is a threshold;
  * a column whose header says ``target`` holds targets, not results.
The cited value, rounded to the shown number of decimals, must equal the shown number; a number
shown with ``%`` is compared with the value times 100 unless the value is already above 1.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# a decimal; after a hyphen only when a digit precedes it (the range 0.89-0.97)
NUMBER = re.compile(r"(?<![\w./])(?<![^\d\s(]-)(-?\d+\.\d+(?:e[-+]?\d+)?)(x|×|%)?(?![\w.])")
CODE = re.compile(r"`[^`]*`")
SEPARATOR = re.compile(r"\s*\|[\s:|-]+\|?\s*")
BLOCK_START = re.compile(r"\s*<!--\s*results\s+(\S+)\s*$")
SEGMENT = re.compile(r'\.?([A-Za-z_][\w\-]*)|\[(-?\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


@dataclass(frozen=True)
class Table:
    page: str
    line: int  # 1-based line of the header row
    numbers: list[tuple[int, str]]  # (line, shown number) in reading order
    citations: list[tuple[str, str]] | None  # (default file, entry) per number; None: no block


THRESHOLD = re.compile(r"(?:[≥≤<>]|>=|<=|\btargets?)\s*$")


def cells(row: str) -> list[str]:
    row = row.strip().removeprefix("|").removesuffix("|")
    return re.split(r"(?<!\\)\|", row)


def numbers_in_cell(cell: str) -> list[str]:
    """The measured numbers of one cell: decimals outside backticks, not right after a comparison."""
    text = CODE.sub(lambda m: " " * len(m.group(0)), cell)
    return [m.group(0) for m in NUMBER.finditer(text) if not THRESHOLD.search(text[:m.start()])]


def numbers_in_row(row: str, header: list[str] | None = None) -> list[str]:
    """The measured numbers of one body row, left to right, skipping the columns of targets."""
    out = []
    for i, cell in enumerate(cells(row)):
        if header is not None and i < len(header) and "target" in header[i].lower():
            continue
        out += numbers_in_cell(cell)
    return out


def tables(markdown: str, page: str = "") -> list[Table]:
    """Every markdown table of a page with its body numbers and its results block, if any (a table
    inside a fenced code block is an example, not a table)."""
    lines, fenced = markdown.splitlines(), False
    for k, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or line.startswith("```"):
            lines[k] = ""
    out, i = [], 0
    while i < len(lines):
        if not (lines[i].lstrip().startswith("|") and i + 1 < len(lines)
                and SEPARATOR.fullmatch(lines[i + 1])):
            i += 1
            continue
        start, i, header = i, i + 2, cells(lines[i])
        numbers = []
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            numbers += [(i + 1, n) for n in numbers_in_row(lines[i], header)]
            i += 1
        citations = None
        if i < len(lines) and (m := BLOCK_START.fullmatch(lines[i])):
            default, citations, i = m.group(1), [], i + 1
            while i < len(lines) and lines[i].strip() != "-->":
                citations.append((default, lines[i].strip()))
                i += 1
            i += 1
        out.append(Table(page, start + 1, numbers, citations))
    return out


def parse_key(key: str) -> list[str | int]:
    """``a.b["c/d"][2]`` -> ``["a", "b", "c/d", 2]``; a ValueError for anything else."""
    parts, pos = [], 0
    while pos < len(key):
        m = SEGMENT.match(key, pos)
        if not m or (m.group(1) and pos > 0 and not key[pos] == "."):
            raise ValueError(f"bad key {key!r} at {pos}")
        parts.append(m.group(1) if m.group(1) else int(m.group(2)) if m.group(2) else json.loads(m.group(3)))
        pos = m.end()
    if not parts:
        raise ValueError("empty key")
    return parts


@cache
def load(file: str):
    path = RESULTS / file
    if file.endswith(".jsonl"):
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return json.loads(path.read_text())


AGGREGATES = {"mean": lambda v: sum(v) / len(v), "min": min, "max": max, "sum": sum,
              "ratio": lambda v: v[0] / v[1]}
FILE_PREFIX = re.compile(r"([\w.\-]+\.jsonl?): (.*)")


def split_entry(default: str, entry: str) -> tuple[str, str]:
    """``file.json: KEY`` -> (file.json, KEY); a bare ``KEY`` is in the block's default file."""
    m = FILE_PREFIX.fullmatch(entry.strip())
    return (m.group(1), m.group(2)) if m else (default, entry.strip())


def cited_value(default: str, entry: str) -> float:
    """The number one line of a results block cites: a key, or an aggregate of keys, times N."""
    if m := re.fullmatch(r"(.*\S)\s+\*\s+(\d+)", entry.strip()):
        return cited_value(default, m.group(1)) * int(m.group(2))
    m = re.fullmatch(r"(mean|min|max|sum|ratio)\((.*)\)", entry.strip())
    if m:
        return AGGREGATES[m.group(1)]([cited_value(default, e) for e in m.group(2).split(";")])
    return lookup(*split_entry(default, entry))


def entry_files(default: str, entry: str) -> list[str]:
    entry = re.sub(r"\s+\*\s+\d+$", "", entry.strip())
    m = re.fullmatch(r"(mean|min|max|sum|ratio)\((.*)\)", entry.strip())
    if m:
        return [f for e in m.group(2).split(";") for f in entry_files(default, e)]
    return [split_entry(default, entry)[0]]


def lookup(file: str, key: str) -> float:
    """The number at ``key`` in ``benchmarks/results/<file>``; KeyError naming what is missing."""
    if "/" in file or not (RESULTS / file).is_file():
        raise KeyError(f"no results file {file}")
    value = load(file)
    for part in parse_key(key):
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            raise KeyError(f"{file}: no {part!r} in {key}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KeyError(f"{file}: {key} is {value!r}, not a number")
    return float(value)


def shows(number: str, value: float) -> bool:
    """Whether ``value`` rounded as ``number`` is shown equals ``number``."""
    digits = re.fullmatch(r"-?\d+\.(\d+)(e[-+]?\d+)?(x|×|%)?", number)
    if digits.group(3) == "%" and abs(value) <= 1:
        value *= 100
    shown, places = number.rstrip("x×%"), len(digits.group(1))
    if digits.group(2):  # scientific: 6.6e-06
        return f"{value:.{places}e}" == shown
    # the stored decimal rounded half up (0.485 -> 0.49) or as Python formats it (0.485 -> 0.48)
    half_up = Decimal(repr(value)).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return any(r == shown or float(r) == float(shown) == 0  # -0.000 shows as 0.000
               for r in (f"{value:.{places}f}", f"{half_up:.{places}f}"))


def problems(table: Table) -> list[str]:
    """What is wrong with one table's provenance (empty when every number is cited and matches)."""
    where = f"{table.page}:{table.line}"
    if not table.numbers:
        return [] if not table.citations else [f"{where}: a results block under a table without numbers"]
    if table.citations is None:
        return [f"{where}: {len(table.numbers)} numbers and no results block"]
    if len(table.citations) != len(table.numbers):
        return [f"{where}: {len(table.numbers)} numbers, {len(table.citations)} keys"]
    out = []
    for (line, shown), (file, key) in zip(table.numbers, table.citations, strict=True):
        try:
            value = cited_value(file, key)
        except (KeyError, ValueError) as e:
            out.append(f"{table.page}:{line}: {shown}: {e.args[0]}")
            continue
        if not shows(shown, value):
            out.append(f"{table.page}:{line}: shows {shown}, {file} {key} is {value}")
    return out


def documented_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def cited_files() -> set[str]:
    """Every results file a table of a documented page cites."""
    return {file for page in documented_pages() for t in tables(page.read_text(), page.name)
            for default, entry in t.citations or [] for file in entry_files(default, entry)}
