"""Ship the default embedded model's build inside the package (``lmselfplay/models/embedded/``).

    python scripts/ship_embedded_model.py            # the cached build of the default build's key, or build it
    python scripts/ship_embedded_model.py --rebuild  # build afresh even if cached (minutes)
    python scripts/ship_embedded_model.py --build v4 # ship a named build (tiny.BUILDS) instead

The default build goes to ``embedded/``; a build of ``tiny.SHIPPED_BUILDS`` (the language recipes'
v8) to ``embedded_<build>/``. The package uses each folder only for the key it was built from, and
``tests/models/test_shipped_model.py`` fails on a stale one.

Re-run after anything that changes ``build_config().key()`` (the corpus, the build's settings,
``BUILD_VERSION``): ``ensure_tiny_model()`` uses the shipped files only for the key they were
built from, so a stale copy is never used, just ignored (and ``tests/models/test_shipped_model.py``
says it is stale). The copy is written atomically with a checksum of every file.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from lmselfplay.models.cache import base_of, is_complete, model_dir, resume_dir, shipped_dir
from lmselfplay.models.pretrain import build_tiny_model
from lmselfplay.models.tiny import BUILDS, DEFAULT_BUILD, INFO_FILE, TinyConfig, build_config
from lmselfplay.utils.checkpoint import MARKER, atomic_dir

SHIPPED = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
           "tokenizer_config.json", INFO_FILE)


def source_build(cfg: TinyConfig, rebuild: bool) -> Path:
    """The cache folder of ``cfg``'s build (built now, never copied from the package)."""
    path = model_dir(cfg)
    if rebuild or not is_complete(path):
        with atomic_dir(path) as tmp:  # a killed build resumes from its last saved step
            build_tiny_model(cfg, tmp, resume_dir=resume_dir(path), base=base_of(cfg))
    return path


def ship(src: Path, dest: Path) -> Path:
    with atomic_dir(dest) as tmp:
        for name in SHIPPED:
            shutil.copy2(src / name, tmp / name)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rebuild", action="store_true", help="build afresh even if the cache holds the key")
    ap.add_argument("--build", default=DEFAULT_BUILD, choices=list(BUILDS), help="a named build (default: the default)")
    args = ap.parse_args()
    cfg = build_config(args.build)
    dest = ship(source_build(cfg, args.rebuild), shipped_dir(args.build))
    size = sum(p.stat().st_size for p in dest.iterdir()) / 1e6
    print(f"shipped tiny-{cfg.key()} -> {dest} ({size:.1f} MB; marker {dest / MARKER})")


if __name__ == "__main__":
    main()
