"""An evaluation against a GTP engine only measures: its failure never ends a training run."""

import json
import sys
from pathlib import Path

from lmselfplay.games.gtp import GTPPlayer
from lmselfplay.selfplay_games import metrics as selfplay_metrics
from lmselfplay.selfplay_games import steps as selfplay
from lmselfplay.utils.checkpoint import checkpoint_dirs, verify_checkpoint
from lmselfplay.utils.recipe_loader import run_recipe

FAKE = str(Path(__file__).resolve().parents[1] / "fake_gtp.py")


def test_a_crashing_engine_in_evaluation_is_logged_and_the_run_goes_on(model_dir, tmp_path, monkeypatch, capsys):
    for module in (selfplay, selfplay_metrics):  # both ask whether gnugo is installed
        monkeypatch.setattr(module, "find_gnugo", lambda: "/usr/games/gnugo")
    monkeypatch.setattr(selfplay_metrics, "game_gnugo_player", lambda game, level: GTPPlayer(
        [sys.executable, FAKE, "crash"], name="gnugo-l1", timeout=5, move_timeout=1.0))
    out = tmp_path / "run"
    args = {"model_name_or_path": model_dir, "output_dir": out, "max_steps": 2, "games": "go9", "eval_every": 1,
            "eval_games": 2, "episodes_per_step": 2, "max_turns": 6, "checkpoint_every": 1, "league_add_every": 0,
            "max_new_tokens": 6, "gnugo_level": 1, "gnugo_games": 2}
    run_recipe("selfplay_games", [a for k, v in args.items() for a in (f"--{k}", str(v))])
    assert "warning: step 0: the evaluation against GnuGo failed" in capsys.readouterr().err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "go9/win_vs_gnugo_l1_failed" in r] == [0, 1, 2]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    assert [p.name for p in checkpoint_dirs(out)] == ["checkpoint-1", "checkpoint-2"]
    assert verify_checkpoint(out / "checkpoint-2") is None and (out / "final_model").is_dir()
