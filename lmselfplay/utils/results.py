"""Benchmark results as JSON files: what was measured, where, when, and by which command.

Every script in ``benchmarks/`` ends with :func:`save_results`; the README's and docs' tables cite
these files by key, and ``tests/project/test_readme_numbers.py`` checks the value at each key, so a
table cannot drift from what was measured.
``LMSELFPLAY_RESULTS_DIR`` sends every script's file elsewhere (the documented-commands test
runs the benchmarks at reduced size there, leaving the cited files alone).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from lmselfplay.utils.checkpoint import atomic_write_text

RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()}


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10, cwd=RESULTS_DIR.parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def to_json(value: Any) -> Any:
    """``json.dumps``' fallback for what measurements are made of: numpy / torch scalars and
    arrays become numbers and (nested) lists, tuples and sets lists, paths text; anything
    else is the TypeError json raises."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if isinstance(value, Path):
        return value.as_posix()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def results_dir() -> Path:
    return Path(os.environ.get("LMSELFPLAY_RESULTS_DIR") or RESULTS_DIR)


def save_results(name: str, results: Any, out_dir: str | Path | None = None) -> Path:
    """Write ``<results dir>/<name>.json`` atomically and return its path."""
    path = Path(out_dir or results_dir()) / f"{name}.json"
    record = {"name": name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "commit": git_commit(),
              "machine": machine(), "results": results}
    atomic_write_text(path, json.dumps(record, indent=1, default=to_json) + "\n")
    print(f"results: {path}")
    return path
