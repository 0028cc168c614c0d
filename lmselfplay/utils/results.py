"""Benchmark results as JSON files: what was measured, where, when, and by which command.

Every script in ``benchmarks/`` ends with :func:`save_results`; the README's tables cite
these files, and ``tests/test_readme_numbers.py`` checks that every number a README table
shows appears in one of them, so a table cannot drift from what was measured.
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


def save_results(name: str, results: Any, out_dir: str | Path | None = None) -> Path:
    """Write ``benchmarks/results/<name>.json`` atomically and return its path."""
    path = Path(out_dir or RESULTS_DIR) / f"{name}.json"
    record = {"name": name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "commit": git_commit(),
              "machine": machine(), "results": results}
    atomic_write_text(path, json.dumps(record, indent=1, default=float) + "\n")
    print(f"results: {path}")
    return path
