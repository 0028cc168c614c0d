"""A resume whose config differs from the saved one: every differing field is printed
(``field: old -> new``); a field that changes what the run means (RunConfig.resume_fixed's rule: the
games, the model, a saved buffer's size; each recipe's parts name their own) refuses it unless
``--resume_with_changes true``."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from typing import ClassVar

import pytest
from recipe_configs import RECIPE_CONFIGS

from lmselfplay.referee_study import RefereeStudyConfigs
from lmselfplay.utils.checkpoint import atomic_dir
from lmselfplay.utils.config import ConfigError, field_owners
from lmselfplay.utils.metrics_logger import read_jsonl
from lmselfplay.utils.recipe_loader import run_recipe
from lmselfplay.utils.run import Run, RunConfig, config_changes, release_output_dir


def _args(model_dir, out, steps, *extra):
    return ["--model_name_or_path", str(model_dir), "--output_dir", str(out), "--max_steps", str(steps),
            "--games", "nim", "--episodes_per_step", "4", "--eval_every", "0", "--eval_games", "2",
            "--eval_positions", "5", "--checkpoint_every", "1", "--max_new_tokens", "6", "--tensorboard", "false",
            *extra]


@pytest.fixture(scope="module")
def one_step(model_dir, tmp_path_factory):
    """A finished 1-step self-play run (each test resumes a copy of it)."""
    out = tmp_path_factory.mktemp("one_step") / "run"
    run_recipe("selfplay_games", _args(model_dir, out, 1))
    release_output_dir(out)
    return out


def _copy(one_step, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(one_step, out)
    return out


def test_a_changed_harmless_field_is_printed_and_the_run_goes_on(one_step, model_dir, tmp_path, capsys):
    out = _copy(one_step, tmp_path)
    capsys.readouterr()
    run_recipe("selfplay_games", _args(model_dir, out, 2, "--eval_games", "3", "--resume", "true"))
    err = capsys.readouterr().err
    assert "max_steps: 1 -> 2\n" in err and "eval_games: 2 -> 3\n" in err
    assert "\ngames:" not in err and "\nresume:" not in err  # unchanged fields and the resume flags are not said
    assert max(r["step"] for r in read_jsonl(out / "metrics.jsonl")) == 2
    assert json.loads((out / "config.json").read_text())["eval_games"] == 3  # the run's config is now the new one


def test_a_changed_game_list_refuses_the_resume(one_step, model_dir, tmp_path, capsys):
    out = _copy(one_step, tmp_path)
    with pytest.raises(ConfigError, match=r"^--resume: games changed since .*--resume_with_changes true$"):
        run_recipe("selfplay_games", _args(model_dir, out, 2, "--games", "nim,kuhn_poker", "--resume", "true"))
    assert "games: 'nim' -> 'nim,kuhn_poker'\n" in capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["games"] == "nim"  # nothing was written
    assert max(r["step"] for r in read_jsonl(out / "metrics.jsonl")) == 1


def test_resume_with_changes_continues_with_the_new_games(one_step, model_dir, tmp_path, capsys):
    out = _copy(one_step, tmp_path)
    run_recipe("selfplay_games", _args(model_dir, out, 2, "--games", "nim,kuhn_poker", "--resume", "true",
                                       "--resume_with_changes", "true"))
    assert "games: 'nim' -> 'nim,kuhn_poker'\n" in capsys.readouterr().err
    assert any("kuhn_poker/exploitability" in r for r in read_jsonl(out / "metrics.jsonl"))


@dataclass
class Extended(RunConfig):
    """A recipe's config extending the fixed set with a field of its own."""

    resume_fixed: ClassVar[frozenset[str]] = RunConfig.resume_fixed | {"buffer_rows"}
    buffer_rows: int = 8
    gradient_accumulation_steps: int = 1


def test_a_recipe_extends_the_fixed_fields(tmp_path):
    out = tmp_path / "run"
    with Run(Extended(output_dir=str(out)), trains_with="state") as run:
        run.open_log(None)
    with atomic_dir(out / "checkpoint-1") as tmp:
        (tmp / "state").write_text("s")
    release_output_dir(out)
    with pytest.raises(ConfigError, match="buffer_rows changed"):
        Run(Extended(output_dir=str(out), resume=True, buffer_rows=16), trains_with="state")
    release_output_dir(out)
    saved = json.loads((out / "config.json").read_text())
    new = asdict(Extended(output_dir=str(out), resume=True, resume_with_changes=True))
    assert config_changes(saved, new) == {}
    assert config_changes({**saved, "gone": 1}, asdict(Extended(output_dir=str(out)))) == {"gone": (1, "(absent)")}


# every field any recipe fixes on a resume, by its name
FIXED_NAMES = frozenset({
    "games", "game", "game_args", "task_form", "task_families", "reasoning_gym_datasets", "dataset_path",
    "dataset", "dataset_split", "dataset_config", "model_name_or_path", "use_lora", "lora_r", "lora_target_modules", "network",
    "hidden", "blocks", "value_width", "q_head", "two_copies", "league_capacity", "league_hall_capacity",
    "replay_window", "bank_size", "pool_size", "task", "task_config",
})
ALL_CONFIGS = {**RECIPE_CONFIGS, "referee_study": RefereeStudyConfigs}


@pytest.mark.parametrize("name", sorted(ALL_CONFIGS))
def test_a_recipe_fixes_exactly_its_fields_of_the_fixed_names(name):
    """The union of a recipe's parts' resume_fixed is the fixed names among its own fields:
    none missing, none that the recipe does not have."""
    cls = ALL_CONFIGS[name]
    assert cls.fixed_on_resume() == FIXED_NAMES & set(field_owners(cls.classes())), name


def test_every_recipe_hands_its_fixed_fields_to_its_run():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sources = sorted((root / "recipes").glob("*.py"))
    runs = [p for p in sources if "Run(cfg.run" in p.read_text()]
    assert len(runs) >= 8
    for path in runs:
        assert "Run(cfg.run, cfg.as_dict(), resume_fixed=cfg.fixed_on_resume()," in path.read_text(), path.name
