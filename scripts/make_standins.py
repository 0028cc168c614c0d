"""Build the stand-in models (random weights, real architectures, real-like tokenizers) into the cache.

    python scripts/make_standins.py                      # all of them; prints each folder
    python scripts/make_standins.py qwen3 llama-3.1-instruct
    python scripts/make_standins.py --model-vocab 151936 --out /tmp/big qwen2.5-instruct

Nothing is downloaded: see :mod:`lmselfplay.models.standins`. A cached build is reused
unless ``--force``. The folders load with ``from_pretrained`` and as ``model_name_or_path``.
"""

from __future__ import annotations

import argparse

from lmselfplay.models.standins import STANDINS, BuildOptions, ensure_standin


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", default=[],
                    help=f"stand-ins to build (default: all of {', '.join(STANDINS)})")
    ap.add_argument("--model-vocab", type=int, default=None, help="embedding rows (e.g. 151936, as Qwen)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="cache folder (default: $LMSELFPLAY_CACHE/standins)")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in STANDINS]
    if unknown:
        ap.error(f"unknown stand-in(s) {', '.join(unknown)}; known: {', '.join(STANDINS)}")
    opts = BuildOptions(seed=args.seed, model_vocab=args.model_vocab)
    for name in args.names or STANDINS:
        print(f"{name}\t{ensure_standin(name, opts, root=args.out, force=args.force)}")


if __name__ == "__main__":
    main()
