"""The AlphaZero run's figures: curves of every evaluation and training metric, the raw
network's progress against the game's reference lines, and the win-rate matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lmselfplay.alphazero.config import AlphaZeroArgs
from lmselfplay.alphazero.progress import Progress
from lmselfplay.utils.curves import heatmap
from lmselfplay.utils.run import Run


def plot_matrix(rows: list[list[float]], path: Path) -> None:
    """Row i: checkpoint i's raw-policy score against each earlier checkpoint (the rest empty)."""
    n = len(rows)
    m = np.full((n, n), np.nan)
    for i, row in enumerate(rows):
        m[i, : len(row)] = row
    names = [str(i) for i in range(n)]
    heatmap(m, names, names, path, "raw-policy score vs every earlier checkpoint", xlabel="earlier checkpoint",
            ylabel="checkpoint", colour_label="score share", annotate=n <= 12)  # digits fit up to 12 cells


def plot_run(cfg: AlphaZeroArgs, run: Run, p: Progress, optimal: list[Any]) -> None:
    """``curves.png`` (search strength, training losses), ``progress.png`` (the raw network,
    with ``optimal``: the reference lines of the greedy optimal rate, [] for none) and the matrix."""
    logger = run.logger
    keys = sorted({k for r in logger.rows() for k in r if k.startswith(("eval/sims", "train/"))
                   and not k.endswith("_losses")})
    logger.plot(keys, "curves.png", title=f"AlphaZero on {cfg.game}")
    logger.plot(["eval/raw_optimal_fraction", "eval/raw_optimal_fraction_winning",
                 "eval/winrate_vs_past_mean"], "progress.png", title=f"AlphaZero on {cfg.game}: the raw network",
                references={"eval/raw_optimal_fraction": optimal, "eval/raw_optimal_fraction_winning": optimal})
    if p.matrix:
        plot_matrix(p.matrix, run.out / "winrate_matrix.png")
