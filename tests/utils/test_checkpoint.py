"""Checkpoints verify themselves; a failed write leaves the previous one resumable.

Unit level: the marker's digests catch a flipped byte, a truncated file and a missing file,
name the file, and ``latest_checkpoint`` falls back (or stops when told to / when nothing is
intact). Recipe level: a real tiny self-play run whose newest checkpoint is damaged resumes
from the one before and still ends bit-identical to an uninterrupted run; a checkpoint
write that fails with ENOSPC stops the run with a one-line error, leaves no temp dir, and
``--resume`` afterwards again ends bit-identical.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmselfplay.utils.checkpoint import (
    MARKER,
    CheckpointDamaged,
    CheckpointWriteError,
    atomic_dir,
    checkpoint_dirs,
    latest_checkpoint,
    verify_checkpoint,
)
from lmselfplay.utils.errors import UserError
from lmselfplay.utils.recipe_loader import run_recipe

ROOT = Path(__file__).resolve().parents[2]


def damage(path: Path, how: str) -> None:
    if how == "corrupt":  # one flipped byte in the middle, same size
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    elif how == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.unlink()


def _two_checkpoints(root: Path) -> list[Path]:
    for step in (1, 2):
        with atomic_dir(root / f"checkpoint-{step}") as tmp:
            (tmp / "sub").mkdir()
            (tmp / "sub" / "weights.bin").write_bytes(bytes(range(256)) * (40 + step))
            (tmp / "state.json").write_text(f'{{"step": {step}}}')
    return checkpoint_dirs(root)


@pytest.mark.parametrize("how", ["corrupt", "truncate", "delete"])
def test_damage_is_named_and_skipped(tmp_path, how):
    first, newest = _two_checkpoints(tmp_path)
    assert verify_checkpoint(newest) is None and '"files"' in (newest / MARKER).read_text()
    damage(newest / "sub" / "weights.bin", how)
    problem = verify_checkpoint(newest)
    assert problem is not None and "sub/weights.bin" in problem
    assert {"corrupt": "checksum", "truncate": "truncated", "delete": "missing"}[how] in problem
    warnings = []
    assert latest_checkpoint(tmp_path, warn=warnings.append) == first
    assert "checkpoint-2" in warnings[0] and "weights.bin" in warnings[0]
    with pytest.raises(CheckpointDamaged, match="resume_fallback is false"):
        latest_checkpoint(tmp_path, fallback=False)


def test_nothing_intact_is_a_clear_error(tmp_path):
    first, newest = _two_checkpoints(tmp_path)
    (first / "state.json").unlink()
    (newest / "state.json").write_text("{}")
    with pytest.raises(CheckpointDamaged, match="no intact checkpoint"):
        latest_checkpoint(tmp_path, warn=lambda m: None)
    assert latest_checkpoint(tmp_path / "nothing-here") is None


DIGEST = "0" * 64
BAD_MARKERS = {
    "legacy ok": "ok\n",
    "not json": "{",
    "a list": "[1]",
    "null": "null",
    "files a list": '{"files": []}',
    "entry a number": '{"files": {"state.json": 5}}',
    "three values": f'{{"files": {{"state.json": [5, "{DIGEST}", 1]}}}}',
    "size a float": f'{{"files": {{"state.json": [5.0, "{DIGEST}"]}}}}',
    "digest a number": '{"files": {"state.json": [5, 7]}}',
    "outside": f'{{"files": {{"../../etc/passwd": [5, "{DIGEST}"]}}}}',
    "absolute": f'{{"files": {{"/etc/passwd": [5, "{DIGEST}"]}}}}',
    "nested": "[" * 100_000 + "]" * 100_000,
}


@pytest.mark.parametrize("kind", BAD_MARKERS)
def test_a_marker_is_never_trusted_blindly(tmp_path, kind):
    """No digests (the legacy ``ok``) or a malformed marker: damaged, skipped like a corrupt
    file (never read as complete, never a TypeError), the error when nothing else is intact."""
    first, newest = _two_checkpoints(tmp_path)
    (newest / MARKER).write_text(BAD_MARKERS[kind])
    problem = verify_checkpoint(newest)
    assert problem is not None and str(newest / MARKER) in problem
    assert ("without digests" if kind == "legacy ok" else "damaged marker") in problem
    warnings = []
    assert latest_checkpoint(tmp_path, warn=warnings.append) == first
    assert "checkpoint-2 is damaged" in warnings[0]
    shutil.rmtree(first)
    with pytest.raises(CheckpointDamaged, match="no intact checkpoint"):
        latest_checkpoint(tmp_path, warn=lambda m: None)


def _safetensors_full():
    from safetensors import SafetensorError

    return SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


WRITE_FAILURES = {  # what each writer raises on a full disk (measured on a full tmpfs)
    "OSError": lambda: OSError(errno.ENOSPC, "No space left on device"),
    "SafetensorError": _safetensors_full,
    "torch.save": lambda: RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),
}


@pytest.mark.parametrize("kind", WRITE_FAILURES)
def test_every_write_failure_is_one_line_and_leaves_no_temp_dir(tmp_path, kind):
    first, newest = _two_checkpoints(tmp_path)
    before = (newest / MARKER).read_text()
    with pytest.raises(CheckpointWriteError) as e, atomic_dir(newest) as tmp:
        (tmp / "half").write_bytes(b"x" * 10)
        raise WRITE_FAILURES[kind]()
    assert str(newest) in str(e.value) and "\n" not in str(e.value)
    assert "No space left" in str(e.value) or "inline_container" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "checkpoint-2"]
    assert (newest / MARKER).read_text() == before and verify_checkpoint(newest) is None


def test_a_bug_while_writing_keeps_its_traceback_and_leaves_no_temp_dir(tmp_path):
    with pytest.raises(KeyError), atomic_dir(tmp_path / "checkpoint-1") as tmp:
        (tmp / "half").write_bytes(b"x")
        raise KeyError("a bug, not the disk")
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_the_previous_checkpoint(tmp_path):
    first, newest = _two_checkpoints(tmp_path)
    before = (newest / MARKER).read_text()
    with pytest.raises(CheckpointWriteError, match="No space left") as e, atomic_dir(newest) as tmp:
        (tmp / "half").write_bytes(b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "half"))
    assert isinstance(e.value, UserError) and str(newest) in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "checkpoint-2"]  # temp dir gone
    assert (newest / MARKER).read_text() == before and verify_checkpoint(newest) is None


# --- a real tiny self-play run ------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory):
    """An uninterrupted 3-step run and a run stopped after 2 steps (checkpoints 1 and 2)."""
    root = tmp_path_factory.mktemp("runs")
    run_recipe("selfplay_games", _args(model_dir, root / "full", 3))
    run_recipe("selfplay_games", _args(model_dir, root / "cut", 2))
    return root


def _args(model_dir, out, steps):
    base = {"model_name_or_path": model_dir, "output_dir": out, "max_steps": steps, "games": "nim,kuhn_poker",
            "episodes_per_step": 8, "eval_every": 0, "eval_games": 4, "eval_positions": 10,
            "checkpoint_every": 1, "league_add_every": 1, "max_new_tokens": 6, "learning_rate": 1e-3}
    return [a for k, v in base.items() for a in (f"--{k}", str(v))]


def _same_final(a: Path, b: Path) -> None:
    from safetensors.torch import load_file

    wa, wb = load_file(a / "final_model" / "model.safetensors"), load_file(b / "final_model" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("how", ["corrupt", "truncate", "delete"])
def test_resume_falls_back_past_a_damaged_checkpoint(runs, model_dir, tmp_path, how, capsys):
    cut = tmp_path / "cut"
    shutil.copytree(runs / "cut", cut)
    assert [p.name for p in checkpoint_dirs(cut)] == ["checkpoint-1", "checkpoint-2"]
    damage(cut / "checkpoint-2" / "model" / "model.safetensors", how)
    with pytest.raises(CheckpointDamaged, match="model.safetensors"):
        run_recipe("selfplay_games", _args(model_dir, cut, 3) + ["--resume", "true", "--resume_fallback", "false"])
    run_recipe("selfplay_games", _args(model_dir, cut, 3) + ["--resume", "true"])
    err = capsys.readouterr().err
    assert "checkpoint-2 is damaged" in err and "model.safetensors" in err
    _same_final(runs / "full", cut)  # resumed from checkpoint-1, replayed steps 2-3 exactly


def test_disk_full_mid_save_stops_cleanly_and_resumes(runs, model_dir, tmp_path, monkeypatch):
    """The tokenizer save (after the weights, before the marker) of checkpoint-2 fails."""
    from transformers import PreTrainedTokenizerBase

    real = PreTrainedTokenizerBase.save_pretrained
    calls = []

    def full_disk(self, path, *a, **kw):
        calls.append(path)
        if "checkpoint-2" in str(path):
            (Path(path) / "tokenizer.json").write_text("{")  # a half-written file
            raise OSError(errno.ENOSPC, "No space left on device", str(Path(path) / "tokenizer.json"))
        return real(self, path, *a, **kw)

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full_disk)
    out = tmp_path / "run"
    with pytest.raises(CheckpointWriteError, match="No space left on device") as e:
        run_recipe("selfplay_games", _args(model_dir, out, 3))
    assert "checkpoint-2" in str(e.value) and "\n" not in str(e.value)
    assert not [p for p in out.iterdir() if ".tmp" in p.name]  # temp dir cleaned
    assert [p.name for p in checkpoint_dirs(out)] == ["checkpoint-1"]
    assert verify_checkpoint(out / "checkpoint-1") is None
    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", real)
    run_recipe("selfplay_games", _args(model_dir, out, 3) + ["--resume", "true"])
    _same_final(runs / "full", out)


def test_full_disk_in_the_weights_write_stops_cleanly(model_dir, tmp_path, monkeypatch):
    """safetensors raises SafetensorError (not an OSError) when the disk fills while the
    trainer writes checkpoint-2's weights: one line, no ``.checkpoint-2.tmp``, checkpoint-1
    intact."""
    import transformers.modeling_utils as mu

    real = mu.safe_save_file

    def full_disk(tensors, filename, *a, **kw):
        if "checkpoint-2" in str(filename):
            Path(filename).write_bytes(b"half")
            raise _safetensors_full()
        return real(tensors, filename, *a, **kw)

    monkeypatch.setattr(mu, "safe_save_file", full_disk)
    out = tmp_path / "run"
    with pytest.raises(CheckpointWriteError, match="No space left on device") as e:
        run_recipe("selfplay_games", _args(model_dir, out, 2))
    assert "checkpoint-2" in str(e.value) and "\n" not in str(e.value)
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
    assert [p.name for p in checkpoint_dirs(out)] == ["checkpoint-1"] and verify_checkpoint(out / "checkpoint-1") is None


def test_disk_full_is_one_line_exit_2_from_the_command_line(tmp_path):
    """What the user sees: the run's stderr ends with one ``error:`` line, exit status 2."""
    first, newest = _two_checkpoints(tmp_path / "ck")
    code = ("import errno, sys\n"
            "from lmselfplay.utils.checkpoint import atomic_dir\n"
            "from lmselfplay.utils.errors import run_main\n"
            "def main(argv):\n"
            f"    with atomic_dir({str(newest)!r}) as tmp:\n"
            "        raise OSError(errno.ENOSPC, 'No space left on device', str(tmp / 'x'))\n"
            "sys.exit(run_main(main, []))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error: could not write checkpoint")
    assert verify_checkpoint(newest) is None


@pytest.mark.slow
def test_r_zero_phase_checkpoints_verify_and_resume_falls_back(model_dir, tmp_path, capsys):
    """R-Zero's phase checkpoints carry digests like every checkpoint: a corrupted newest
    phase is skipped with a warning and the run resumes from the phase before it, ending
    with the uninterrupted run's weights."""
    from lm_fixtures import saved_weights

    args = {"model_name_or_path": model_dir, "rounds": 1, "challenger_steps": 1, "num_questions": 8,
            "challenger_group_size": 4, "pool_size": 8, "num_answers": 4, "filter_low": 1, "filter_high": 3,
            "solver_steps": 1, "solver_batch": 4, "solver_group_size": 2, "heldout_size": 4,
            "learning_rate": 1e-3, "challenger_max_new_tokens": 12, "solver_max_new_tokens": 8}
    argv = [a for k, v in args.items() for a in (f"--{k}", str(v))]
    full, cut = tmp_path / "full", tmp_path / "cut"
    run_recipe("r_zero", argv + ["--output_dir", str(full)])
    assert verify_checkpoint(full / "phase-0001-2") is None and '"files"' in (full / "phase-0001-2" / MARKER).read_text()
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "final_model")
    damage(next((cut / "phase-0001-2").rglob("model.safetensors")), "corrupt")
    with pytest.raises(CheckpointDamaged, match="model.safetensors"):
        run_recipe("r_zero", argv + ["--output_dir", str(cut), "--resume", "true", "--resume_fallback", "false"])
    run_recipe("r_zero", argv + ["--output_dir", str(cut), "--resume", "true"])
    assert "phase-0001-2 is damaged" in capsys.readouterr().err
    a, b = saved_weights(full / "final_model"), saved_weights(cut / "final_model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_full_disk_under_torch_save_is_named(tmp_path):
    """torch's stream writer hides the errno ("unexpected pos ..."): on a really full file system
    (a 512 KB tmpfs, in a private mount namespace) the error names the cause, the previous
    checkpoint stays, and no temp dir is left."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("mounting a tmpfs needs root and unshare")
    code = ("import torch\n"
            "from lmselfplay.utils.checkpoint import CheckpointWriteError, atomic_dir\n"
            "with atomic_dir('/mnt/full/checkpoint-1') as tmp:\n"
            "    torch.save(torch.zeros(10), tmp / 'state.pt')\n"
            "try:\n"
            "    with atomic_dir('/mnt/full/checkpoint-1') as tmp:\n"
            "        torch.save(torch.zeros(1 << 20), tmp / 'state.pt')\n"
            "except CheckpointWriteError as e:\n"
            "    print(e)\n"
            "import os\nprint(sorted(os.listdir('/mnt/full')))\n")
    script = f"mkdir -p /mnt/full && mount -t tmpfs -o size=512k tmpfs /mnt/full && exec {sys.executable} -c \"$0\""
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, code],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if p.returncode != 0 and "mount" in p.stderr:
        pytest.skip(f"no tmpfs here: {p.stderr.strip()[-200:]}")
    lines = p.stdout.splitlines()
    assert "No space left on device" in lines[0] and "checkpoint-1" in lines[0], p.stdout + p.stderr
    assert "previous checkpoint is intact" in lines[0]
    assert lines[1] == "['checkpoint-1']"


def test_an_errno_less_write_failure_with_space_left_keeps_the_writers_words(tmp_path):
    with pytest.raises(CheckpointWriteError) as e:
        with atomic_dir(tmp_path / "checkpoint-1"):
            raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
    assert "file write failed" in str(e.value) and "No space left" not in str(e.value)


def test_run_outputs_get_the_users_file_mode(tmp_path):
    """Files and folders the run writes follow the umask like any other program's, although
    they are written through (private) temp files: 0644 / 0755 under umask 022, 0664 / 0775
    under 002."""
    from lmselfplay.utils import curves
    from lmselfplay.utils.checkpoint import save_json

    for mask, file_mode, dir_mode in ((0o022, 0o644, 0o755), (0o002, 0o664, 0o775)):
        old = os.umask(mask)
        try:
            out = tmp_path / f"run{mask:o}"
            save_json(out / "config.json", {"a": 1})
            with atomic_dir(out / "final_model") as tmp:
                (tmp / "w").write_text("x")
            plt = curves._pyplot()
            curves.save(plt.figure(), out / "curves.png")
        finally:
            os.umask(old)
        assert (out / "config.json").stat().st_mode & 0o777 == file_mode
        assert (out / "curves.png").stat().st_mode & 0o777 == file_mode
        assert (out / "final_model").stat().st_mode & 0o777 == dir_mode
