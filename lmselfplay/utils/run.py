"""What every recipe run shares: its run-level flags and one run per output folder.

* :class:`RunConfig` — a mixin for a recipe's config dataclass: ``resume_fallback`` (read by
  :func:`lmselfplay.utils.checkpoint.resume_checkpoint`), ``collective_timeout_s`` (how
  long a rank waits in a collective for a dead peer before it fails) and
  ``overwrite_output_dir``.
* :func:`claim_output_dir` — the one call at the start of every recipe's ``main``. Its rules:
  an ``output_dir`` that is a file, or that cannot be created or written, is a one-line
  :class:`UserError`; a live run's folder is refused (the lock below); a fresh run (no
  ``--resume``) into a folder that holds anything is refused with a :class:`RunFolderTaken`
  that names what is there, so an earlier run's metrics and checkpoints are never mixed with
  or replaced by a new run's; ``--overwrite_output_dir true`` empties the folder first, and
  only a folder an earlier run made (it holds the lock file or ``metrics.jsonl``): any other
  folder is never emptied. The checks and the emptying happen on the main process only.
* :func:`lock_output_dir` — takes an exclusive
  ``flock`` on ``<output_dir>/.lmselfplay.lock`` (holding the pid) for the life of the
  process, on the main process only (global rank 0 under ``accelerate launch``). A second run
  on the same folder gets a :class:`RunLocked` naming the live run's pid. The kernel drops the
  lock when the process dies however it dies, so a killed run never blocks ``--resume``.
  Re-entrant within one process (a test calling ``main`` twice on one folder).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.errors import UserError

LOCK_FILE = ".lmselfplay.lock"
RUN_MARKS = (LOCK_FILE, "metrics.jsonl")  # a folder holding one of these was made by a run
_held: dict[Path, int] = {}  # resolved output_dir -> open lock fd (kept for the process's life)


@dataclass
class RunConfig:
    resume_fallback: bool = field(default=True, metadata={
        "help": "--resume: when the newest checkpoint is damaged, continue from the newest intact one "
                "(false: stop with an error)"})
    collective_timeout_s: int = field(default=900, metadata={
        "help": "multi-process runs: seconds a rank waits in a collective for the others before it fails"})
    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "a fresh run into a folder that holds an earlier run: delete that run's files first "
                "(false: stop with an error; --resume continues the earlier run instead)"})


class RunLocked(UserError):
    """Another live run holds this output folder."""


class RunFolderTaken(ConfigError):
    """A fresh run into a folder that already holds files (an output_dir only ``--resume`` or
    ``--overwrite_output_dir`` can use)."""


def is_main_rank() -> bool:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) == 0


def claim_output_dir(cfg: Any) -> Path:
    """Check, lock and (with ``overwrite_output_dir``) empty ``cfg.output_dir`` for this run
    (see the module doc); returns it as a Path. ``cfg`` has ``output_dir``, ``resume`` and
    :class:`RunConfig`'s fields."""
    out = Path(cfg.output_dir)
    overwrite = getattr(cfg, "overwrite_output_dir", False)
    if cfg.resume and overwrite:
        raise ConfigError("resume and overwrite_output_dir exclude each other: --resume continues the run "
                          f"in {out}, --overwrite_output_dir deletes it")
    if not is_main_rank():
        return out
    names = _entries(out)
    made_by_a_run = any(m in names for m in RUN_MARKS)
    if LOCK_FILE in names:
        lock_output_dir(out)  # a live run's folder: refused before anything else is said
    left = sorted(n for n in names if n != LOCK_FILE)
    if left and not cfg.resume:
        shown = ", ".join(left[:4]) + (f" and {len(left) - 4} more" if len(left) > 4 else "")
        if not overwrite:
            raise RunFolderTaken(f"{out} already holds files ({shown}): --resume true continues that run, "
                                 f"--overwrite_output_dir true deletes it first, or choose another output_dir")
        if not made_by_a_run:
            raise RunFolderTaken(f"{out} holds files that no run made ({shown}); --overwrite_output_dir only "
                                 f"empties a run's folder: choose another output_dir")
        _empty(out, left)
    lock_output_dir(out)
    return out


def _entries(out: Path) -> set[str]:
    """The names in ``out`` (none when it does not exist yet); a file or an unreadable
    folder is a one-line error."""
    if out.exists() and not out.is_dir():
        raise UserError(f"output_dir {out} is a file, not a folder: choose another output_dir")
    try:
        return set(os.listdir(out)) if out.exists() else set()
    except OSError as e:
        raise UserError(f"cannot read output_dir {out}: {e.strerror or e}") from None


def _empty(out: Path, names: list[str]) -> None:
    for name in names:
        p = out / name
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError as e:
            raise UserError(f"--overwrite_output_dir: cannot delete {p}: {e.strerror or e}") from None


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
    key = out.resolve()
    if key in _held:
        return key / LOCK_FILE
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied (the folder is not writable)")
        fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        what = "is a file, not a folder" if isinstance(e, (FileExistsError, NotADirectoryError)) else \
            f"cannot be written: {e.strerror or e}"
        raise UserError(f"output_dir {out} {what}: choose another output_dir or fix its permissions") from None
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
