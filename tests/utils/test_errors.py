"""Errors a person reads in one line: invalid values name the field, the value and the
type; unknown names list what is valid; a missing model folder says so (not a hub error);
--help works; the config loader never raises anything but ConfigError on any input."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from warm_process import run_warm

from lmselfplay.utils.config import ConfigError, parse_configs
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.recipe_loader import run_recipe

ROOT = Path(__file__).resolve().parents[2]


def _one_line_error(capsys, argv, recipe="selfplay_games"):
    code = run_main(partial(run_recipe, recipe), argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


def test_a_bad_value_names_the_field_value_and_type(capsys):
    line = _one_line_error(capsys, ["--max_steps", "abc"])
    assert "max_steps" in line and "'abc'" in line and "int" in line


def test_an_unknown_game_lists_the_known_ones(capsys):
    line = _one_line_error(capsys, ["--games", "chess"])
    assert "'chess'" in line and "tictactoe" in line and "kuhn_poker" in line


def test_a_bad_config_is_reported_even_while_its_output_folder_is_busy(capsys, tmp_path):
    """The config is checked before the output folder is locked, so a typo is named at
    once rather than hidden behind "in use by a live run" (here another process holds it)."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from lmselfplay.utils.run import lock_output_dir; "
        f"lock_output_dir({str(tmp_path)!r}); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        line = _one_line_error(capsys, ["--games", "chess", "--output_dir", str(tmp_path)])
        assert "'chess'" in line and "in use" not in line
        line = _one_line_error(capsys, ["--output_dir", str(tmp_path)])
        assert "in use by a live run" in line
    finally:
        holder.kill()
        holder.wait()


def test_a_missing_model_folder_says_so_without_a_hub_message(capsys, tmp_path):
    line = _one_line_error(capsys, ["--model_name_or_path", "/nonexistent/model", "--output_dir", str(tmp_path)])
    assert "/nonexistent/model" in line and "no such local folder" in line
    assert "Repo id" not in line and "huggingface" not in line.lower()


def test_a_bad_yaml_value_and_a_missing_config_file(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("learning_rate: lots\n")
    line = _one_line_error(capsys, ["--config", str(bad)])
    assert "learning_rate" in line and "'lots'" in line and "float" in line
    bad.write_text("beta: {nim: lots}\n")  # a per-game mapping is checked by its own parser
    line = _one_line_error(capsys, ["--config", str(bad)])
    assert "beta" in line and "lots" in line
    line = _one_line_error(capsys, ["--config", str(tmp_path / "nope.yaml")])
    assert "nope.yaml" in line


def test_debug_shows_the_traceback(capsys):
    code = run_main(partial(run_recipe, "selfplay_games"), ["--games", "chess", "--debug"])
    assert code == 2 and "Traceback" in capsys.readouterr().err


RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.py"))  # a new recipe is checked too


def test_every_recipe_help_exits_zero():
    """Each recipe's ``--help`` as a process of its own, forked warm (tests/warm_process.py)."""
    assert len(RECIPES) >= 7, RECIPES  # the glob found the recipes folder
    failed = {}
    for recipe in RECIPES:
        proc = run_warm([str(ROOT / "recipes" / f"{recipe}.py"), "--help"], dict(os.environ), ROOT, timeout=300)
        if proc.returncode != 0 or "usage:" not in proc.stdout or "error" in proc.stderr.lower():
            failed[recipe] = (proc.returncode, proc.stderr[-1000:])
    assert not failed, failed


@dataclass
class _Cfg:
    n: int = 1
    lr: float = 0.1
    flag: bool = False
    name: str = "x"
    path: str | None = None
    values: list[float] = field(default_factory=lambda: [0.5])


yaml_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                          max_size=3), max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(doc=st.one_of(yaml_values, st.dictionaries(st.sampled_from(["n", "lr", "flag", "name", "path", "values", "zz"]),
                                                  yaml_values, max_size=4)),
       argv=st.lists(st.sampled_from(["--n", "--lr", "--flag", "--name", "--values", "--zz", "3", "x", "-1",
                                      "1e-3", "true", "--"]), max_size=5))
def test_config_loader_fuzz_raises_only_config_errors(tmp_path_factory, doc, argv):
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        cfg = parse_configs((_Cfg,), ["--config", str(path), *argv])[0]
    except ConfigError:
        return
    assert isinstance(cfg.n, int) and isinstance(cfg.lr, float) and isinstance(cfg.flag, bool)


def test_a_dead_or_hung_peer_is_one_line_and_other_runtime_errors_keep_their_traceback(capsys):
    from lmselfplay.utils.errors import run_main

    def hung(argv):  # what gloo raises when a peer does not answer within the timeout
        raise RuntimeError("[third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                           "Timed out waiting 3000ms for recv operation to complete")

    assert run_main(hung, []) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: a collective operation failed")
    assert "Timed out waiting 3000ms" in err and "--resume" in err

    def bug(argv):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_main(bug, [])


@dataclass
class _Weighted:
    yaml_mappings = ("weights",)
    name: str = "x"
    weights: str = ""


def test_yaml_numbers_become_text_and_only_mapping_fields_take_mappings(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: 5\nweights: {a: 1, b: 2}\n")
    cfg = parse_configs((_Weighted,), ["--config", str(path)])[0]
    assert cfg.name == "5" and cfg.weights == {"a": 1, "b": 2}
    path.write_text("name: {a: 1}\n")
    with pytest.raises(ConfigError, match="name"):
        parse_configs((_Weighted,), ["--config", str(path)])
