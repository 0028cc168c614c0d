"""Atomic, resumable checkpoints: write into a temporary sibling dir, then rename.

A run killed at any moment leaves either the previous complete checkpoint or the new
complete one, never a half-written directory. ``latest_checkpoint`` finds the newest
complete one (``checkpoint-<step>`` dirs holding a ``COMPLETE`` marker).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MARKER = "COMPLETE"


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """``with atomic_dir(out) as tmp: write files into tmp`` -> renamed to ``out`` at exit."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        (tmp / MARKER).write_text("ok\n")
        old = None
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = []
    for p in out.iterdir():
        m = re.fullmatch(r"checkpoint-(\d+)", p.name)
        if m and (p / MARKER).exists():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    dirs = checkpoint_dirs(output_dir)
    return dirs[-1] if dirs else None


def prune_checkpoints(output_dir: str | Path, keep: int) -> None:
    for p in checkpoint_dirs(output_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)


def save_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, default=str))
