"""What every recipe run shares: its run-level flags and one run per output folder.

* :class:`RunConfig` — a mixin for a recipe's config dataclass: ``resume_fallback`` (read by
  :func:`lmselfplay.utils.checkpoint.resume_checkpoint`) and ``collective_timeout_s`` (how
  long a rank waits in a collective for a dead peer before it fails).
* :func:`lock_output_dir` — one call at the start of a recipe's ``main``: takes an exclusive
  ``flock`` on ``<output_dir>/.lmselfplay.lock`` (holding the pid) for the life of the
  process, on the main process only (global rank 0 under ``accelerate launch``). A second run
  on the same folder gets a :class:`RunLocked` naming the live run's pid. The kernel drops the
  lock when the process dies however it dies, so a killed run never blocks ``--resume``.
  Re-entrant within one process (a test calling ``main`` twice on one folder).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lmselfplay.utils.errors import UserError

LOCK_FILE = ".lmselfplay.lock"
_held: dict[Path, int] = {}  # resolved output_dir -> open lock fd (kept for the process's life)


@dataclass
class RunConfig:
    resume_fallback: bool = field(default=True, metadata={
        "help": "--resume: when the newest checkpoint is damaged, continue from the newest intact one "
                "(false: stop with an error)"})
    collective_timeout_s: int = field(default=900, metadata={
        "help": "multi-process runs: seconds a rank waits in a collective for the others before it fails"})


class RunLocked(UserError):
    """Another live run holds this output folder."""


def is_main_rank() -> bool:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) == 0


def lock_output_dir(output_dir: str | Path) -> Path | None:
    """Hold ``output_dir`` for this run (see the module doc). Returns the lock file's path,
    None on other ranks or where ``fcntl`` is missing (Windows)."""
    try:
        import fcntl
    except ImportError:
        return None
    if not is_main_rank():
        return None
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    key = out.resolve()
    if key in _held:
        return key / LOCK_FILE
    fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunLocked(f"{out} is in use by a live run (pid {pid}); wait for it to finish, stop it "
                        f"(kill {pid}), or choose another output_dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = fd
    return key / LOCK_FILE


def release_output_dir(output_dir: str | Path) -> None:
    """Let go of ``output_dir`` before the process ends (closing the fd drops the flock)."""
    fd = _held.pop(Path(output_dir).resolve(), None)
    if fd is not None:
        os.close(fd)
