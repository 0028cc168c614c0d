"""Every command the README and docs/*.md tell a user to type runs, at reduced size.

(a) The docs are scanned for commands (code blocks and backticked commands); each must be in the
registry ``tests/documented_commands.py``, so a newly documented command cannot go untested.
(b) Each registry entry runs as a process of its own from the repository root, exactly as typed plus
its size flags (forked from an interpreter that has imported torch and transformers once:
``tests/warm_process.py``): exit code 0, the files it must write, the output it must print. Entries
that need a GPU, a network install or a terminal are skipped with their reason (and stay listed).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from documented_commands import (
    REGISTRY,
    ROOT,
    Command,
    documented_commands,
    fenced_commands,
    inline_commands,
)
from warm_process import run_warm

BIN = Path(sys.executable).parent
ENV_ASSIGNMENT = re.compile(r"^([A-Z_][A-Z0-9_]*)=(\S*)$")


def test_every_documented_command_is_in_the_registry():
    known = {c.documented for c in REGISTRY}
    missing = {c: where for c, where in documented_commands().items() if c not in known}
    assert not missing, "documented commands with no entry in tests/documented_commands.py:\n" + "\n".join(
        f"  {c!r}  ({', '.join(w)})" for c, w in missing.items())


def test_the_registry_lists_only_documented_commands_once():
    names = [c.documented for c in REGISTRY]
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    stale = set(names) - set(documented_commands())
    assert not stale, f"registry entries the docs no longer show: {sorted(stale)}"
    assert all(c.skip or c.files or c.output for c in REGISTRY), "every run entry checks something"


def test_extraction_reads_code_blocks_tables_and_continuations():
    doc = ("text `lmselfplay show nim` and `recipes/spin.py` and `python -I`\n"
           "| a | `benchmarks/b.py --n 2` |\n"
           "```bash\n"
           "bash .ci/setup && .venv/bin/python recipes/x.py --config c.yaml  # comment\n"
           "accelerate launch --config_file a.yaml \\\n    recipes/y.py --k 1\n"
           "```\n"
           "```python\npython not_a_shell_block.py\n```\n")
    assert inline_commands(doc) == ["lmselfplay show nim", "benchmarks/b.py --n 2"]
    assert fenced_commands(doc) == ["bash .ci/setup", ".venv/bin/python recipes/x.py --config c.yaml",
                                    "accelerate launch --config_file a.yaml recipes/y.py --k 1"]


# --- running them ------------------------------------------------------------------------------

def argv_and_env(line: str) -> tuple[list[str], dict[str, str]]:
    """The command's argv (the documented programs resolved in this venv) and its env additions."""
    words, env = shlex.split(line), {}
    while words and ENV_ASSIGNMENT.match(words[0]):
        key, value = ENV_ASSIGNMENT.match(words.pop(0)).groups()
        env[key] = value
    program = words[0]
    if program in ("python", ".venv/bin/python"):
        words[0] = sys.executable
    elif program == "lmselfplay":
        words[0] = str(BIN / program)
    elif words[:2] == ["accelerate", "launch"]:  # its console script may live in another venv
        words[:2] = [sys.executable, "-m", "accelerate.commands.launch"]
    else:
        raise AssertionError(f"no rule to run program {program!r} of {line!r}")
    return words, env


def results_snapshot() -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (ROOT / "benchmarks" / "results").iterdir()}


def key(cmd: Command) -> tuple[str, ...]:
    """What a run checks: the argv as resolved (``python x`` and ``.venv/bin/python x`` are one),
    the files and the output; one run and its checks serve every entry of one key."""
    return tuple(argv_and_env(cmd.line())[0]) + cmd.files + (cmd.output,)


def run(cmd: Command, out: Path, values: dict[str, str]) -> None:
    """Run ``cmd`` at reduced size in ``out`` and check it (exit status, files, output, and that it
    left the results files the docs cite untouched)."""
    out.mkdir(parents=True, exist_ok=True)
    line = cmd.line().format(out=out, **values)
    argv, env = argv_and_env(line)
    env = {**os.environ, **env, "LMSELFPLAY_RESULTS_DIR": str(out / "results"), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg"}
    cited = results_snapshot()
    try:
        proc = run_warm(argv[1:] if argv[0] == sys.executable else argv, env, ROOT, cmd.timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{line!r} ran past {cmd.timeout_s} s")
    text = proc.stdout + proc.stderr
    assert results_snapshot() == cited, f"{line!r} rewrote files under benchmarks/results (the README cites them)"
    assert proc.returncode == 0, f"{line!r} exited {proc.returncode}:\n{text[-4000:]}"
    for name in cmd.files:
        assert (out / name).exists(), f"{line!r} did not write {name}; it wrote {sorted(os.listdir(out))}"
    if cmd.output:
        assert re.search(cmd.output, text), f"{line!r} did not print /{cmd.output}/:\n{text[-3000:]}"


@pytest.fixture(scope="session")
def inputs(tmp_path_factory) -> dict[str, str]:
    """{model}, {data}: the embedded model; HumanEval samples and reasoning outputs to score."""
    from lmselfplay.eval.reasoning import build_problems, load_suite
    from lmselfplay.models.policy import resolve_model_path

    data = tmp_path_factory.mktemp("inputs")
    rows = [{"task_id": f"HumanEval/{i}", "completion": "    return None\n"} for i in range(2) for _ in range(2)]
    (data / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    suite = build_problems(load_suite("tiny"))  # the entries run the tiny suite
    (data / "outputs.jsonl").write_text("".join(json.dumps({"id": p.id, "completion": "<answer>4</answer>"}) + "\n"
                                                for p in suite))
    (data / "questions.jsonl").write_text("".join(json.dumps({"question": f"What is {i} + 2?", "answer": i + 2}) + "\n"
                                                  for i in range(12)))
    return {"model": resolve_model_path(None), "data": str(data)}


class Runs:
    """The entries a session selected, run two at a time in the background: each command is one
    single-threaded process, mostly its imports, so side by side on two cores they take about half
    the time they take one after another. The main job's entry starts first; the entries that read
    its run (``{run}``) start once it has passed. ``check(cmd)`` waits for the entry's run and
    re-raises its failure, so each entry stays one test with its own verdict."""

    def __init__(self, commands: list[Command], inputs: dict[str, str], tmp_path_factory) -> None:
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="documented")
        self.lock = threading.Lock()
        self.inputs, self.tmp = inputs, tmp_path_factory
        self.runs: dict[tuple[str, ...], Future] = {}
        (main_job,) = [c for c in REGISTRY if c.makes_run]
        self.run_dir = tmp_path_factory.mktemp("main_job")
        later = [c for c in commands if "{run}" in c.line()]
        self.main = self._start(main_job, self.run_dir) if later or main_job in commands else None
        for cmd in commands:
            if cmd not in later:
                self._start(cmd)
        if later:
            self.main.add_done_callback(lambda f: f.exception() or [self._start(c) for c in later])

    def _start(self, cmd: Command, out: Path | None = None) -> Future:
        """The run of ``cmd``'s key (one run serves every entry of one key), started if new."""
        with self.lock:
            if key(cmd) not in self.runs:
                out = out or self.tmp.mktemp("out")
                self.runs[key(cmd)] = self.pool.submit(run, cmd, out, {**self.inputs, "run": str(self.run_dir)})
            return self.runs[key(cmd)]

    def check(self, cmd: Command) -> None:
        if "{run}" in cmd.line() and self.main.exception() is not None:
            pytest.fail(f"the main job's entry failed, so there is no run to read: {self.main.exception()}")
        self._start(cmd).result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def runs(request, inputs, tmp_path_factory):
    """The background runs of the entries this session selected (``-k`` and ``-m`` respected)."""
    selected = [item.callspec.params["cmd"] for item in request.session.items
                if item.originalname == "test_documented_command_runs" and not item.callspec.params["cmd"].skip]
    runs = Runs(selected, inputs, tmp_path_factory)
    yield runs
    runs.close()


def entry_param(cmd: Command):
    marks = [pytest.mark.skip(reason=cmd.skip)] if cmd.skip else []
    marks += [pytest.mark.slow] if cmd.slow else []
    return pytest.param(cmd, marks=marks, id=cmd.documented[:90])


@pytest.mark.parametrize("cmd", [entry_param(c) for c in REGISTRY])
def test_documented_command_runs(cmd, runs):
    runs.check(cmd)


def test_save_results_writes_numpy_and_torch_values(tmp_path, monkeypatch):
    """bench_trainer_vs_trl printed its table, then died here on a numpy array."""
    import numpy as np
    import torch

    from lmselfplay.utils.results import save_results

    monkeypatch.setenv("LMSELFPLAY_RESULTS_DIR", str(tmp_path))
    path = save_results("x", {"array": np.array([1.5, 2.0]), "matrix": np.eye(2, dtype=np.float32),
                              "scalar": np.float32(0.25), "count": np.int64(3), "tensor": torch.tensor([1, 2]),
                              "path": Path("a/b")})
    assert path == tmp_path / "x.json"
    assert json.loads(path.read_text())["results"] == {"array": [1.5, 2.0], "matrix": [[1.0, 0.0], [0.0, 1.0]],
                                                       "scalar": 0.25, "count": 3, "tensor": [1, 2], "path": "a/b"}
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        save_results("y", {"bad": object()})
