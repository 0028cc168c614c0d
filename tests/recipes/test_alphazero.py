"""The AlphaZero recipe end to end: a short run, artifacts, exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmselfplay.alphazero.config import AlphaZeroConfigs
from lmselfplay.utils.checkpoint import latest_checkpoint
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.metrics_logger import read_jsonl
from lmselfplay.utils.recipe_loader import run_recipe

ROOT = Path(__file__).resolve().parents[2]


FAST = ["--game", "nim", "--game_args", '{"start": 7}', "--games_per_iteration", "12",
        "--n_sims", "4", "--train_steps", "5", "--batch_size", "16", "--hidden", "16",
        "--blocks", "1", "--eval_games", "4", "--eval_budgets", "0", "4", "--winrate_games", "2",
        "--bank_every", "1", "--tensorboard", "false", "--progress", "false"]


def strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_short_run_and_exact_resume(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    run_recipe("alphazero", FAST + ["--iterations", "3", "--output_dir", str(full)])
    rows = read_jsonl(full / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    last = rows[-1]
    for key in ("train/loss", "eval/sims0_vs_random", "eval/sims4_vs_exact",
                "eval/raw_optimal_fraction", "eval/winrate_vs_past_mean", "bank/size"):
        assert key in last, key
    assert last["bank/size"] == 3
    assert latest_checkpoint(full).name == "checkpoint-3"
    for png in ("curves.png", "progress.png", "winrate_matrix.png"):
        assert (full / png).stat().st_size > 0
    # Kill after iteration 2 (simulated by a shorter run), then resume to 3: identical results.
    run_recipe("alphazero", FAST + ["--iterations", "2", "--output_dir", str(part)])
    run_recipe("alphazero", FAST + ["--iterations", "3", "--output_dir", str(part), "--resume"])
    assert strip(read_jsonl(part / "metrics.jsonl")) == strip(rows)
    saved = json.loads((part / "checkpoint-3" / "config.json").read_text())
    assert saved["iterations"] == 3


def test_resume_with_other_network_is_a_clear_error(tmp_path):
    run_recipe("alphazero", FAST + ["--iterations", "1", "--output_dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="hidden"):
        run_recipe("alphazero", FAST + ["--iterations", "2", "--output_dir", str(tmp_path), "--resume",
                                        "--hidden", "32"])


def test_gate_run(tmp_path):
    metrics = run_recipe("alphazero", FAST + ["--iterations", "1", "--gate", "--gate_games", "4",
                                              "--output_dir", str(tmp_path)])
    assert 0.0 <= metrics["gate/score"] <= 1.0


@pytest.mark.parametrize("bad", [["--game_args", "{nope"], ["--iterations", "0"],
                                 ["--bank_fraction", "2"], ["--no_such_key", "1"]])
def test_bad_config_is_a_clear_error(tmp_path, bad):
    with pytest.raises(ConfigError):
        run_recipe("alphazero", ["--output_dir", str(tmp_path)] + bad)


def test_yaml_configs_parse():
    for name in ("alphazero_nim.yaml", "alphazero_tictactoe.yaml"):
        cfg = AlphaZeroConfigs.parse(["--config", str(ROOT / "recipes/configs" / name)])
        assert cfg.puct.n_sims > 0 and cfg.alphazero.eval_budgets == [0, 16, 32, 64]
