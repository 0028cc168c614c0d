"""Run folders never lose data: a fresh run into an earlier run's folder is refused (every
recipe), ``--overwrite_output_dir`` replaces it cleanly (and never empties a folder no run
made), an output folder that is a file or not writable is one line, exit 2.

Read-only folders are simulated by monkeypatching ``os.access`` (the check
:func:`lock_output_dir` makes): the tests run as root, for whom a read-only folder is still
writable, and the interpreter lives where an unprivileged user cannot run it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from warm_process import run_warm

from lmselfplay.utils import run as run_module
from lmselfplay.utils.checkpoint import atomic_dir, checkpoint_dirs
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.recipe_loader import run_recipe
from lmselfplay.utils.run import LOCK_FILE, RunFolderTaken, claim_output_dir, release_output_dir

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ["absolute_zero", "alphazero", "debate", "r_zero", "search_selfplay", "selfplay_games", "spin"]


def finished_run(out: Path) -> dict[str, bytes]:
    """A folder as a finished run leaves it; returns its :func:`snapshot`."""
    out.mkdir(parents=True)
    (out / LOCK_FILE).write_text("12345\n")
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 5)))
    (out / "config.json").write_text('{"max_steps": 5}')
    with atomic_dir(out / "checkpoint-5") as tmp:
        (tmp / "state.pt").write_bytes(b"weights of step 5")
    return snapshot(out)


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file's bytes but the lock's (which holds the pid of whoever looked last)."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


def cfg(out, resume=False, overwrite=False):
    return SimpleNamespace(output_dir=str(out), resume=resume, overwrite_output_dir=overwrite)


@pytest.fixture(autouse=True)
def release(tmp_path):
    """Every lock this process took in a test is dropped after it."""
    yield
    for key in list(run_module._held):
        if tmp_path in key.parents:
            release_output_dir(key)


def test_fresh_run_into_an_earlier_run_is_refused_and_touches_nothing(tmp_path):
    out = tmp_path / "run"
    before = finished_run(out)
    with pytest.raises(RunFolderTaken, match=r"already holds files \(checkpoint-5, config.json, metrics.jsonl\): "
                                             r"--resume true continues that run, --overwrite_output_dir true"):
        claim_output_dir(cfg(out))
    assert snapshot(out) == before


def test_overwrite_empties_the_folder_and_resume_keeps_it(tmp_path):
    out = tmp_path / "run"
    before = finished_run(out)
    assert claim_output_dir(cfg(out, resume=True)) == out and snapshot(out) == before
    release_output_dir(out)
    claim_output_dir(cfg(out, overwrite=True))
    assert sorted(os.listdir(out)) == [LOCK_FILE]
    assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
    with pytest.raises(ConfigError, match="exclude each other"):
        claim_output_dir(cfg(out, resume=True, overwrite=True))


def test_overwrite_never_empties_a_folder_no_run_made(tmp_path):
    """E.g. ``--output_dir`` pointed at a model folder: it stays as it was, no lock is left."""
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"weights")
    before = snapshot(out)
    with pytest.raises(RunFolderTaken, match="no run made"):
        claim_output_dir(cfg(out, overwrite=True))
    assert snapshot(out) == before and not (out / LOCK_FILE).exists()


def test_new_and_empty_folders_are_taken(tmp_path):
    claim_output_dir(cfg(tmp_path / "new" / "run"))
    assert os.listdir(tmp_path / "new" / "run") == [LOCK_FILE]
    (tmp_path / "empty").mkdir()
    claim_output_dir(cfg(tmp_path / "empty"))


def test_a_file_or_a_read_only_folder_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "ro").mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != tmp_path / "ro" and real_access(p, mode, **kw))
    for out, says in [(tmp_path / "file", "is a file, not a folder"), (tmp_path / "file" / "run", "is a file"),
                      (tmp_path / "ro", "cannot be written: Permission denied")]:
        assert run_main(lambda argv, out=out: claim_output_dir(cfg(out)), []) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: output_dir {out} ") and says in err, err
    assert os.listdir(tmp_path / "ro") == []


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_refuses_a_fresh_run_into_a_finished_one(recipe, tmp_path):
    out = tmp_path / "run"
    before = finished_run(out)
    with pytest.raises(RunFolderTaken, match="already holds files"):
        run_recipe(recipe, ["--output_dir", str(out)])
    assert snapshot(out) == before


class Claimed(Exception):
    """Raised right after the recipe claimed its folder: the test ends the run there."""


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_overwrites_through_the_one_claim(recipe, tmp_path, monkeypatch):
    out = tmp_path / "run"
    finished_run(out)

    def claim_then_stop(c):
        claim_output_dir(c)
        raise Claimed

    monkeypatch.setattr(run_module, "claim_output_dir", claim_then_stop)  # the Run every recipe starts
    with pytest.raises(Claimed):
        run_recipe(recipe, ["--output_dir", str(out), "--overwrite_output_dir", "true"])
    assert sorted(os.listdir(out)) == [LOCK_FILE]


def test_refusal_from_the_command_line_is_one_line_exit_2(tmp_path):
    """What the user types: a second fresh run into a finished run's folder."""
    out = tmp_path / "run"
    before = finished_run(out)
    r = run_warm([str(ROOT / "recipes" / "alphazero.py"), "--output_dir", str(out)],
                 {**os.environ, "OMP_NUM_THREADS": "1"}, ROOT, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert r.stderr.startswith(f"error: {out} already holds files")
    assert snapshot(out) == before


def _selfplay(model_dir, out, steps, *extra):
    args = {"model_name_or_path": model_dir, "output_dir": out, "max_steps": steps, "games": "nim",
            "episodes_per_step": 4, "eval_every": 0, "eval_games": 2, "eval_positions": 4, "checkpoint_every": 1,
            "league_add_every": 1, "max_new_tokens": 6}
    run_recipe("selfplay_games", [a for k, v in args.items() for a in (f"--{k}", str(v))] + list(extra))


def test_overwrite_replaces_a_finished_run_and_resume_continues_the_new_one(model_dir, tmp_path):
    """The old failure: a fresh 1-step run into a finished 3-step run's folder kept the old
    checkpoints, so --resume continued the old run (steps 1, 1, 3, 3 in the log)."""
    out = tmp_path / "run"
    _selfplay(model_dir, out, 3)
    with pytest.raises(RunFolderTaken):
        _selfplay(model_dir, out, 1)
    _selfplay(model_dir, out, 1, "--overwrite_output_dir", "true")
    assert [p.name for p in checkpoint_dirs(out)] == ["checkpoint-1"]
    _selfplay(model_dir, out, 2, "--resume", "true")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    assert [p.name for p in checkpoint_dirs(out)] == ["checkpoint-1", "checkpoint-2"]


@pytest.mark.parametrize("code", ["ENOSPC", "EROFS", "EACCES"])
def test_any_write_the_storage_refuses_is_one_line_exit_2(code, capsys):
    """E.g. metrics.jsonl on a full disk: not a checkpoint, still the user's to fix."""
    import errno

    def main(argv):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), "runs/x/metrics.jsonl")

    assert run_main(main, []) == 2
    err = capsys.readouterr().err
    assert err == f"error: {os.strerror(getattr(errno, code))}: runs/x/metrics.jsonl\n"
