"""The one run skeleton (lmselfplay.utils.run.Run) every recipe's ``main`` runs in: the
fresh-vs-resume decision, the log, checkpoint timing, teardown (also on an exception), the
run fields declared once, and the old key name that now names the new one."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from recipe_configs import parse_recipe

from lmselfplay.alphazero.config import AlphaZeroConfigs
from lmselfplay.utils.checkpoint import atomic_dir
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.run import PeriodicCheckpoints, Run, RunConfig, release_output_dir

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ("selfplay_games", "spin", "search_selfplay", "alphazero", "absolute_zero", "r_zero", "debate")


@dataclass
class TinyConfig(RunConfig, PeriodicCheckpoints):
    gradient_accumulation_steps: int = 1
    max_steps: int = 3

    run_name = "tiny"


class Closable:
    def __init__(self, log):
        self.log = log

    def close(self):
        self.log.append("closed")


def test_output_dir_defaults_to_the_recipes_run_folder():
    assert TinyConfig().output_dir == "runs/tiny"
    assert TinyConfig(output_dir="x").output_dir == "x"
    assert AlphaZeroConfigs.parse([]).run.output_dir == "runs/alphazero"
    assert AlphaZeroConfigs.parse(["--output_dir", "x"]).run.output_dir == "x"


def test_fresh_then_resumed_says_which_once(tmp_path, capsys):
    out = tmp_path / "run"
    with Run(TinyConfig(output_dir=str(out), resume=True), trains_with="state") as run:
        assert run.checkpoint is None
        run.report_start(0)
        run.open_log(None)
        run.log(1, {"x": 1.0})
    assert capsys.readouterr().err.count("starting fresh") == 1
    assert json.loads((out / "config.json").read_text())["max_steps"] == 3
    with atomic_dir(out / "checkpoint-2") as tmp:
        (tmp / "state").write_text("s")
    release_output_dir(out)
    with Run(TinyConfig(output_dir=str(out), resume=True), trains_with="state") as run:
        assert run.checkpoint == out / "checkpoint-2"
        run.report_start(2)
    err = capsys.readouterr().err
    assert f"resumed from {out / 'checkpoint-2'} at step 2" in err and "starting fresh" not in err
    release_output_dir(out)


def test_teardown_closes_everything_also_on_an_exception(tmp_path, monkeypatch):
    log = []
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="boom"):
        with Run(TinyConfig(output_dir=str(out)), trains_with="state") as run:
            monkeypatch.setattr(run.acc, "destroy_process_group", lambda: log.append("group"), raising=False)
            monkeypatch.setattr(run.acc, "wait_for_everyone", lambda: log.append("waited"), raising=False)
            run.closing(Closable(log))
            run.open_log(None)
            monkeypatch.setattr(run.logger, "close", lambda: log.append("log"))
            raise RuntimeError("boom")
    assert log == ["closed", "log", "group"]  # no wait for peers after a failure: a dead one would hang it
    release_output_dir(out)


def test_checkpoint_timing_is_read_one_way(tmp_path):
    out = tmp_path / "run"
    with Run(TinyConfig(output_dir=str(out), checkpoint_every=2), checkpoint_every=2, trains_with="state") as run:
        assert [s for s in range(1, 6) if run.checkpoint_due(s)] == [2, 4]
        assert run.checkpoint_due(5, last=True)
    release_output_dir(out)
    with Run(TinyConfig(output_dir=str(out), checkpoint_every=0, overwrite_output_dir=True),
             checkpoint_every=0, trains_with="state") as run:
        assert not any(run.checkpoint_due(s, last=True) for s in range(1, 6))
    release_output_dir(out)


@pytest.mark.parametrize("where", ["cli", "yaml"])
def test_the_old_checkpoint_interval_name_names_the_new_one(where, tmp_path):
    argv = ["--save_every", "2"]
    if where == "yaml":
        (tmp_path / "c.yaml").write_text("save_every: 2\n")
        argv = ["--config", str(tmp_path / "c.yaml")]
    with pytest.raises(ConfigError, match="save_every is now called checkpoint_every"):
        AlphaZeroConfigs.parse(argv)


@pytest.mark.parametrize("recipe", ["spin", "r_zero"])
def test_recipes_that_checkpoint_per_iteration_refuse_a_checkpoint_interval(recipe):
    """SPIN saves every iteration, R-Zero every phase: an interval they would ignore is an error."""
    with pytest.raises(ConfigError, match="checkpoint_every"):
        parse_recipe(recipe, ["--checkpoint_every", "5"])


def _recipe_source(name):
    """The recipe script, read with its package (``lmselfplay/NAME/``: its configs and the steps its loop calls)."""
    paths = [ROOT / "recipes" / f"{name}.py", *sorted((ROOT / "lmselfplay" / name).glob("*.py"))]
    return "\n".join(p.read_text() for p in paths)


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_runs_in_the_skeleton(recipe):
    """No recipe sets up processes, claims its folder, opens a log or copies the ZeRO-3
    reference block itself, and none redeclares a run field of RunConfig."""
    src = _recipe_source(recipe)
    for own in ("make_accelerator(", "PartialState(", "claim_output_dir(", "MetricsLogger(", "open_run_log(",
                "resume_checkpoint(", "is_partitioned(", "starting fresh"):
        assert own not in src, f"{recipe} calls {own} itself"
    assert "Run(cfg" in src
    run_fields = {"output_dir", "resume", "overwrite_output_dir", "resume_fallback", "collective_timeout_s",
                  "checkpoint_every", "tensorboard", "save_every"}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ClassDef) and node.name.endswith(("Config", "Args")):
            declared = {t.target.id for t in node.body if isinstance(t, ast.AnnAssign)}
            assert not declared & run_fields, f"{recipe}.{node.name} redeclares {declared & run_fields}"


def test_a_refused_folder_leaves_no_process_group(tmp_path, monkeypatch):
    from accelerate import PartialState

    from lmselfplay.utils.run import RunFolderTaken

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    ended = []
    monkeypatch.setattr(PartialState, "destroy_process_group", lambda self, group=None: ended.append(group))
    with pytest.raises(RunFolderTaken):
        Run(TinyConfig(output_dir=str(out)), trains_with="state")
    assert ended == [None]
