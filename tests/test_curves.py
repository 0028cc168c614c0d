"""The one plotting rule: a grid (a row per game, training signals last), probabilities on
fixed [0, 1] axes, bands from ``_ci_low`` / ``_ci_high``, dense signals smoothed."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from lmselfplay.utils import curves
from lmselfplay.utils.metrics_logger import MetricsLogger


def rows(n_steps: int = 60) -> list[dict]:
    out = []
    for s in range(n_steps):
        r = {"step": s, "train/entropy": 1.0 - s / 100, "rollout/invalid_rate": 0.05}
        if s % 10 == 0:
            r.update({"nim/optimal_move_prob": 0.6, "nim/win_vs_random": 0.6,
                      "nim/win_vs_random_ci_low": 0.5, "nim/win_vs_random_ci_high": 0.7,
                      "kuhn_poker/exploitability": 0.4 - s / 200})
        out.append(r)
    return out


def test_grid_puts_a_game_a_row_and_training_signals_last():
    keys = ["train/entropy", "nim/optimal_move_prob", "rollout/invalid_rate", "nim/win_vs_random",
            "kuhn_poker/exploitability"]
    assert curves.grid_rows(keys) == [["nim/optimal_move_prob", "nim/win_vs_random"],
                                      ["kuhn_poker/exploitability"],
                                      ["train/entropy", "rollout/invalid_rate"]]


def test_rows_wrap_at_max_columns():
    keys = [f"g/m{i}" for i in range(curves.MAX_COLUMNS + 2)]
    assert [len(r) for r in curves.grid_rows(keys)] == [curves.MAX_COLUMNS, 2]


@pytest.mark.parametrize("key,expected", [("nim/optimal_move_prob", True), ("nim/win_vs_random", True),
                                          ("eval/accuracy", True), ("train/loss", False),
                                          ("kuhn_poker/exploitability", False), ("nim/mean_return", False)])
def test_probability_names(key, expected):
    assert curves.is_probability(key) is expected


def test_ema_is_bias_corrected():
    assert curves.ema([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])
    assert curves.ema([0.0, 1.0], weight=0.5)[1] == pytest.approx(0.5 / 0.75)


def test_panels_have_fixed_axes_bands_and_smoothing(tmp_path, monkeypatch):
    drawn = {}
    real = curves._draw_panel

    def spy(ax, rs, key):
        real(ax, rs, key)
        drawn[key] = (ax.get_ylim(), len(ax.lines), len(ax.collections))

    monkeypatch.setattr(curves, "_draw_panel", spy)
    keys = ["nim/optimal_move_prob", "nim/win_vs_random", "kuhn_poker/exploitability", "train/entropy"]
    out = curves.plot_curves(rows(), keys, tmp_path / "c.png", "t")
    assert out.exists() and out.stat().st_size > 0
    assert drawn["nim/optimal_move_prob"][0] == pytest.approx((-0.02, 1.02))
    assert drawn["nim/win_vs_random"][2] == 1  # the 95% band
    assert drawn["kuhn_poker/exploitability"][0][0] == 0
    assert drawn["train/entropy"][1] == 2  # raw (faint) + smoothed


def test_logger_plot_is_one_grid_not_a_column(tmp_path):
    from PIL import Image

    log = MetricsLogger(tmp_path, tensorboard=False)
    for r in rows():
        log.log(r.pop("step"), r)
    keys = ["nim/optimal_move_prob", "nim/win_vs_random", "kuhn_poker/exploitability",
            "train/entropy", "rollout/invalid_rate", "missing/key"]
    png = log.plot(keys, "curves.png")
    width, height = Image.open(png).size
    assert height < 3 * 250 and width > 600  # 3 rows of up to 2 panels, not 5 stacked ones
    assert curves.plot_curves([], ["x"], tmp_path / "none.png") is None
