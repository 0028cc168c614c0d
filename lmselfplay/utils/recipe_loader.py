"""Run a recipe script (``recipes/NAME.py``) as its command does, in this process, for tests and
benchmarks: ``run_recipe("spin", argv)`` is ``python recipes/spin.py ARGV`` without a new interpreter.

Recipes are scripts, not package modules (CleanRL style); dataclasses in them resolve
annotations through ``sys.modules``, so the module is registered there before it runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"


def _load_recipe(name: str, recipes_dir: str | Path | None = None) -> ModuleType:
    """``recipes_dir/NAME.py`` executed as a fresh module (private: callers run a recipe, they do
    not reach into it; its config and algorithm are imported from the package)."""
    path = Path(recipes_dir or RECIPES_DIR) / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no recipe {name!r} at {path}")
    module_name = f"lmselfplay_recipe_{name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = mod
    spec.loader.exec_module(mod)
    return mod


def run_recipe(name: str, argv: list[str] | None = None, recipes_dir: str | Path | None = None):
    """``recipes/NAME.py``'s ``main(argv)`` (what the command line runs) and its return value."""
    return _load_recipe(name, recipes_dir).main(list(argv or []))


def train_recipe(name: str, cfg, recipes_dir: str | Path | None = None):
    """``recipes/NAME.py``'s ``train(cfg)`` on a parsed config (a program that runs a recipe as one
    arm of a comparison, as the referee study runs the positive control)."""
    return _load_recipe(name, recipes_dir).train(cfg)
