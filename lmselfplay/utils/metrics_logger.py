"""Metrics: one logger writes JSONL (always), TensorBoard (when installed) and PNG curves.

``MetricsLogger(out_dir).log(step, {"loss": ...})`` appends one JSON line per call to
``metrics.jsonl``; ``plot(keys, "curves.png")`` draws those keys against the step as one grid.
Appending is resume-safe: a resumed run drops lines past its restored step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lmselfplay.utils.curves import plot_curves


class MetricsLogger:
    def __init__(self, out_dir: str | Path, tensorboard: bool = True, resume_step: int | None = None):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            kept = [r for r in read_jsonl(self.path) if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.dir / "tensorboard"))
            except Exception:  # tensorboard missing: JSONL still has everything
                self.tb = None

    def log(self, step: int, values: dict[str, Any]) -> None:
        row = {"step": int(step)}
        for k, v in values.items():
            if hasattr(v, "item"):
                v = v.item()
            row[k] = v
            if self.tb is not None and isinstance(v, (int, float)) and math.isfinite(v):
                self.tb.add_scalar(k, v, step)
        with self.path.open("a") as f:
            f.write(json.dumps(row, default=float) + "\n")

    def rows(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path)

    def plot(self, keys: list[str], filename: str, title: str = "", **annotations: Any) -> Path | None:
        """``annotations``: :func:`lmselfplay.utils.curves.plot_curves`'s ``references`` and ``titles``."""
        return plot_jsonl(self.path, keys, self.dir / filename, title, **annotations)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill: skip it
            continue
    return rows


def plot_jsonl(path: str | Path, keys: list[str], out_png: str | Path, title: str = "",
               **annotations: Any) -> Path | None:
    """The curves of ``keys`` in a metrics file, as one grid (:mod:`lmselfplay.utils.curves`).
    Returns the PNG path (None if nothing to plot)."""
    return plot_curves(read_jsonl(path), keys, out_png, title, **annotations)
