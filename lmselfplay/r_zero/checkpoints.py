"""What R-Zero keeps on disk (``recipes/r_zero.py``, steps 2-4): each iteration's pool as a
`datasets` folder (:func:`save_pool`, :func:`load_kept`), an atomic checkpoint after every phase
(:func:`save_phase`; :func:`resume` continues at the phase a killed run was in) and the final
model(s) (:func:`save_final`)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from lmselfplay.r_zero.steps import PHASES, RZero
from lmselfplay.utils.checkpoint import (
    MARKER,
    atomic_dir,
    checkpoint_dirs,
    commit_dir,
    save_json,
    writing,
)


def pool_dir(out: Path, it: int, rank: int) -> Path:
    """``data/iteration-K`` (every rank writes and answers its own questions: rank r > 0
    keeps its pool in ``data/iteration-K-rank-r``)."""
    return out / "data" / (f"iteration-{it}" if rank == 0 else f"iteration-{it}-rank-{rank}")


def save_pool(path: Path, records: list[dict[str, Any]]) -> Path:
    """The iteration's questions, answers, labels and agreement as a `datasets` folder (atomic)."""
    import datasets

    with atomic_dir(path) as tmp:
        datasets.Dataset.from_list(records).save_to_disk(str(tmp / "pool"))
    return path


def load_kept(path: Path) -> list[dict[str, Any]]:
    import datasets

    return [r for r in datasets.load_from_disk(str(path / "pool")) if r["kept"]]


def save_phase(rz: RZero, it: int, phase: int) -> None:
    """An atomic checkpoint after phase ``phase`` of iteration ``it``: every role's trainer
    state + the progress; the dir name orders them (phase-IIII-P)."""
    acc, out = rz.acc, rz.out
    final, tmp = out / f"phase-{it:04d}-{phase}", out / f".phase-{it:04d}-{phase}.tmp"
    with writing(final, tmp, remove_tmp=acc.is_main_process):
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        for name, role in rz.roles():
            role.trainer.save_checkpoint(tmp / name, keep=1)
        if acc.is_main_process:
            save_json(tmp / "progress.json", {"iteration": it, "phase": phase, "global_step": rz.global_step,
                                              "bad": dict(rz.bad)})
            commit_dir(tmp, final)  # the marker holds every file's digest
            for old in phase_dirs(out)[:-2]:
                shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()


def phase_dirs(out: Path) -> list[Path]:
    """Complete phase checkpoints (marker present, not verified), oldest first."""
    return sorted(p for p in out.glob("phase-*") if (p / MARKER).exists())


def resume(rz: RZero) -> tuple[int, int]:
    """(iteration, next phase) from the run's phase checkpoint; (1, 0) when it starts fresh."""
    last = rz.run.checkpoint
    if last is None:
        rz.run.report_start(1, "iteration")
        return 1, 0
    progress = json.loads((last / "progress.json").read_text())
    for name, role in rz.roles():  # each engine keeps its version: the first serving pushes the restored weights
        role.trainer.load_checkpoint(checkpoint_dirs(last / name)[-1])
    rz.global_step, rz.bad = progress["global_step"], Counter(progress["bad"])
    it, phase = progress["iteration"], progress["phase"] + 1
    rz.run.report_start(f"{it}, phase {PHASES[phase] if phase < 3 else 'next'}", "iteration")
    return (it + 1, 0) if phase == len(PHASES) else (it, phase)


def save_final(rz: RZero) -> None:
    """The trained model(s) as plain HF folders: final_model (the solver / the one policy)
    and, with two copies, final_challenger."""
    for name, role in rz.roles():
        rz.run.save_final_model(role.trainer.model, role.trainer.unwrapped, rz.tok,
                                      "final_challenger" if name == "challenger" else "final_model")
