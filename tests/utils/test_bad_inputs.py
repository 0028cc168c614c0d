"""Inputs that are not flags, as the recipes' command lines meet them: a config file that is
not text, nested too deeply or empty, a flag given twice, a damaged model folder, a model path
that is a file, an unknown sandbox in the environment, an executor worker count out of range, a
damaged run config at ``--resume``, and ``--resume`` into a folder that holds no run of this
project or a finished one without checkpoints.

Each runs the real recipe script as its own process and must end with status 2, one line on
stderr starting ``error:`` that names the file or value, no traceback, nothing written (the
output folder absent, or every file of a folder it was pointed at unchanged), and within 5 s:
the check happens before any model loads (loading and the sandbox's start take far longer).
The damaged cached copy of the embedded model is not an error: it is replaced, in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from warm_process import run_warm

from lmselfplay.models import cache as tiny
from lmselfplay.models.model_folder import ModelFolderError, check_model_folder
from lmselfplay.utils.checkpoint import atomic_dir

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED = tiny.EMBEDDED_DIR
SELFPLAY = ["recipes/selfplay_games.py", "--config", "recipes/configs/selfplay_games.yaml"]
AZR = ["recipes/absolute_zero.py", "--config", "recipes/configs/absolute_zero.yaml"]
BEFORE_MODEL_LOADS_S = 5.0


@pytest.fixture(scope="module", autouse=True)
def warm_interpreter():
    """The warm process's libraries imported once before any case is timed."""
    run_warm([*SELFPLAY, "--help"], env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT, timeout=300)


def model_copy(tmp_path: Path) -> Path:
    """A loadable model folder: a copy of the shipped embedded model."""
    out = tmp_path / "model"
    shutil.copytree(EMBEDDED, out)
    return out


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file's bytes but the run lock's (it holds the pid of the last run that looked)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lmselfplay.lock"}


def refuse(argv: list[str], *names: str, env: dict[str, str] | None = None, folder: Path | None = None,
           out: Path | None = None) -> str:
    """Run ``argv`` (a recipe script and its flags) and check the one-line refusal; ``names``
    must appear in it; ``folder`` must be left byte for byte, ``out`` must not be created."""
    before = snapshot(folder) if folder is not None else None
    t0 = time.monotonic()
    p = run_warm(argv, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, cwd=ROOT, timeout=120)
    took = time.monotonic() - t0
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr[-2000:]
    assert "Traceback" not in p.stderr + p.stdout
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert took < BEFORE_MODEL_LOADS_S, f"{took:.1f} s: the check came after the model loaded"
    if folder is not None:
        assert snapshot(folder) == before
    if out is not None:
        assert not out.exists()
    return lines[0]


# --- config files and flags -------------------------------------------------------------------

@pytest.mark.parametrize("content,what", [
    (bytes(range(256)) * 4, "is not a text file"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is not a text file"),
    (b"[" * 20000 + b"]" * 20000, "nested too deeply"),
    (b"a:\n" + b"".join(b" " * (i + 1) + b"a:\n" for i in range(3000)), "nested too deeply"),
    (b"", "is empty"),
    (b"# only a comment\n", "is empty"),
])
def test_config_file_that_cannot_be_read(tmp_path, content, what):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(content)
    out = tmp_path / "out"
    refuse(["recipes/selfplay_games.py", "--config", str(cfg), "--output_dir", str(out)], str(cfg), what, out=out)


def test_flag_given_twice_is_said_and_the_last_wins(capsys):
    from lmselfplay.selfplay_games.config import SelfPlayConfigs

    cfg = SelfPlayConfigs.parse(["--max_steps", "3", "--eval_every", "0", "--max_steps=4", "--eval_every", "0"])
    assert cfg.selfplay.max_steps == 4
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["note: --max_steps is given twice (3, then 4): the last one is used"]


# --- model folders -----------------------------------------------------------------------------

def truncate(file: Path, keep: float = 0.5) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])


def as_torch_bin(model: Path, cut: bool) -> None:
    """The weights as ``pytorch_model.bin`` (torch's zip format), cut in half with ``cut``."""
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(model / "model.safetensors"), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    if cut:
        truncate(model / "pytorch_model.bin")


@pytest.mark.parametrize("damage,named", [
    (lambda m: truncate(m / "model.safetensors"), "model.safetensors"),
    (lambda m: truncate(m / "model.safetensors", 0.999), "model.safetensors"),
    (lambda m: (m / "model.safetensors").write_bytes(b"\x00" * 7), "model.safetensors"),
    (lambda m: truncate(m / "config.json"), "config.json"),
    (lambda m: (m / "config.json").write_text("[1, 2]"), "config.json"),
    (lambda m: (m / "config.json").unlink(), "config.json"),
    (lambda m: [(m / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")], "tokenizer"),
    (lambda m: truncate(m / "tokenizer.json"), "tokenizer.json"),
    (lambda m: (m / "model.safetensors").unlink(), "no weights"),
    (lambda m: as_torch_bin(m, cut=True), "pytorch_model.bin"),
])
def test_damaged_model_folder(tmp_path, damage, named):
    model = model_copy(tmp_path)
    damage(model)
    out = tmp_path / "out"
    line = refuse([*SELFPLAY, "--model_name_or_path", str(model), "--output_dir", str(out)], named, folder=model,
                  out=out)
    assert "sentencepiece" not in line


def test_model_path_that_is_a_file(tmp_path):
    file = model_copy(tmp_path) / "model.safetensors"
    out = tmp_path / "out"
    refuse([*SELFPLAY, "--model_name_or_path", str(file), "--output_dir", str(out)], str(file), "is a file", out=out)


def test_intact_model_folder_passes_the_check(tmp_path):
    check_model_folder(model_copy(tmp_path))  # no error: the shipped build is a loadable folder
    as_torch_bin(tmp_path / "model", cut=False)
    check_model_folder(tmp_path / "model")
    with pytest.raises(ModelFolderError, match="judge_model_name_or_path"):
        check_model_folder(tmp_path / "model" / "config.json", "judge_model_name_or_path")


# --- the sandbox's settings --------------------------------------------------------------------

def test_unknown_sandbox_in_the_environment(tmp_path):
    out = tmp_path / "out"
    refuse([*AZR, "--output_dir", str(out)], "LMSELFPLAY_SANDBOX", "'seatbelt'", env={"LMSELFPLAY_SANDBOX": "seatbelt"},
           out=out)


def test_executor_worker_count_out_of_range(tmp_path):
    out = tmp_path / "out"
    refuse([*AZR, "--output_dir", str(out), "--max_workers", "5000"], "max_workers", "5000", out=out)


def test_the_executor_worker_flags_old_name_says_the_new_one(tmp_path):
    out = tmp_path / "out"
    refuse([*AZR, "--output_dir", str(out), "--executor_workers", "2"], "executor_workers is now called max_workers",
           out=out)


# --- run folders at --resume -------------------------------------------------------------------

def run_with_checkpoint(out: Path, config_text: str) -> Path:
    """A run folder as a killed run leaves it, with the given ``config.json`` text."""
    out.mkdir()
    (out / ".lmselfplay.lock").write_text("1\n")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "config.json").write_text(config_text)
    with atomic_dir(out / "checkpoint-1") as tmp:
        (tmp / "trainer.pt").write_bytes(b"state")
    return out


@pytest.mark.parametrize("text,what", [('{"max_steps": 3', "not JSON"), ("[1, 2, 3]", "not a mapping"),
                                       ("\x00\xff", "not JSON")])
def test_damaged_run_config_at_resume(tmp_path, text, what):
    out = run_with_checkpoint(tmp_path / "run", text)
    refuse([*SELFPLAY, "--output_dir", str(out), "--resume", "true"], str(out / "config.json"), what, folder=out)


def test_resume_into_a_folder_no_run_made(tmp_path):
    model = model_copy(tmp_path)
    line = refuse([*SELFPLAY, "--output_dir", str(model), "--resume", "true"], str(model), "no run made", folder=model)
    assert not (model / ".lmselfplay.lock").exists()
    overwrite = refuse([*SELFPLAY, "--output_dir", str(model), "--overwrite_output_dir", "true"], folder=model)
    assert line.split(";")[0] == overwrite.split(";")[0]  # refused in the same words


@pytest.mark.parametrize("final", [True, False])
def test_resume_a_run_without_checkpoints(tmp_path, final):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lmselfplay.lock").write_text("1\n")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "config.json").write_text(json.dumps({"max_steps": 3}))
    if final:
        shutil.copytree(EMBEDDED, out / "final_model")
    line = refuse([*SELFPLAY, "--output_dir", str(out), "--resume", "true", "--checkpoint_every", "0"],
                  str(out), "no checkpoint", folder=out)
    assert ("a finished run" in line) == final


# --- the embedded model's cache ----------------------------------------------------------------

def test_damaged_cache_of_the_embedded_model_is_replaced(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tiny, "_VERIFIED", set())
    path = tiny.ensure_tiny_model(cache_dir=tmp_path)
    good = snapshot(path)
    truncate(path / "model.safetensors")
    tiny._VERIFIED.clear()
    assert tiny.ensure_tiny_model(cache_dir=tmp_path) == path
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "damaged" in err[0] and "model.safetensors" in err[0]
    assert snapshot(path) == good
    (path / "config.json").write_text("{")
    tiny._VERIFIED.clear()
    tiny.ensure_tiny_model(cache_dir=tmp_path)
    assert snapshot(path) == good
