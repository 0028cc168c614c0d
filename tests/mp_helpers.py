"""Run ``tests/mp_scripts/trainer_steps.py`` in-process, as a plain subprocess, or through
``accelerate launch`` with a shipped config, and read back what every rank wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "mp_scripts" / "trainer_steps.py"
CONFIGS = ROOT / "recipes" / "accelerate"


def _env() -> dict[str, str]:
    # one thread per rank (2 ranks share the cores); offline like the rest of the suite
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def launch(config: str, *args: str, launcher_args: tuple[str, ...] = (),
           timeout: float = 600) -> subprocess.CompletedProcess:
    """``accelerate launch --config_file recipes/accelerate/<config> [launcher_args]
    trainer_steps.py args``; the configs use ``main_process_port: 0`` (a free port) so
    runs cannot clash."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config),
           *launcher_args, str(SCRIPT), *args]
    r = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-6000:]}"
    return r


def run_python(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """One process, no launcher (what ``python recipes/X.py`` does)."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def start_python(*args: str) -> subprocess.Popen:
    """:func:`run_python` started, not waited for (``communicate()`` it)."""
    return subprocess.Popen([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_inprocess(*args: str) -> None:
    """The same script in this process, single-threaded like the launched ranks (so
    results can be compared bit for bit)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import trainer_steps
    finally:
        sys.path.remove(str(SCRIPT.parent))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer_steps.main(list(args))
    finally:
        torch.set_num_threads(threads)


def read_ranks(out: Path, world: int) -> list[dict]:
    """[{**rank<r>.json, "params": ..., "baselines": ...}] for r in range(world)."""
    res = []
    for r in range(world):
        info = json.loads((out / f"rank{r}.json").read_text())
        info.update(torch.load(out / f"rank{r}.pt"))
        res.append(info)
    return res


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
