"""Every figure of the project, drawn one way: the one plotting helper of recipes and benchmarks.

Three figures, one set of rules:

- ``plot_curves(rows, keys, out_png, title)``: metric rows (dicts with a ``step``) as a grid,
  one row of panels per group (the key's prefix before the first ``/``: ``nim/optimal_move_prob``
  -> ``nim``, a row per game or task), the groups of ``TRAINING_GROUPS`` (``train``, ``rollout``,
  ...) sharing the last row; a row holds at most ``MAX_COLUMNS`` panels and wraps. A 95% band
  where the metric has one (``KEY_ci_low`` / ``KEY_ci_high``); a dense signal (more than
  ``SMOOTH_ABOVE`` points) smoothed by an exponential moving average over its faint raw values.
- ``plot_lines(panels, out_png, title)``: runs side by side, a panel per metric, a line per
  run (variant and seed), for benchmarks and studies.
- ``heatmap(matrix, rows, columns, out_png, ...)``: a row-vs-column score matrix in [0, 1].

The rules every panel follows:

- **titles and axis labels in words** (:func:`words`): ``nim/optimal_move_prob`` ->
  ``Nim: P(optimal move)``; a group's words come from ``titles`` (what the game calls itself)
  or its key;
- **probabilities on a fixed [0, 1] axis** (:func:`is_probability`: rates, probabilities,
  accuracies, shares, win rates), so that noise of 0.59-0.62 looks like noise; exploitability
  and other non-negative gaps from 0;
- **reference lines** (``references``: key -> :class:`Reference`), dotted, named in the legend: the
  levels a metric is read against (optimal play 1.0, a Nash equilibrium's exploitability 0,
  the uniform random policy's value). The helper draws what it is given and never guesses
  them: the caller asks the game what it declares (``lmselfplay.eval.game_metrics.
  plot_annotations``);
- **seeds as shades of their variant's colour** (:func:`line_colours`): a variant a hue, each
  seed of it a lightness of that hue, so three seeds are three lines of one family with three
  legend entries that can be told apart;
- written atomically (a reader never sees half a PNG).
"""

from __future__ import annotations

import colorsys
import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmselfplay.utils.checkpoint import umask_mode

TRAINING_GROUPS = ("train", "rollout", "sync", "time", "executor", "league")
MAX_COLUMNS = 4
SMOOTH_ABOVE = 30
EMA_WEIGHT = 0.9
# [0, 1] by name; difficulty (a solve rate) and diversity (1 - BLEU) are shares that do not say so
PROBABILITY = re.compile(r"(prob|rate|accuracy|share|win_|_win|agreement|fraction|pass@|^difficulty$|^diversity$)")
FROM_ZERO = re.compile(r"(exploitability|nash_conv|gap|entropy|kl)")
# Metric names (the key after its group) in words; names not listed read as their words.
METRIC_WORDS = {
    "optimal_move_prob": "P(optimal move)",
    "greedy_optimal_rate": "greedy optimal-move rate",
    "min_optimal_prob": "lowest P(optimal move) of any position",
    "exploitability": "exploitability",
    "heldout_accuracy": "held-out accuracy",
    "label_accuracy": "label accuracy (kept questions)",
    "label_accuracy_all": "label accuracy (all questions)",
    "reward_accuracy": "reward accuracy",
    "pass_rate": "share passing the filter band",
    "optimal_fraction": "argmax optimal-move rate",
    "optimal_fraction_winning": "argmax optimal, won positions",
    "winrate_vs_past_mean": "mean score vs earlier checkpoints",
    "difficulty": "difficulty (true solve rate)",
    "diversity": "diversity (1 - mean pairwise BLEU)",
}
VERSUS = re.compile(r"^(win|loss|draw|mean_return)_vs_(\w+?)(?:_as_(\w+))?$")
VERSUS_WORDS = {"win": "win rate", "loss": "loss rate", "draw": "draw rate", "mean_return": "mean return"}
GROUP_WORDS = {"train": "training", "eval": "evaluation", "study": "study", "metrics": ""}
VARIANT_LIGHTNESS = (0.30, 0.70)  # darkest and lightest seed of a variant (HLS lightness)
REFERENCE_STYLES = (":", "--", "-.")  # a panel's reference lines, told apart in its legend


@dataclass(frozen=True)
class Reference:
    """A level a metric is read against: drawn as a dotted horizontal line named ``label``."""

    value: float
    label: str


@dataclass
class Line:
    """One run's curve in a :func:`plot_lines` panel: ``(x, y)`` points, an optional 95%
    interval per point (``(x, low, high)``), its variant and seed (which give its colour),
    and a ``note`` added to its legend entry (``average``) with a dashed ``style``."""

    variant: str
    points: Sequence[tuple[float, float]]
    seed: int | None = None
    interval: Sequence[tuple[float, float, float]] = ()
    note: str = ""
    style: str = "-"

    def label(self) -> str:
        parts = [self.variant] + ([f"seed {self.seed}"] if self.seed is not None else []) + (
            [self.note] if self.note else [])
        return ", ".join(parts)


# --- words ---------------------------------------------------------------------------------
def is_probability(key: str) -> bool:
    """A metric whose values live in [0, 1] by definition (read from its name)."""
    name = key.rsplit("/", 1)[-1]
    return bool(PROBABILITY.search(name)) and "return" not in name and "loss" not in name


def group_of(key: str) -> str:
    return key.split("/", 1)[0] if "/" in key else "metrics"


def metric_words(name: str) -> str:
    """A metric's name in words: ``win_vs_random`` -> ``win rate vs the random bot``."""
    if name in METRIC_WORDS:
        return METRIC_WORDS[name]
    if name.startswith("raw_") and name[4:] in METRIC_WORDS:  # the network alone, without search
        return f"{METRIC_WORDS[name[4:]]} (raw)"
    m = VERSUS.match(name)
    if m:
        what, opponent, role = m.groups()
        return f"{VERSUS_WORDS[what]} vs the {opponent.replace('_', ' ')} bot" + (f" as {role}" if role else "")
    return name.replace("_", " ")


def group_words(group: str, titles: Mapping[str, str] | None = None) -> str:
    """A group's name in words: the caller's title for it (a game's), else its key's words."""
    if titles and group in titles:
        return titles[group]
    words = GROUP_WORDS.get(group, group.replace("_", " "))
    return words[:1].upper() + words[1:]


def words(key: str, titles: Mapping[str, str] | None = None) -> str:
    """A metric key in words: ``nim/optimal_move_prob`` -> ``Nim: P(optimal move)``."""
    group, _, name = key.rpartition("/")
    metric = metric_words(name)
    head = group_words(group, titles) if group else ""
    return f"{head}: {metric}" if head else metric[:1].upper() + metric[1:]


# --- colours -------------------------------------------------------------------------------
def line_colours(lines: Sequence[tuple[str, int | None]]) -> list[tuple[float, float, float]]:
    """RGB of each ``(variant, seed)``: the variant's hue (matplotlib's cycle, in order of
    first appearance), its seeds spread from dark to light within that hue."""
    from matplotlib import colors

    variants = list(dict.fromkeys(v for v, _ in lines))
    seeds = {v: list(dict.fromkeys(s for w, s in lines if w == v)) for v in variants}
    out = []
    for variant, seed in lines:
        base = colors.to_rgb(f"C{variants.index(variant) % 10}")
        hue, light, sat = colorsys.rgb_to_hls(*base)
        n, i = len(seeds[variant]), seeds[variant].index(seed)
        if n > 1:
            lo, hi = VARIANT_LIGHTNESS
            light = lo + (hi - lo) * i / (n - 1)
        out.append(colorsys.hls_to_rgb(hue, light, sat))
    return out


# --- data ----------------------------------------------------------------------------------
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


# --- panels --------------------------------------------------------------------------------
def style_panel(ax: Any, key: str, values: Sequence[float], references: Sequence[Reference] = (),
                titles: Mapping[str, str] | None = None, xlabel: str = "step", log: bool = False) -> None:
    """The rules of every panel: its reference lines, its y range (probabilities [0, 1],
    gaps from 0), its title in words, a grid."""
    for ref, style in zip(references, REFERENCE_STYLES * len(references)):
        ax.axhline(ref.value, color="black", linestyle=style, linewidth=1, alpha=0.6, label=ref.label)
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    elif is_probability(key):
        ax.set_ylim(-0.02, 1.02)
    elif FROM_ZERO.search(key.rsplit("/", 1)[-1]) and min(values, default=0) >= 0:
        top = max([*values, *(r.value for r in references)], default=1.0)
        ax.set_ylim(bottom=0, top=top * 1.1 or 1.0)
    ax.set_title(words(key, titles), fontsize=8)
    ax.set_xlabel(xlabel, fontsize=7)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, which="both" if log else "major")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)


def _draw_panel(ax: Any, rows: list[dict[str, Any]], key: str, references: Sequence[Reference] = (),
                titles: Mapping[str, str] | None = None) -> None:
    pts = series(rows, key)
    if not pts:
        ax.set_visible(False)
        return
    steps, values = zip(*pts)
    band = [(s, lo, hi) for (s, lo), (_, hi) in
            zip(series(rows, key + "_ci_low"), series(rows, key + "_ci_high"))]
    if band:
        bs, lo, hi = zip(*band)
        ax.fill_between(bs, lo, hi, alpha=0.2, linewidth=0)
    if len(values) > SMOOTH_ABOVE:
        ax.plot(steps, values, alpha=0.25, linewidth=0.8)
        ax.plot(steps, ema(list(values)), linewidth=1.5, color="C0")
    else:
        ax.plot(steps, values, marker=".", linewidth=1.2)
    style_panel(ax, key, values, references, titles)
    _integer_ticks(ax, steps)


def _integer_ticks(ax: Any, xs: Sequence[float]) -> None:
    """Steps and iterations are counts: no tick at 1.5 when every point is at a whole number."""
    if all(float(x).is_integer() for x in xs):
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))  # 0, 20, 40: not 15, 105


def _draw_lines(ax: Any, key: str, lines: Sequence[Line], references: Sequence[Reference],
                titles: Mapping[str, str] | None, xlabel: str, log: bool) -> None:
    for line, colour in zip(lines, line_colours([(ln.variant, ln.seed) for ln in lines])):
        if not line.points:
            continue
        x, y = zip(*line.points)
        if line.interval:
            ix, lo, hi = zip(*line.interval)
            ax.fill_between(ix, lo, hi, color=colour, alpha=0.15, linewidth=0)
        ax.plot(x, y, line.style, color=colour, marker="" if log or len(x) > SMOOTH_ABOVE else ".",
                linewidth=1.2, label=line.label())
    values = [v for ln in lines for _, v in ln.points]
    style_panel(ax, key, values, references, titles, xlabel, log)
    if not log:
        _integer_ticks(ax, [x for ln in lines for x, _ in ln.points])


# --- figures -------------------------------------------------------------------------------
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write ``fig`` as a PNG atomically (whole labels kept) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.fchmod(fd, umask_mode(0o666))
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        _pyplot().close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def plot_curves(rows: list[dict[str, Any]], keys: list[str], out_png: str | Path, title: str = "",
                references: Mapping[str, Sequence[Reference]] | None = None,
                titles: Mapping[str, str] | None = None) -> Path | None:
    """The grid of ``keys`` that have data, as a PNG (None if nothing to plot)."""
    keys = [k for k in keys if series(rows, k)]
    if not keys:
        return None
    plt = _pyplot()
    references = references or {}
    layout = grid_rows(keys)
    ncols = max(len(r) for r in layout)
    fig, axes = plt.subplots(len(layout), ncols, figsize=(3.3 * ncols, 2.4 * len(layout)), squeeze=False)
    for i, row in enumerate(layout):
        for j in range(ncols):
            if j < len(row):
                _draw_panel(axes[i, j], rows, row[j], references.get(row[j], ()), titles)
            else:
                axes[i, j].set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save(fig, out_png)


def plot_lines(panels: Mapping[str, Sequence[Line]], out_png: str | Path, title: str = "",
               references: Mapping[str, Sequence[Reference]] | None = None,
               titles: Mapping[str, str] | None = None, xlabel: str = "step", log: bool = False,
               columns: int = 1) -> Path:
    """Runs side by side: a panel per metric key of ``panels`` (``columns`` a row), a line per
    run coloured by :func:`line_colours`; ``log`` puts both axes on a log scale."""
    plt = _pyplot()
    references = references or {}
    n = len(panels)
    ncols = min(columns, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 3.0 * nrows), squeeze=False)
    for ax, (key, lines) in zip(axes.flat, panels.items()):
        _draw_lines(ax, key, lines, references.get(key, ()), titles, xlabel, log)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, out_png, dpi=120)


def heatmap(matrix: Any, row_names: Sequence[str], column_names: Sequence[str], out_png: str | Path,
            title: str = "", xlabel: str = "opponent", ylabel: str = "player",
            colour_label: str = "score share (win 1, draw 1/2)", annotate: bool = True) -> Path:
    """A matrix of shares in [0, 1] (NaN: not played), on a fixed [0, 1] colour scale so that
    0.5 (even) is always the same colour; each cell's value written on it when ``annotate``."""
    import numpy as np

    plt = _pyplot()
    share = np.asarray(matrix, dtype=float)
    n_rows, n_cols = share.shape
    fig, ax = plt.subplots(figsize=(max(4.5, 2.0 + 0.9 * n_cols), max(3.8, 1.6 + 0.8 * n_rows)))
    im = ax.imshow(np.ma.masked_invalid(share), vmin=0, vmax=1, cmap="RdBu")
    if annotate:
        for i in range(n_rows):
            for j in range(n_cols):
                if not math.isnan(share[i, j]):
                    ink = "white" if abs(share[i, j] - 0.5) > 0.3 else "black"  # readable on dark cells
                    ax.text(j, i, f"{share[i, j]:.2f}", ha="center", va="center", fontsize=9, color=ink)
    ax.set_xticks(range(n_cols), column_names, rotation=45, ha="right")
    ax.set_yticks(range(n_rows), row_names)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(im, ax=ax, fraction=0.046).set_label(colour_label, fontsize=8)
    ax.set_title(title, fontsize=10, wrap=True)
    return save(fig, out_png)
