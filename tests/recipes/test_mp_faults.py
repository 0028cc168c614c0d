"""Multi-process faults under ``accelerate launch`` (2 CPU ranks, gloo): a rank that dies
(SIGKILL) or hangs (SIGSTOP) never leaves the run hanging: the launcher exits with an error
within a bound (a hung peer: the process-group timeout, ``collective_timeout_s``), and
``--resume`` afterwards continues to the same final weights as an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _cmd(model_dir, out, steps, *extra):
    args = {"model_name_or_path": model_dir, "output_dir": out, "max_steps": steps, "games": "nim,kuhn_poker",
            "episodes_per_step": 8, "eval_every": 0, "eval_games": 4, "eval_positions": 10,
            "checkpoint_every": 1, "league_add_every": 1, "max_new_tokens": 6, "learning_rate": 1e-3}
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(ROOT / "recipes" / "accelerate" / "ddp_cpu.yaml"), str(ROOT / "recipes" / "selfplay_games.py"),
            *[a for k, v in args.items() for a in (f"--{k}", str(v))], *extra]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _run(cmd):
    r = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of the worker with ``RANK=rank`` among the launcher's descendants."""
    todo, seen = [launcher], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    for pid in seen[1:]:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"LOCAL_RANK=" in b" ".join(env):
            return pid
    return None


def _weights(path):
    from safetensors.torch import load_file

    return load_file(path / "final_model" / "model.safetensors")


@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_a_dead_or_hung_rank_ends_the_run_and_resume_is_exact(model_dir, tmp_path, fault):
    full, cut = tmp_path / "full", tmp_path / "cut"
    _run(_cmd(model_dir, full, 6))
    p = subprocess.Popen(_cmd(model_dir, cut, 6, "--collective_timeout_s", "20"), cwd=ROOT, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    victim = None
    try:
        deadline = time.time() + 300
        while not (cut / "checkpoint-2" / "COMPLETE").exists():
            assert p.poll() is None and time.time() < deadline, "the run ended before checkpoint-2"
            time.sleep(0.2)
        victim = _rank_pid(p.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        t0 = time.time()
        out, _ = p.communicate(timeout=240)
        waited = time.time() - t0
    finally:
        if victim is not None and fault == "hang":
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode != 0, out[-3000:]
    assert waited < 240
    if fault == "hang":  # rank 0 stopped waiting for the hung rank: the collective timed out
        assert "error: a collective operation failed because another process of this run died or hangs" in out
        assert "Timed out" in out, out[-3000:]
    assert not (cut / "final_model").exists()
    _run(_cmd(model_dir, cut, 6, "--resume", "true"))
    a, b = _weights(full), _weights(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
