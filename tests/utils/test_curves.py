"""The one plotting helper's rules: a grid (a row per game, training signals last), probabilities
on fixed [0, 1] axes, bands from ``_ci_low`` / ``_ci_high``, dense signals smoothed, labels in
words, the reference lines it is given, seeds as shades of their variant's colour."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import colorsys

import matplotlib.pyplot as plt
import pytest

from lmselfplay.utils import curves
from lmselfplay.utils.curves import Line, Reference
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

    def spy(ax, rs, key, *rest):
        real(ax, rs, key, *rest)
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


@pytest.mark.parametrize("key,titles,expected", [
    ("nim/optimal_move_prob", None, "Nim: P(optimal move)"),
    ("tictactoe/optimal_move_prob", {"tictactoe": "Tic-tac-toe"}, "Tic-tac-toe: P(optimal move)"),
    ("kuhn_poker/win_vs_random", None, "Kuhn poker: win rate vs the random bot"),
    ("taboo/win_vs_scripted_as_attacker", None, "Taboo: win rate vs the scripted bot as attacker"),
    ("train/policy_loss", None, "Training: policy loss"),
    ("heldout_accuracy", None, "Held-out accuracy"),
    ("eval/raw_optimal_move_prob", None, "Evaluation: P(optimal move) (raw)"),
])
def test_labels_are_words_not_keys(key, titles, expected):
    assert curves.words(key, titles) == expected


def test_seeds_are_shades_of_their_variants_hue():
    runs = [("magnet", 0), ("magnet", 1), ("magnet", 2), ("fixed", 0), ("fixed", 1)]
    colours = curves.line_colours(runs)
    hls = [colorsys.rgb_to_hls(*c) for c in colours]
    assert len(set(colours)) == len(runs)  # every seed its own legend swatch
    assert max(h for h, _, _ in hls[:3]) - min(h for h, _, _ in hls[:3]) < 1e-6  # one hue per variant
    assert hls[3][0] == pytest.approx(hls[4][0]) and abs(hls[0][0] - hls[3][0]) > 0.05
    assert [light for _, light, _ in hls[:3]] == sorted(light for _, light, _ in hls[:3])  # dark to light


def _panel(key, values, references=()):
    fig, ax = plt.subplots()
    curves._draw_lines(ax, key, [Line("a", list(enumerate(values)), seed=0)], references, None, "step", False)
    return fig, ax


def test_probability_axes_are_zero_to_one_even_when_curves_float():
    fig, ax = _panel("nim/win_vs_random", [0.55, 0.7, 0.95])
    assert ax.get_ylim() == pytest.approx((-0.02, 1.02))
    plt.close(fig)


def test_reference_lines_are_drawn_and_named():
    refs = [Reference(1.0, "optimal play"), Reference(0.54, "uniform random policy (0.54)")]
    fig, ax = _panel("nim/optimal_move_prob", [0.54, 0.9], refs)
    flat = {tuple(ln.get_ydata()) for ln in ax.lines if len(set(ln.get_ydata())) == 1 and ln.get_label()[0] != "a"}
    assert flat == {(1.0, 1.0), (0.54, 0.54)}
    assert {t.get_text() for t in ax.get_legend().get_texts()} >= {"optimal play", "uniform random policy (0.54)"}
    assert ax.get_title() == "Nim: P(optimal move)"
    plt.close(fig)


def test_gap_axis_from_zero_reaches_its_reference():
    fig, ax = _panel("kuhn_poker/exploitability", [0.3, 0.1], [Reference(0.46, "uniform random policy")])
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 0.46
    plt.close(fig)


def test_plot_lines_writes_one_png_with_a_legend_entry_per_seed(tmp_path):
    lines = [Line("magnet", [(0, 0.5), (10, 0.9)], seed=s) for s in (0, 1, 2)]
    assert [ln.label() for ln in lines] == ["magnet, seed 0", "magnet, seed 1", "magnet, seed 2"]
    out = curves.plot_lines({"nim/optimal_move_prob": lines}, tmp_path / "l.png", "t",
                            {"nim/optimal_move_prob": [Reference(1.0, "optimal play")]})
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*"))  # the atomic write left no temporary file


def test_heatmap_is_fixed_to_zero_one(tmp_path):
    out = curves.heatmap([[0.5, 0.9], [0.1, float("nan")]], ["a", "b"], ["a", "b"], tmp_path / "h.png")
    assert out.stat().st_size > 1000


def test_reference_lines_come_from_what_the_game_declares():
    from lmselfplay.eval.game_metrics import plot_annotations

    refs, titles = plot_annotations(["nim", "kuhn_poker", "go9", "train"])
    assert titles == {"nim": "Nim", "kuhn_poker": "Kuhn poker", "go9": "Go 9x9"}  # train is no game
    nim = {r.label.split(" (")[0]: r.value for r in refs["nim/optimal_move_prob"]}
    assert nim["optimal play"] == 1.0 and 0 < nim["uniform random policy"] < 1
    kuhn = {r.label.split(" (")[0]: r.value for r in refs["kuhn_poker/exploitability"]}
    assert kuhn["Nash equilibrium"] == 0.0 and kuhn["uniform random policy"] == pytest.approx(0.4583, abs=1e-3)
    assert not any(k.startswith("go9/") and "optimal" in k for k in refs)  # too large to solve: win rates only
    assert [r.value for r in refs["nim/mean_return_vs_random"]] == [0.0]
