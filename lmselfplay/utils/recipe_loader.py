"""Load a recipe script (``recipes/NAME.py``) as a module, for tests and benchmarks.

Recipes are scripts, not package modules (CleanRL style); dataclasses in them resolve
annotations through ``sys.modules``, so the module is registered there before it runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"


def load_recipe(name: str, recipes_dir: str | Path | None = None) -> ModuleType:
    path = Path(recipes_dir or RECIPES_DIR) / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no recipe {name!r} at {path}")
    module_name = f"lmselfplay_recipe_{name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = mod
    spec.loader.exec_module(mod)
    return mod
