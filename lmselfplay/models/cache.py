"""Where the embedded model lives: one cache folder per build key (``$LMSELFPLAY_CACHE`` or
``~/.cache/lmselfplay``), filled once per machine under a lock, from the build shipped in the
package when its key matches, else built (:func:`ensure_tiny_model`); ``lmselfplay bootstrap``
(:func:`bootstrap_main`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from lmselfplay.models.pretrain import build_tiny_model
from lmselfplay.models.tiny import (
    BUILDS,
    DEFAULT_BUILD,
    INFO_FILE,
    TOKENIZERS,
    TinyConfig,
    build_config,
)
from lmselfplay.utils.checkpoint import MARKER, atomic_dir, verify_checkpoint

EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"  # the shipped default build
SHIPPED_BUILDS = ("v8", "v8sums")  # other builds shipped in the package, each in embedded_<build>/


def shipped_dir(build: str) -> Path:
    """Where the package holds a shipped build: ``embedded/`` for the default, else ``embedded_<build>/``."""
    return EMBEDDED_DIR if build == DEFAULT_BUILD else EMBEDDED_DIR.with_name(f"embedded_{build}")


def cache_root() -> Path:
    return Path(os.environ.get("LMSELFPLAY_CACHE") or Path.home() / ".cache" / "lmselfplay")


def model_dir(cfg: TinyConfig, root: str | Path | None = None) -> Path:
    return Path(root if root is not None else cache_root()) / f"tiny-{cfg.key()}"


def is_complete(path: Path) -> bool:
    return (path / INFO_FILE).is_file() and (path / "config.json").is_file()


@contextlib.contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """One builder per cache folder across processes (no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # Windows: atomic_dir still prevents half-written models
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_tiny_model(force: bool = False, cfg: TinyConfig | None = None, progress: bool = True,
                      cache_dir: str | Path | None = None) -> Path:
    """Path of the built tiny model for ``cfg`` (default: the :data:`DEFAULT_BUILD`): cached
    and intact (its files match the checksums recorded when it was written, checked once per
    process), else installed from the package or built now. A damaged cached copy is replaced
    the same way, with one line on stderr saying so."""
    cfg = cfg or build_config()
    path = model_dir(cfg, cache_dir)
    if not force and _intact_cache(path):
        return path
    with build_lock(path):
        if not force and _intact_cache(path, say=True):  # another process built it while we waited
            return path
        for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a killed build
            shutil.rmtree(stale, ignore_errors=True)
        shipped = None if force else shipped_build(cfg)
        if shipped is not None:
            with atomic_dir(path) as tmp:
                for f in shipped.iterdir():
                    if f.is_file() and f.name != MARKER:
                        shutil.copy2(f, tmp / f.name)
            _VERIFIED.add(path)
            return path
        if progress:
            print(f"building the embedded tiny model into {path} (once; a few minutes on CPU)")
        with atomic_dir(path) as tmp:
            build_tiny_model(cfg, tmp, progress=progress, resume_dir=resume_dir(path), base=base_of(cfg, progress))
    _VERIFIED.add(path)
    return path


_VERIFIED: set[Path] = set()  # cache folders this process found intact


def _intact_cache(path: Path, say: bool = False) -> bool:
    """Whether the cached build ``path`` is complete and its files match their recorded
    checksums; with ``say``, a damaged one is reported in one line (it is then replaced)."""
    if path in _VERIFIED:
        return True
    if not is_complete(path):
        return False
    problem = verify_checkpoint(path)
    if problem is None:
        _VERIFIED.add(path)
        return True
    if say:
        print(f"warning: the cached embedded model is damaged ({problem}); replacing it", file=sys.stderr)
    return False


def base_of(cfg: TinyConfig, progress: bool = True) -> Path | None:
    """The folder of the build ``cfg`` continues (built, or installed from the package, first); None
    for a build from scratch."""
    return ensure_tiny_model(cfg=cfg.base_config(), progress=progress) if cfg.continue_from else None


def resume_dir(path: Path) -> Path:
    """Where the build of ``path`` keeps its training state until it is done."""
    return path.parent / f".{path.name}.resume"


def shipped_build(cfg: TinyConfig, folder: Path | None = None) -> Path | None:
    """The build shipped in the package (``folder``, else the default's and :data:`SHIPPED_BUILDS`'
    folders) that was built from ``cfg``'s key, its files matching their recorded checksums; else
    None (then the model is built)."""
    folders = [folder] if folder is not None else [shipped_dir(b) for b in (DEFAULT_BUILD, *SHIPPED_BUILDS)]
    for f in folders:
        try:
            key = json.loads((f / INFO_FILE).read_text())["key"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if key == cfg.key() and (f / MARKER).is_file() and verify_checkpoint(f) is None:
            return f
    return None


def bootstrap_main(argv: list[str] | None = None) -> Path:
    """``lmselfplay bootstrap``: build (or find) the embedded tiny model and print its path."""
    ap = argparse.ArgumentParser(prog="lmselfplay bootstrap", description=bootstrap_main.__doc__)
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--cache-dir", "--cache_dir", dest="cache_dir", default=None,
                    help="cache root (default: $LMSELFPLAY_CACHE or ~/.cache/lmselfplay)")
    ap.add_argument("--out", default=None, help="build into exactly this folder instead")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--build", default=DEFAULT_BUILD, choices=list(BUILDS),
                    help=f"named build whose settings the other options default to ({DEFAULT_BUILD}: the shipped one)")
    int_fields = ("seed", "num_layers", "hidden_size", "num_heads", "intermediate_size",
                  "train_steps", "batch_size", "num_threads", "vocab_size", "max_seq_len",
                  "tokenizer_texts", "warmup_steps", "checkpoint_every")
    for name in int_fields:  # None = the build's value
        ap.add_argument(f"--{name}", type=int, default=None)
    for name in ("lr", "prompt_loss_weight"):
        ap.add_argument(f"--{name}", type=float, default=None)
    for name in ("games", "task_weights", "continue_from"):
        ap.add_argument(f"--{name}", default=None)
    ap.add_argument("--tokenizer", default=None, choices=list(TOKENIZERS))
    args = ap.parse_args(argv)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TinyConfig)
             if getattr(args, f.name, None) is not None}
    try:
        cfg = build_config(args.build, **given)
        cfg.key()  # validates games / weights before any work
        cfg.weights()
    except ValueError as e:
        ap.error(str(e))
    if args.out:
        out = Path(args.out)
        if is_complete(out) and not args.force:
            path = out
        else:
            with atomic_dir(out) as tmp:
                build_tiny_model(cfg, tmp, progress=not args.quiet, resume_dir=resume_dir(out),
                                 base=base_of(cfg, not args.quiet))
            path = out
    else:
        path = ensure_tiny_model(force=args.force, cfg=cfg, progress=not args.quiet,
                                 cache_dir=args.cache_dir)
    info = json.loads((path / INFO_FILE).read_text())
    print(f"tiny model: {path} ({info['n_params']:,} parameters, built in "
          f"{info['build_seconds']} s, {info['tokens_seen']:,} tokens)")
    return path


if __name__ == "__main__":
    bootstrap_main()
