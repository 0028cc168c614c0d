"""Imports point one way: down the layer order, never up and never sideways.

:data:`LAYERS` is THE layer order (docs/contributing.md describes it): rows from the top, each a
tuple of folders (packages). A module may import its own folder and any folder in a row BELOW
its own; an import of a folder in its own row (a sibling) or above is an error. Every import
counts, including those inside functions: a lazy import that dodges a cycle is still a cycle.
A module whose folder is in no row is an error too, so a new folder must be placed.

Why this order is docs/contributing.md's to say (one place); in short: the programs use
everything, measuring (eval) reads what the learning algorithms make, and the algorithms use
referees (verifiers) and models.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LAYERS: list[tuple[str, ...]] = [
    ("lmselfplay.cli", "lmselfplay.human_play", "lmselfplay.referee_study"),  # the programs inside the package
    # the algorithms, one package each (its config, its steps, its metrics): they train with the
    # library below and measure with eval; nothing below knows a recipe
    ("lmselfplay.selfplay_games", "lmselfplay.search_selfplay", "lmselfplay.debate", "lmselfplay.rlvr",
     "lmselfplay.r_zero", "lmselfplay.absolute_zero"),
    ("lmselfplay.eval",),
    ("lmselfplay.rl", "lmselfplay.spin"),
    # alphazero below rl: search self-play (an algorithm above both) distils alphazero's PUCT into the
    # policy with rl's trainer and league; alphazero (the search, its own network) needs no rl
    ("lmselfplay.alphazero",),
    ("lmselfplay.verifiers",),
    ("lmselfplay.models",),
    ("lmselfplay.lm",),
    ("lmselfplay.game_theory", "lmselfplay.solvers"),  # solvers: an ImportError naming game_theory
    ("lmselfplay.games", "lmselfplay.tasks"),
    ("lmselfplay.utils",),
]
# Loading a recipe script (recipes/*.py, the programs above the package) by its path is an
# import of the top layer that no import statement shows: only the top row may do it.
RECIPE_LOADER = "lmselfplay.utils.recipe_loader"
PACKAGE_ROOT = "lmselfplay"  # lmselfplay/__init__.py holds the version only: below every row

# Source folders and the package each one installs as (pyproject's package-dir).
FOLDERS = {"lmselfplay": "lmselfplay", "games": "lmselfplay.games",
           "verifiers": "lmselfplay.verifiers", "eval": "lmselfplay.eval"}


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the distribution by its installed name (games/ as lmselfplay.games...)."""
    out: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name ``module`` imports anywhere in its file (inside functions too):
    ``from a import b`` gives both ``a`` and ``a.b`` (``b`` may be a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def project_target(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` refers to (the longest known prefix), or None."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in modules:
            return ".".join(parts[:k])
    return None


def folder_of(module: str) -> tuple[int, str] | None:
    """(row, folder) of the longest folder in :data:`LAYERS` that holds ``module``."""
    if module == PACKAGE_ROOT:
        return len(LAYERS), PACKAGE_ROOT
    best = None
    for row, folders in enumerate(LAYERS):
        for folder in folders:
            if (module == folder or module.startswith(folder + ".")) and (best is None or len(folder) > len(best[1])):
                best = (row, folder)
    return best


def wrong_imports(modules: dict[str, Path]) -> list[str]:
    """One line per import that points sideways or up, or from a module in no row."""
    errors = []
    for module, path in modules.items():
        source = folder_of(module)
        if source is None:
            errors.append(f"{module}: its folder is in no row of LAYERS")
            continue
        names = imported_names(module, path)
        if source[0] > 0 and module != RECIPE_LOADER and any(n.startswith(RECIPE_LOADER) for n in names):
            errors.append(f"{module} loads a recipe script ({RECIPE_LOADER}): only {LAYERS[0]} may, being programs")
        targets = {project_target(name, modules) for name in names}
        for target in sorted(targets - {None, module}):
            dest = folder_of(target)
            if dest is None or dest[1] == source[1] or dest[0] > source[0]:
                continue  # its own folder, or a row below
            way = "up" if dest[0] < source[0] else "sideways"
            errors.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: "
                          f"{module} imports {target} ({way}: {dest[1]} is not below {source[1]})")
    return errors


def test_every_import_points_down_the_layers():
    modules = package_modules()
    assert len(modules) > 100  # the walk found the whole distribution
    assert wrong_imports(modules) == []


def _fake_tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return package_modules(tmp_path)


def test_an_upward_import_inside_a_function_is_caught(tmp_path):
    modules = _fake_tree(tmp_path, {
        "lmselfplay/__init__.py": "",
        "lmselfplay/lm/__init__.py": "",
        "lmselfplay/lm/policy.py": "def f():\n    from lmselfplay.models.tiny import build\n",
        "lmselfplay/models/__init__.py": "",
        "lmselfplay/models/tiny.py": "from lmselfplay.lm import policy\nfrom . import corpus\n",
        "lmselfplay/models/corpus.py": "from ..utils import config\n",
        "lmselfplay/utils/__init__.py": "",
        "lmselfplay/utils/config.py": "",
        "eval/__init__.py": "from lmselfplay.rl import trainer\n",
        "lmselfplay/rl/__init__.py": "",
        "lmselfplay/rl/trainer.py": "import lmselfplay.eval.game_metrics as gm\nfrom lmselfplay import spin\n",
        "lmselfplay/spin/__init__.py": "",
        "eval/game_metrics.py": "",
    })
    errors = wrong_imports(modules)
    assert len(errors) == 3, errors
    assert any("lmselfplay.lm.policy imports lmselfplay.models.tiny (up" in e for e in errors)
    assert any("lmselfplay.rl.trainer imports lmselfplay.eval.game_metrics (up" in e for e in errors)
    assert any("lmselfplay.rl.trainer imports lmselfplay.spin (sideways" in e for e in errors)


def test_a_recipe_loaded_below_the_top_row_is_caught(tmp_path):
    modules = _fake_tree(tmp_path, {
        "lmselfplay/__init__.py": "", "lmselfplay/utils/__init__.py": "",
        "lmselfplay/utils/recipe_loader.py": "",
        "lmselfplay/cli.py": "from lmselfplay.utils.recipe_loader import run_recipe\n",
        "eval/study.py": "def f():\n    from lmselfplay.utils.recipe_loader import run_recipe\n",
    })
    errors = wrong_imports(modules)
    assert len(errors) == 1 and errors[0].startswith("lmselfplay.eval.study loads a recipe script"), errors


def test_a_module_in_no_row_is_caught(tmp_path):
    modules = _fake_tree(tmp_path, {"lmselfplay/__init__.py": "", "lmselfplay/newfolder/x.py": ""})
    assert wrong_imports(modules) == ["lmselfplay.newfolder.x: its folder is in no row of LAYERS"]



RUNNER = ROOT / (RECIPE_LOADER.replace(".", "/") + ".py")


def runner_private_names(runner: Path = RUNNER) -> set[str]:
    """The runner's private functions (the loader ``run_recipe`` wraps): its API is run_recipe."""
    tree = ast.parse(runner.read_text(), str(runner))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("_")}


def reaches_into_the_runner(path: Path, private: set[str]) -> bool:
    """Whether ``path`` imports or calls one of the runner's ``private`` names."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and any(a.name in private for a in node.names):
            return True
        if isinstance(node, ast.Attribute) and node.attr in private:
            return True
    return False


def test_only_the_runner_loads_recipe_scripts():
    """Tests and benchmarks run a recipe with run_recipe; its config and algorithm they import from
    the package: no file but the runner holds a loaded recipe module."""
    private = runner_private_names()
    files = [p for folder in (*FOLDERS, "tests", "benchmarks", "recipes") for p in sorted((ROOT / folder).rglob("*.py"))]
    assert private and len(files) > 200 and RUNNER in files  # the walk found the loader and the tree
    assert [str(p.relative_to(ROOT)) for p in files if p != RUNNER and reaches_into_the_runner(p, private)] == []


def test_a_file_reaching_into_the_runner_is_caught(tmp_path):
    (name,) = runner_private_names()
    caught = {f"from lmselfplay.utils.recipe_loader import {name}\n": True,
              f"from lmselfplay.utils import recipe_loader\nrecipe_loader.{name}('spin')\n": True,
              "from lmselfplay.utils.recipe_loader import run_recipe\nrun_recipe('spin', [])\n": False}
    for i, (text, reaches) in enumerate(caught.items()):
        (tmp_path / f"t{i}.py").write_text(text)
        assert reaches_into_the_runner(tmp_path / f"t{i}.py", {name}) is reaches, text
