"""Referees a program cannot fool: verdicts decided by the parent, one task's
failure staying that task's, a child seeing only its own task, ordinary file work inside the
working directory, stale scratch folders, the refusal without an OS boundary, and the
hostile battery of ``test_executor.py`` once more as an unprivileged user."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lmselfplay.utils.errors import UserError
from lmselfplay.verifiers import executor as executor_mod
from lmselfplay.verifiers.executor import (
    SCRATCH_PREFIX,
    Executor,
    ExecutorConfig,
    Program,
    SandboxError,
    remove_stale_scratch,
)

ROOT = os.geteuid() == 0
DEFAULT = "namespaces" if ROOT else "bwrap"
LIMITS = dict(timeout_s=2.0, cpu_s=2, memory_mb=512, max_workers=2)
MODES = (["namespaces"] if ROOT else []) + ["bwrap", "unsafe-hooks-only"]
FORGE = "import os\nos.write(3, b'{\"status\":\"ok\",\"value\":null}')\nos._exit(0)\n"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def executors():
    exs = {m: Executor(ExecutorConfig(sandbox=m, **LIMITS)) for m in MODES}
    yield exs
    for ex in exs.values():
        ex.close()


# --- forged verdicts: every referee that runs code -------------------------------------------

def _indent(code: str) -> str:
    return "".join("    " + line + "\n" for line in code.splitlines())


ALWAYS_EQUAL = ("class A:\n    def __eq__(self, o):\n        return True\n"
                "    def __ne__(self, o):\n        return False\n    __hash__ = object.__hash__\n"
                "return A()")


def test_humaneval_verdict_cannot_be_forged_by_the_child(executors):
    from lmselfplay.eval.humaneval import check_completions, load_problems

    problems = load_problems()
    ids = ["HumanEval/2", "HumanEval/33"]  # 33: its test names the function, not candidate
    probs = {t: problems[t] for t in ids}
    bodies = {"canonical": None, "return 0": "return 0", "forged ok on fd 3": FORGE,
              "__eq__ always true": ALWAYS_EQUAL,
              "forge then keep running": "import os\nos.write(3, b'{\"status\":\"ok\",\"value\":null}')\n"
                                         "raise SystemExit"}
    for mode in ("unsafe-hooks-only", DEFAULT):
        ex = executors[mode]
        for name, body in bodies.items():
            if mode != DEFAULT and name not in ("canonical", "forged ok on fd 3"):
                continue
            comps = {t: [problems[t]["canonical_solution"] if body is None else _indent(body)] for t in ids}
            out = check_completions(probs, comps, ex, progress=False)
            passed = [o[0]["passed"] for o in out.values()]
            assert passed == [body is None] * len(ids), (mode, name, out)


def test_executor_referee_label_is_the_programs_output_only(executors):
    from lmselfplay.verifiers.checkable import Question
    from lmselfplay.verifiers.referees import ExecutorReferee

    ref = ExecutorReferee(executor=executors[DEFAULT])
    qs = [Question(id="a", kind="program", prompt="?", code="print(7, flush=True)\n" + FORGE.replace("null", "99")),
          Question(id="b", kind="program", prompt="?", code="print(7)\nimport os\nos.write(3, b'junk')"),
          Question(id="c", kind="program", prompt="?", code="print(7)")]
    truths = ref.truths(qs)
    assert truths["a"] == "7" and truths["c"] == "7"  # the value written on fd 3 plays no part
    assert truths["b"] is None  # a corrupt result channel: uncheckable, never a label
    verdicts = ref.score(qs, ["7", "7", "99"])
    assert [v.reward for v in verdicts] == [1.0, 0.0, 0.0]


def test_absolute_zero_answers_cannot_be_forged(executors):
    from lmselfplay.verifiers.code_tasks import CodeReferee, CodeTask

    with CodeReferee(ExecutorConfig(sandbox=DEFAULT, **LIMITS)) as referee:
        t = CodeTask("induction", "def f(x):\n    return x + 1\n", ["1", "2", "3", "4"], [2, 3, 4, 5])
        forged = "def f(x):\n" + _indent(FORGE)
        forged_value = "def f(x):\n" + _indent(FORGE.replace("null", "5"))
        assert referee.check([(t, forged), (t, forged_value)]) == [(0.0, "ok"), (0.0, "ok")]
        assert referee.check([(t, "def f(x):\n    return x + 1\n")]) == [(1.0, "ok")]
        liar = "def f(x):\n" + _indent(ALWAYS_EQUAL)
        assert referee.check([(t, liar)])[0][0] == 0.0


def test_debate_program_answers_come_from_the_parent(executors, monkeypatch):
    from lmselfplay.debate import tasks as debate_tasks

    hostile = {"code": "def f(x):\n    import os\n    os.write(3, b'{\"status\":\"ok\",\"value\":"
                       "{\"t\":[1,2]}}')\n    os._exit(0)\n", "input": "3"}
    monkeypatch.setattr(debate_tasks, "python_program", lambda rng: dict(hostile))
    monkeypatch.setattr(debate_tasks, "mutate_constant", lambda code, rng: None)
    out = debate_tasks.program_tasks(2, seed=0, executor=executors[DEFAULT])
    # the channel carries data, decoded here: the 'answer' is that value, never a verdict
    assert out and all(t.correct == "(1, 2)" and t.incorrect != t.correct for t in out)
    hostile["code"] = "def f(x):\n    import os\n    os.write(3, b'{\"status\":\"ok\"}')\n    os._exit(0)\n"
    assert debate_tasks.program_tasks(2, seed=0, executor=executors[DEFAULT]) == []


def test_our_own_checkers_compare_type_strictly():
    from lmselfplay.verifiers.executor import values_equal
    from lmselfplay.verifiers.referees import AnswerMatcher

    class AlwaysEqual:
        def __eq__(self, other):
            return True

    assert not values_equal(AlwaysEqual(), 3) and not values_equal(3, AlwaysEqual())
    assert not values_equal(1, 1.0) and not values_equal(True, 1) and not values_equal([1], (1,))
    m = AnswerMatcher()
    try:  # R-Zero's program answers: printed text read as literals, never objects
        assert m.matches("program", "[1, 2]", "[1,2]")
        assert not m.matches("program", "1", "1.0") and not m.matches("program", "True", "1")
        assert not m.matches("program", "anything", "<__main__.AlwaysEqual object at 0x7f>")
    finally:
        m.close()


# --- one task's failure is that task's alone --------------------------------------------------

def test_recursion_bomb_on_the_result_channel_breaks_only_its_task():
    bomb = ("import os\nos.write(3, b'{\"status\":\"ok\",\"value\":' + b'[' * 200000 + b']' * 200000 + b'}')\n"
            "os._exit(0)")
    for mode in MODES:
        tasks = [Program("def f(i):\n    return i * 2", "f", (i,)) for i in range(40)]
        tasks[20] = Program(bomb)
        ex = Executor(ExecutorConfig(sandbox=mode, **{**LIMITS, "max_workers": 2},
                                     max_value_bytes=1 << 20))
        try:
            results = ex.run_batch(tasks, progress=False)
        finally:
            ex.close()
        assert results[20].status == "error" and "corrupt" in results[20].error, (mode, results[20])
        assert [r.value for i, r in enumerate(results) if i != 20] == [2 * i for i in range(40) if i != 20]


# --- a child sees only its own task -----------------------------------------------------------

SNOOP = """# secret-zqx{i}
import gc, re, sys
def f():
    pat = re.compile("zq" + "x([0-9]+)")
    found = set()
    def scan(v):
        if type(v) in (str, bytes):
            text = v if type(v) is str else v.decode("latin-1")
            found.update(int(m) for m in pat.findall(text))
    for o in gc.get_objects():
        items = list(o.items()) if type(o) is dict else (list(o) if type(o) in (list, tuple) else [])
        for it in items:
            for v in (it if type(it) is tuple else (it,)):
                scan(v)
    fr = sys._getframe()
    while fr is not None:
        for v in fr.f_locals.values():
            scan(v)
        fr = fr.f_back
    return sorted(found)
"""


def test_a_child_finds_no_other_tasks_source():
    # the audit hook off: gc and frames are reachable, as through any escape from the hook
    for mode in MODES[:-1]:
        with Executor(ExecutorConfig(sandbox=mode, audit_hook=False, allow_ctypes=True, **LIMITS)) as ex:
            results = ex.run_batch([Program(SNOOP.format(i=i), "f") for i in range(8)], progress=False)
        for i, r in enumerate(results):
            assert r.ok and set(r.value) <= {i}, (mode, i, r.value, r.error)


# --- legitimate programs work inside their working directory ----------------------------------

FILE_WORK = """import os, shutil, tempfile
def f():
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(os.path.join(d, "sub"))
        p = os.path.join(d, "sub", "a.txt")
        with open(p, "w") as fh:
            fh.write("x")
        os.chmod(p, 0o600)
        os.utime(p, (1, 1))
        os.rename(p, os.path.join(d, "b.txt"))
        os.rmdir(os.path.join(d, "sub"))
        fd = os.open(d, os.O_RDONLY)
        os.mkdir("by_fd", dir_fd=fd)
        os.rmdir("by_fd", dir_fd=fd)
        os.close(fd)
        listing = sorted(os.listdir(d))
    os.makedirs("x/y/z")
    shutil.rmtree("x")
    os.remove(tempfile.mkstemp()[1])
    return [listing, os.path.exists(d), sorted(os.listdir("."))]
"""


@pytest.mark.parametrize("mode", MODES)
def test_file_work_inside_the_working_directory(executors, mode):
    r = executors[mode].run(FILE_WORK, entry="f")
    assert r.ok, r.error
    assert r.value == [["b.txt"], False, []]


@pytest.mark.parametrize("mode", MODES)
def test_dir_fd_cannot_reach_outside_the_working_directory(executors, mode):
    code = "import os\nfd = os.open('/', os.O_RDONLY)\nos.mkdir('lmselfplay_pwned_dir', dir_fd=fd)"
    r = executors[mode].run(code)
    assert r.status == "error" and not os.path.exists("/lmselfplay_pwned_dir")


# --- scratch folders of dead hosts ------------------------------------------------------------

def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_stale_scratch_of_dead_hosts_is_removed_and_only_that(tmp_path):
    dead = tmp_path / f"{SCRATCH_PREFIX}{_dead_pid()}-abc"
    alive = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-def"
    other = tmp_path / f"{SCRATCH_PREFIX}notapid"
    for d in (dead, alive, other):
        (d / "t1").mkdir(parents=True)
    assert remove_stale_scratch(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and alive.exists() and other.exists()


def test_host_killed_with_sigkill_leaves_scratch_the_next_start_removes():
    code = ("import sys\nfrom lmselfplay.verifiers.executor import Executor, ExecutorConfig\n"
            f"ex = Executor(ExecutorConfig(sandbox={DEFAULT!r}))\n"
            "print(ex._scratch, flush=True)\nimport time\ntime.sleep(60)")
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    scratch = host.stdout.readline().strip()
    assert scratch.startswith("/dev/shm/") and os.path.isdir(scratch)
    host.send_signal(signal.SIGKILL)
    host.wait()
    host.stdout.close()
    assert os.path.isdir(scratch)  # nothing could clean up after -9
    with Executor(ExecutorConfig(sandbox=DEFAULT)) as ex:
        assert not os.path.exists(scratch)
        assert ex.run("x = 1", expr="x").value == 1


# --- no OS boundary: refuse, one line, unless asked by name -----------------------------------

def test_no_boundary_is_refused_with_one_line(monkeypatch):
    monkeypatch.setattr(executor_mod.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(executor_mod, "_BWRAP_PROBLEM", {"v": "bubblewrap (bwrap) is not installed"})
    with pytest.raises(SandboxError) as e:
        Executor(ExecutorConfig())
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert "bubblewrap (bwrap) is not installed" in msg and "unsafe-hooks-only" in msg
    with pytest.raises(SandboxError, match="needs root"):
        Executor(ExecutorConfig(sandbox="namespaces"))


def test_opt_in_by_environment_names_the_unsafe_mode(monkeypatch):
    monkeypatch.setenv("LMSELFPLAY_SANDBOX", "unsafe-hooks-only")
    assert ExecutorConfig().sandbox == "unsafe-hooks-only"
    monkeypatch.setenv("LMSELFPLAY_SANDBOX", "off")
    with pytest.raises(ValueError, match="sandbox"):
        ExecutorConfig()


# --- the whole battery as a normal user -------------------------------------------------------

AS_NOBODY = """set -e
# a private mount view where an interpreter under a root-only folder (/root/.pyenv, say) is
# reachable for uid 65534, as a normal user's own interpreter is for them
stage=$(mktemp -d /dev/shm/lmselfplay-test-stage-XXXXXX)
for dir in $BLOCKED; do
  i=0
  for p in $NEEDED; do
    case "$p" in "$dir"/*) mkdir -p "$stage/$i"; mount --rbind "$p" "$stage/$i";; esac
    i=$((i+1))
  done
  mount -t tmpfs -o mode=0755 tmpfs "$dir"
  i=0
  for p in $NEEDED; do
    case "$p" in "$dir"/*) mkdir -p "$p"; mount --rbind "$stage/$i" "$p";; esac
    i=$((i+1))
  done
done
exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all "$@"
"""


@pytest.mark.skipif(not ROOT, reason="already unprivileged: the battery itself runs as this user")
def test_hostile_battery_as_an_unprivileged_user():
    if not all(shutil.which(t) for t in ("unshare", "setpriv", "bwrap")):
        pytest.skip("needs unshare, setpriv (util-linux) and bwrap")
    needed = executor_mod.python_paths(sys.executable)
    blocked = sorted({"/" + "/".join(p.strip("/").split("/")[:k]) for p in needed
                      for k in range(1, len(p.strip("/").split("/")) + 1)
                      if not os.stat("/" + "/".join(p.strip("/").split("/")[:k])).st_mode & 0o001})
    blocked = [b for b in blocked if not any(b.startswith(o + "/") for o in blocked)]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "BLOCKED": " ".join(blocked), "NEEDED": " ".join(needed)}
    cmd = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", AS_NOBODY, "sh",
           sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           "-n", "0", "tests/verifiers/test_executor.py", "-k", "battery or boundary or hidden or concurrent or working_directory",
           "--basetemp", "/tmp/lmselfplay-nobody-pytest"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, tail
    # as uid 65534: bwrap and its OS-only variant and the hooks mode ran, namespaces skipped
    assert int(summary.split(" passed")[0].split()[-1]) >= 150, summary
