"""Atomic, self-verifying, resumable checkpoints.

Rules:

* A checkpoint is written into a temporary sibling dir, then renamed: a run killed at any
  moment leaves either the previous complete checkpoint or the new complete one.
* Its completion marker ``COMPLETE`` (written last, by :func:`commit_dir`, the one writer
  every checkpoint goes through) records the sha256 and size of every file in it. A marker
  is never trusted blindly: one without digests (the legacy ``ok``), or malformed in any way
  (not JSON, wrong types, a path outside the checkpoint), makes the checkpoint damaged, like
  a corrupt file does.
* ``newest_intact`` (what every recipe's ``--resume`` uses, through ``lmselfplay.utils.run.Run``) verifies the newest
  complete ``checkpoint-<step>``; when a file is missing, truncated or changed it says which
  and falls back to the newest intact one, or stops with a :class:`UserError` when none
  is intact or when ``fallback`` is off (the recipes' ``resume_fallback: false``).
* What the run writes gets the user's normal file mode (``0666`` / ``0777`` less the umask,
  :func:`umask_mode`), though it is written through private temp files and folders.
* A write that fails (disk full, permission; an ``OSError``, safetensors' ``SafetensorError``
  or torch's stream-writer ``RuntimeError``: :func:`is_write_failure`) raises
  :class:`CheckpointWriteError` (a one-line UserError naming the path and the error),
  removes its temp dir and leaves the previous checkpoint as it was. Every checkpoint
  writer goes through :func:`writing`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lmselfplay.utils.errors import UserError

MARKER = "COMPLETE"


class CheckpointWriteError(UserError, OSError):
    """Writing a checkpoint failed; the previous one is intact."""

    @classmethod
    def of(cls, final: Path, e: BaseException) -> CheckpointWriteError:
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        return cls(f"could not write checkpoint {final}: {write_failure_cause(e, final.parent)}{where}; "
                   f"the previous checkpoint is intact (free space or fix permissions, then --resume)")


FULL_BELOW_BYTES = 1 << 20  # a file system with less free than this counts as full


def write_failure_cause(e: BaseException, folder: Path) -> str:
    """What made a write fail, in the OS's words: an OSError's own ``strerror``; for a writer
    that hides the errno (torch's stream writer: "unexpected pos ..."; safetensors), "No space
    left on device" when the file system of ``folder`` is (nearly) full, else its message."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = " ".join(str(e).split())
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return text
    if free < FULL_BELOW_BYTES:
        return f"{os.strerror(errno.ENOSPC)} ({free} bytes free; the writer said: {text[:160]})"
    return text


# torch.save on a full disk: "PytorchStreamWriter failed writing file ..." or
# "[enforce fail at inline_container.cc:...] . unexpected pos ..." (measured on a full tmpfs)
TORCH_WRITE_FAILURES = ("PytorchStreamWriter failed", "inline_container.cc", "file write failed")


def is_write_failure(e: BaseException) -> bool:
    """Whether ``e``, raised while writing files, is the storage failing (not a bug)."""
    if isinstance(e, OSError) or type(e).__name__ == "SafetensorError":
        return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in TORCH_WRITE_FAILURES)


@contextlib.contextmanager
def writing(final: str | Path, tmp: str | Path | None, remove_tmp: bool = True) -> Iterator[None]:
    """``with writing(final, tmp): write into tmp, commit_dir(tmp, final)``: any failure
    removes ``tmp`` (where ``remove_tmp``: the process that made it) and a write failure
    becomes a :class:`CheckpointWriteError`; ``final`` is untouched until the commit."""
    try:
        yield
    except BaseException as e:
        failure = None if isinstance(e, CheckpointWriteError) or not is_write_failure(e) else \
            CheckpointWriteError.of(Path(final), e)  # before the temp dir goes: a full disk is seen full
        if tmp is not None and remove_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        if failure is None:
            raise
        raise failure from e


class CheckpointDamaged(UserError):
    """No intact checkpoint to resume from (or fallback is off and the newest is damaged)."""


# --- the marker -------------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_digests(directory: str | Path) -> dict[str, list]:
    """{relative path: [size, sha256]} of every file under ``directory`` but the marker."""
    d = Path(directory)
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file() and p.relative_to(d).as_posix() != MARKER:
            out[p.relative_to(d).as_posix()] = [p.stat().st_size, sha256_file(p)]
    return out


def write_marker(directory: str | Path) -> None:
    """Write ``COMPLETE`` with the digests of every file (fsynced: it must be the last word)."""
    text = json.dumps({"format": 1, "files": file_digests(directory)}, indent=0, sort_keys=True)
    with open(Path(directory) / MARKER, "w") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_marker(directory: str | Path) -> dict[str, tuple[int, str]] | str:
    """The digests ``COMPLETE`` records ({relative path: (size, sha256)}), or what is wrong
    with it: unreadable, without digests (the legacy ``ok``), or malformed."""
    path = Path(directory) / MARKER
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        return f"{path}: unreadable marker ({getattr(e, 'strerror', None) or e})"
    if text.strip() == "ok":
        return f"{path}: marker without digests (written by an older version), cannot be verified"
    try:
        files = json.loads(text)["files"]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return f"{path}: damaged marker (not the JSON that commit_dir writes)"
    if not isinstance(files, dict):
        return f"{path}: damaged marker (files is not a mapping)"
    out = {}
    for rel, entry in files.items():
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            return f"{path}: damaged marker (path {rel[:80]!r} outside the checkpoint)"
        if (not isinstance(entry, list) or len(entry) != 2 or type(entry[0]) is not int
                or not isinstance(entry[1], str) or not re.fullmatch(r"[0-9a-f]{64}", entry[1])):
            return f"{path}: damaged marker (entry for {rel[:80]!r} is not [size, sha256])"
        out[rel] = (entry[0], entry[1])
    return out


def verify_checkpoint(directory: str | Path) -> str | None:
    """None when ``directory`` is intact, else what is wrong, naming the file."""
    d = Path(directory)
    files = read_marker(d)
    if isinstance(files, str):
        return files
    for rel, (size, digest) in files.items():
        p = d / rel
        if not p.is_file():
            return f"{p}: missing"
        if p.stat().st_size != size:
            return f"{p}: {p.stat().st_size} bytes, expected {size} (truncated or changed)"
        if sha256_file(p) != digest:
            return f"{p}: checksum mismatch (corrupted)"
    return None


# --- writing ----------------------------------------------------------------------------

def commit_dir(tmp: str | Path, final: str | Path) -> None:
    """Mark ``tmp`` complete (digests of its files) and rename it to ``final``; an existing
    ``final`` is moved aside first and removed only once the new one is in place."""
    tmp, final = Path(tmp), Path(final)
    write_marker(tmp)
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """``with atomic_dir(out) as tmp: write files into tmp`` -> committed to ``out`` at exit
    (through :func:`writing`: a failure leaves no temp dir and ``out`` as it was)."""
    final = Path(final)
    with writing(final, None):
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        with writing(final, tmp):
            os.chmod(tmp, umask_mode(0o777))
            yield tmp
            commit_dir(tmp, final)


def save_model(path: str | Path, model: Any, tokenizer: Any, state_dict: dict | None = None) -> Path:
    """``model.save_pretrained`` + ``tokenizer.save_pretrained`` as one atomic, verified
    folder (a recipe's ``final_model``): a full disk is one line and leaves nothing half-written."""
    with atomic_dir(path) as tmp:
        model.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
    return Path(path)


def umask_mode(mode: int) -> int:
    """``mode`` less the process's umask: the mode ``open`` / ``mkdir`` would give a new file or
    folder (``tempfile``'s are private: 0600 / 0700). Read from ``/proc`` where it can be (no
    window in which another thread creates files under umask 0)."""
    try:
        with open("/proc/self/status") as f:
            mask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
    return mode & ~mask


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode(0o666))
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --- finding ----------------------------------------------------------------------------

def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """Complete ``checkpoint-<step>`` dirs (marker present), oldest first (not verified)."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = []
    for p in out.iterdir():
        m = re.fullmatch(r"checkpoint-(\d+)", p.name)
        if m and (p / MARKER).exists():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def _warn(msg: str) -> None:
    print(msg, file=sys.stderr)


def latest_checkpoint(output_dir: str | Path, fallback: bool = True,
                      warn: Callable[[str], None] = _warn) -> Path | None:
    """The newest intact ``checkpoint-<step>`` in ``output_dir`` (see :func:`newest_intact`)."""
    return newest_intact(checkpoint_dirs(output_dir), output_dir, fallback, warn)


def newest_intact(dirs: list[Path], output_dir: str | Path, fallback: bool = True,
                  warn: Callable[[str], None] = _warn) -> Path | None:
    """The newest intact one of ``dirs`` (oldest first; None when there is none at all). A
    damaged newer one is reported through ``warn`` and skipped; with ``fallback=False`` it
    is an error, and so is finding none intact."""
    damaged = []
    for p in reversed(dirs):
        problem = verify_checkpoint(p)
        if problem is None:
            if damaged:
                warn(f"warning: resuming from {p}, the newest intact checkpoint")
            return p
        if not fallback:
            raise CheckpointDamaged(f"checkpoint {p} is damaged: {problem} "
                                    f"(resume_fallback is false; set it true to resume from an older one)")
        warn(f"warning: checkpoint {p} is damaged: {problem}; skipping it")
        damaged.append(p)
    if damaged:
        raise CheckpointDamaged(f"no intact checkpoint in {output_dir}: all {len(damaged)} are damaged "
                                f"(start without --resume or in a new output_dir)")
    return None


def prune_checkpoints(output_dir: str | Path, keep: int) -> None:
    for p in checkpoint_dirs(output_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)


def save_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, default=str))
