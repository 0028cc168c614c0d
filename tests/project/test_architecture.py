"""The package's shape: every layer imports, no import cycle between modules, no code
outside games/ branching on a game's name."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import lmselfplay

ROOT = Path(__file__).resolve().parents[2]
TOP_PACKAGES = ["lmselfplay", "lmselfplay.games", "lmselfplay.eval", "lmselfplay.verifiers"]


def all_modules() -> dict[str, Path]:
    """Every module of the distribution (the mapped games/ eval/ verifiers/ folders too)."""
    out: dict[str, Path] = {}
    for top in TOP_PACKAGES:
        pkg = importlib.import_module(top)
        out[top] = Path(pkg.__file__)
        for info in pkgutil.walk_packages(pkg.__path__, top + "."):
            if info.name.split(".")[1:2] in (["games"], ["eval"], ["verifiers"]) and top == "lmselfplay":
                continue  # walked from their own package
            spec = importlib.util.find_spec(info.name)
            out[info.name] = Path(spec.origin)
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules ``name`` imports anywhere in its file (lazy imports count too)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def test_every_layer_imports():
    layers = ["lmselfplay.lm", "lmselfplay.lm.engines", "lmselfplay.rl", "lmselfplay.game_theory", "lmselfplay.spin",
              "lmselfplay.models", "lmselfplay.tasks", "lmselfplay.utils", "lmselfplay.alphazero", "lmselfplay.games",
              "lmselfplay.eval", "lmselfplay.verifiers"]
    code = "import " + ", ".join(layers)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_no_import_cycle_between_modules():
    modules = all_modules()
    assert len(modules) > 40  # the walk found the whole distribution
    graph = {m: imports_of(m, p, modules) for m, p in modules.items()}
    # Tarjan's strongly connected components: any component of 2+ modules is a cycle
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == [], f"import cycles: {cycles}"


def test_the_cycle_finder_sees_a_cycle(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from pkg import b\n")
    b.write_text("def f():\n    import pkg.a\n")
    modules = {"pkg.a": a, "pkg.b": b}
    assert imports_of("pkg.a", a, modules) == {"pkg.b"}
    assert imports_of("pkg.b", b, modules) == {"pkg.a"}


NAME_BRANCH = re.compile(r"""(\.name|\bgame|\bg)\s*[!=]=\s*['"](nim|nim_misere|tictactoe|kuhn_poker|go\d*|taboo)['"]""")


def test_no_branch_on_a_game_name_outside_games():
    offenders = []
    for folder in ("lmselfplay", "eval", "verifiers", "recipes"):
        for path in (ROOT / folder).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if NAME_BRANCH.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert offenders == []


def test_package_root_is_the_installed_one():
    assert Path(lmselfplay.__file__).resolve().parent == ROOT / "lmselfplay"


def trainer_uses(source: str) -> list[str]:
    """What in ``source`` imports or touches a trainer: an import of :mod:`lmselfplay.rl.trainer`,
    a name ``trainer`` / ``PolicyTrainer``, a ``.trainer`` of anything but a config (``cfg.trainer`` is
    the TrainerConfig), a call that writes a checkpoint or the final model."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lmselfplay.rl.trainer") \
                or isinstance(node, ast.Import) and any(a.name.startswith("lmselfplay.rl.trainer") for a in node.names):
            found.append(f"line {node.lineno}: imports the trainer")
        elif isinstance(node, ast.Name) and node.id in ("trainer", "PolicyTrainer"):
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.arg) and node.arg == "trainer":
            found.append(f"line {node.lineno}: takes a trainer")
        elif isinstance(node, ast.Attribute) and node.attr == "trainer" and not (
                isinstance(node.value, ast.Name) and node.value.id in ("cfg", "config")):
            found.append(f"line {node.lineno}: .trainer")
        elif isinstance(node, ast.Attribute) and node.attr in ("save_checkpoint", "save_final_model", "serving"):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_evaluation_never_touches_the_trainer():
    """Evaluation measures and never trains: no module under eval/ imports the trainer, holds
    one, serves its weights or saves a model; the algorithm serves the weights and trains."""
    bad = {path.relative_to(ROOT).as_posix(): uses for path in sorted((ROOT / "eval").rglob("*.py"))
           if (uses := trainer_uses(path.read_text()))}
    assert not bad, bad


def test_evaluation_does_not_reach_the_trainer_through_its_imports():
    """No module under eval/ imports the trainer's module, directly or through another module."""
    modules = all_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    for name in (n for n in modules if n.startswith("lmselfplay.eval")):
        seen, todo = set(), [name]
        while todo:
            for dep in graph[todo.pop()] - seen:
                seen.add(dep)
                todo.append(dep)
        assert "lmselfplay.rl.trainer" not in seen, f"{name} reaches lmselfplay.rl.trainer"


def test_the_trainer_check_sees_an_evaluation_that_trains():
    """The check above, on the evaluation it was written against (a distillation and the final model)."""
    trains = ("from lmselfplay.selfplay_games.steps import distill_averages\n"
              "def finish(cfg, run, sp):\n"
              "    with sp.trainer.serving(sp.engine):\n"
              "        final = evaluate(cfg.trainer.beta)\n"
              "    distill_averages(sp.trainer, sp.averages)\n"
              "    run.save_final_model(sp.trainer.model)\n")
    assert len(trainer_uses(trains)) == 5
    assert trainer_uses("from lmselfplay.rl.trainer import PolicyTrainer\n") != []
    assert trainer_uses("def f(cfg):\n    return cfg.trainer.beta\n") == []


def helper_modules() -> set[str]:
    """The tests' helper modules: tests/*.py that are not tests (doubles, fixtures)."""
    return {p.stem for p in (ROOT / "tests").glob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py"}


def double_uses(source: str, modules: set[str]) -> list[str]:
    """Where ``source`` imports one of the tests' helper modules, or names one in a string
    (``import_module``, ``python -m``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and " " not in node.value:
            names = [node.value]
        if any(n.rpartition(".")[2] in modules or n.partition(".")[0] in modules for n in names):
            found.append(f"line {node.lineno}: {names}")
    return found


def test_no_production_module_reaches_a_test_double():
    """A test double (a simulated server, a fake engine) lives under tests/ and is injected from
    there (a weight-transfer backend registers its channel in ``vllm_server.WEIGHT_CHANNELS``): no
    module of the distribution imports one or loads one by name."""
    modules = helper_modules()
    bad = {str(path.relative_to(ROOT)): uses for path in all_modules().values()
           if (uses := double_uses(path.read_text(), modules))}
    assert not bad, bad


def test_the_double_check_sees_a_dispatch_into_a_double():
    """The check above, on the dispatch it was written against (vllm_server's simulated backend)."""
    modules = helper_modules()
    assert {"sim_server", "hf_server", "fake_vllm"} <= modules
    dispatch = ('if backend == "sim":\n'
                '    from lmselfplay.lm.engines.sim_server import SimHTTPChannel\n'
                '    channel = SimHTTPChannel(url)\n'
                'server = ServerProcess("lmselfplay.lm.engines.hf_server")\n')
    assert len(double_uses(dispatch, modules)) == 2
