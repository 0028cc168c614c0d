"""Training curves as one grid a screen shows at once: the one plotting rule of every recipe.

``plot_curves(rows, keys, out_png, title)`` draws metric rows (dicts with a ``step``) as:

- one row of panels per group, a group being the key's prefix before the first ``/``
  (``nim/optimal_move_prob`` -> ``nim``): a row per game or task with its headline metrics;
  the keys of the groups in ``TRAINING_GROUPS`` (``train``, ``rollout``, ``sync``, ...) share
  the last row, the row of training signals. A row holds at most ``MAX_COLUMNS`` panels and wraps;
- probabilities (``is_probability``: rates, probabilities, accuracies, shares, win rates) on a
  fixed ``[0, 1]`` axis, so that noise of 0.59-0.62 looks like noise; exploitability and other
  non-negative gaps from 0;
- a 95% band where the metric has one (``KEY_ci_low`` / ``KEY_ci_high`` in the same rows);
- a dense, noisy signal (more than ``SMOOTH_ABOVE`` points) smoothed by an exponential moving
  average drawn over its raw values, which stay faint behind it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TRAINING_GROUPS = ("train", "rollout", "sync", "time", "executor", "league")
MAX_COLUMNS = 4
SMOOTH_ABOVE = 30
EMA_WEIGHT = 0.9
PROBABILITY = re.compile(r"(prob|rate|accuracy|share|win_|_win|agreement|fraction|pass@)")
FROM_ZERO = re.compile(r"(exploitability|nash_conv|gap|entropy|kl)")


def is_probability(key: str) -> bool:
    """A metric whose values live in [0, 1] by definition (read from its name)."""
    name = key.rsplit("/", 1)[-1]
    return bool(PROBABILITY.search(name)) and "return" not in name and "loss" not in name


def group_of(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else "metrics"


def grid_rows(keys: Iterable[str]) -> list[list[str]]:
    """Keys laid out in rows: one group a row (wrapped at MAX_COLUMNS), training groups last."""
    groups: dict[str, list[str]] = {}
    for k in keys:
        g = group_of(k)
        groups.setdefault("training signals" if g in TRAINING_GROUPS else g, []).append(k)
    ordered = sorted(groups, key=lambda g: (g == "training signals", list(groups).index(g)))
    rows = []
    for g in ordered:
        ks = groups[g]
        rows += [ks[i:i + MAX_COLUMNS] for i in range(0, len(ks), MAX_COLUMNS)]
    return rows


def series(rows: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """(step, value) of every row holding a finite number for ``key``."""
    out = []
    for r in rows:
        v = r.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out.append((float(r["step"]), float(v)))
    return out


def ema(values: list[float], weight: float = EMA_WEIGHT) -> list[float]:
    """Bias-corrected exponential moving average (TensorBoard's smoothing)."""
    out, acc = [], 0.0
    for i, v in enumerate(values, start=1):
        acc = weight * acc + (1 - weight) * v
        out.append(acc / (1 - weight ** i))
    return out


def _draw_panel(ax: Any, rows: list[dict[str, Any]], key: str) -> None:
    pts = series(rows, key)
    if not pts:
        ax.set_visible(False)
        return
    steps, values = zip(*pts)
    band = [(s, lo, hi) for (s, lo), (_, hi) in
            zip(series(rows, key + "_ci_low"), series(rows, key + "_ci_high"))]
    if band:
        bs, lo, hi = zip(*band)
        ax.fill_between(bs, lo, hi, alpha=0.2, linewidth=0, label="95% CI")
    if len(values) > SMOOTH_ABOVE:
        ax.plot(steps, values, alpha=0.25, linewidth=0.8)
        ax.plot(steps, ema(list(values)), linewidth=1.5, color="C0")
    else:
        ax.plot(steps, values, marker=".", linewidth=1.2)
    if is_probability(key):
        ax.set_ylim(-0.02, 1.02)
    elif FROM_ZERO.search(key.rsplit("/", 1)[-1]) and min(values) >= 0:
        ax.set_ylim(bottom=0, top=max(values) * 1.1 or 1.0)
    ax.set_title(key, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def plot_curves(rows: list[dict[str, Any]], keys: list[str], out_png: str | Path,
                title: str = "") -> Path | None:
    """The grid of ``keys`` that have data, as a PNG (None if nothing to plot)."""
    keys = [k for k in keys if series(rows, k)]
    if not keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout = grid_rows(keys)
    ncols = max(len(r) for r in layout)
    fig, axes = plt.subplots(len(layout), ncols, figsize=(3.3 * ncols, 2.3 * len(layout)),
                             squeeze=False)
    for i, row in enumerate(layout):
        for j in range(ncols):
            if j < len(row):
                _draw_panel(axes[i, j], rows, row[j])
            else:
                axes[i, j].set_visible(False)
        for j in range(len(row)):
            axes[i, j].set_xlabel("step", fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)
