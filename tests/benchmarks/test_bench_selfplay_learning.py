"""benchmarks/bench_selfplay_learning.py's figure follows the plotting helper's rules: a line per
(variant, seed) with its own legend entry, the game's reference lines plus the benchmark's
target, and the settings every run shares in the title (a legend names variants only)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_selfplay_learning as bench  # noqa: E402

from lmselfplay.utils import curves  # noqa: E402


def table() -> dict:
    curve = [(0, 1.0, 0.54), (5, 2.0, 0.7), (10, 3.0, 0.9)]
    return {v: [{"seed": s, "curve": curve} for s in (0, 1, 2)] for v in ("magnet", "fixed")}


def test_figure_has_a_shade_per_seed_the_game_references_and_the_shared_settings(tmp_path, monkeypatch):
    seen = {}
    real = curves.plot_lines

    def spy(panels, out, title, references, titles, **kw):
        seen.update(panels=panels, title=title, references=references)
        return real(panels, out, title, references, titles, **kw)

    monkeypatch.setattr(curves, "plot_lines", spy)
    out = bench.plot(table(), "nim", tmp_path / "b.png", 0.95, {"beta": "0.1"})
    assert out.stat().st_size > 1000
    lines = seen["panels"]["nim/optimal_move_prob"]
    assert len({ln.label() for ln in lines}) == 6
    assert len(set(curves.line_colours([(ln.variant, ln.seed) for ln in lines]))) == 6
    labels = {r.label.split(" (")[0] for r in seen["references"]["nim/optimal_move_prob"]}
    assert labels == {"optimal play", "uniform random policy", "target"}
    assert "Nim" in seen["title"] and "beta=0.1" in seen["title"]
