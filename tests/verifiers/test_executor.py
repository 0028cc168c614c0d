"""The hostile battery for the Python executor sandbox.

Every case runs a program an attacker could write, asserts the status, and then asserts that
the host is unharmed (sentinel file intact, canary paths absent, zygote alive) and that
nothing is left running (process table: no descendant of this test process but the zygotes,
no process owned by a sandbox uid).

Three sandbox modes:
- ``full``: the default config (as root: netns, read-only mount ns, uid drop, audit hook).
- ``fallback``: what a non-root host gets (no namespaces, no uid drop): audit hook + rlimits.
- ``os-only``: audit hook off and ctypes allowed, to show the OS-level barriers hold alone.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from lmselfplay.verifiers.executor import (
    STATUSES,
    ExecResult,
    Executor,
    ExecutorConfig,
    Program,
    parse_literal_args,
    values_equal,
)
from lmselfplay.verifiers.sandbox_worker import decode, make_encoder

LIMITS = dict(timeout_s=1.0, cpu_s=1, memory_mb=512, max_output_bytes=4096,
              max_file_bytes=64 * 1024, max_value_bytes=64 * 1024, max_workers=2)
MODES = {
    "namespaces": dict(sandbox="namespaces"),
    "bwrap": dict(sandbox="bwrap"),
    "namespaces-os": dict(sandbox="namespaces", audit_hook=False, allow_ctypes=True),
    "bwrap-os": dict(sandbox="bwrap", audit_hook=False, allow_ctypes=True),
    "hooks": dict(sandbox="unsafe-hooks-only"),
}
# Which column of the battery table a mode reads: both boundaries must hold the same way.
COLUMN = {"namespaces": "full", "bwrap": "full", "namespaces-os": "os-only", "bwrap-os": "os-only",
          "hooks": "hooks"}
COLUMNS = ("full", "os-only", "hooks")
ROOT = os.geteuid() == 0
DEFAULT = "namespaces" if ROOT else "bwrap"  # what sandbox="auto" picks
BOUNDARIES = ["namespaces", "bwrap"] if ROOT else ["bwrap"]  # modes with a real OS boundary


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory):
    d = tmp_path_factory.mktemp("host")
    p = d / "sentinel.txt"
    p.write_text("intact")
    return p


@pytest.fixture(scope="module")
def executors():
    exs = {name: Executor(ExecutorConfig(**LIMITS, **kw)) for name, kw in MODES.items()
           if ROOT or not name.startswith("namespaces")}
    yield exs
    for ex in exs.values():
        ex.close()


LISTENER_HITS: list[int] = []


def _listen() -> int:
    """A TCP listener on the host's 127.0.0.1 that counts connections from the sandbox."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def accept():
        while True:
            conn, _ = srv.accept()
            LISTENER_HITS.append(1)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return srv.getsockname()[1]


LISTENER_PORT = _listen()


def _procs():
    """pid -> (ppid, real uid, state) from /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/status") as f:
                uid = int(f.read().split("\nUid:")[1].split()[0])
        except (OSError, IndexError):
            continue
        out[int(d)] = (int(rest[1]), uid, rest[0])
    return out


def leftovers(exs) -> list:
    """Processes that should not exist: descendants of this process other than the zygotes,
    and anything owned by a sandbox uid. Retries briefly: a SIGKILLed process may take a moment
    to disappear from the table."""
    zygotes = {p for e in exs for p in e.process_ids}
    uids = {u for e in exs for u in e.uids}
    for _ in range(50):
        procs = _procs()
        kids: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in procs.items():
            kids.setdefault(ppid, []).append(pid)
        stack, desc = [os.getpid()], set()
        while stack:
            for c in kids.get(stack.pop(), []):
                if c not in desc:
                    desc.add(c)
                    stack.append(c)
        bad = sorted((desc - zygotes) | {p for p, (_, uid, _) in procs.items() if uid in uids})
        if not bad:
            return []
        time.sleep(0.02)
    return [(p, procs.get(p)) for p in bad]


def assert_host_unharmed(exs, sentinel):
    assert sentinel.read_text() == "intact"
    for canary in ("/tmp/lmselfplay_pwned", "/etc/lmselfplay_pwned", "/dev/shm/lmselfplay_pwned"):
        assert not os.path.exists(canary), canary
    for e in exs:
        os.kill(e.zygote_pid, 0)  # still alive
        assert zygote_state(e.zygote_pid) == ZYGOTE_STATE, e.boundary  # its scheduling and limits untouched
    assert leftovers(exs) == []


def zygote_state(pid: int) -> tuple:
    """What a task must not change of its zygote: nice, scheduling policy, CPUs, limits."""
    with open(f"/proc/{pid}/limits") as f:
        limits = [line for line in f if line.startswith(("Max open files", "Max address space", "Max cpu time"))]
    return (os.getpriority(os.PRIO_PROCESS, pid), os.sched_getscheduler(pid), len(os.sched_getaffinity(pid)), limits)


ZYGOTE_STATE = zygote_state(os.getpid())  # a zygote starts with the host's


# --------------------------------------------------------------------------------------------
# The battery: (name, program, expected status per mode or None to skip, extra check)
# A program defines f() when the value matters; {S} is replaced by the sentinel path.
# --------------------------------------------------------------------------------------------

def every(status):
    return dict.fromkeys(COLUMNS, status)


SITE = next(p for p in sys.path if p.endswith("site-packages"))  # a read root of the zygote
DIRFD_CANARY = os.path.join(SITE, "lmselfplay_pwned.py")
# load a native module under another package name (the import check once matched exact names)
LOAD_RENAMED = ("import sys, glob, importlib.util\n"
                "def load(name):\n"
                "    so = [f for p in sys.path for f in glob.glob(p + '/' + name + '.*.so')][0]\n"
                "    spec = importlib.util.spec_from_file_location('x.' + name, so)\n"
                "    m = importlib.util.module_from_spec(spec)\n"
                "    spec.loader.exec_module(m)\n"
                "    return m\n")
SHELL_VIA_FORK_EXEC = (LOAD_RENAMED + "ps = load('_posixsubprocess')\nimport os\nr, w = os.pipe()\n"
                       "ps.fork_exec([b'/bin/sh', b'-c', b'touch /tmp/lmselfplay_pwned; setsid sleep 60 &'],"
                       " [b'/bin/sh'], True, (w,), None, None, -1, -1, -1, -1, -1, -1, r, w, True, True,"
                       " -1, None, None, None, -1, None, False)\nimport time\ntime.sleep(0.3)")


def escaped_here(r):
    """The write through dir_fd, which the audit hook cannot see, landed."""
    landed = os.path.exists(DIRFD_CANARY)
    if landed:
        os.remove(DIRFD_CANARY)
    return landed


def has(text):
    return lambda r: text in (r.error or "") + r.stdout + r.stderr


BATTERY = [
    ("infinite loop", "while True: pass", every("timeout"), None),
    ("sleep past timeout", "import time\ntime.sleep(30)", every("timeout"), None),
    ("ignore SIGXCPU and spin", "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
     "while True: pass", every("timeout"), None),
    ("fork bomb", "import os\nwhile True:\n    os.fork()", every("error"), None),
    ("subprocess", "import subprocess\ndef f():\n    return subprocess.run(['id', '-u'], "
     "capture_output=True).stdout.decode()", every("error"),
     lambda r: r.status != "ok" or r.value.strip() != "0"),
    ("os.system", "import os\nos.system('touch /tmp/lmselfplay_pwned')",
     {"full": "error", "hooks": "error", "os-only": "ok"}, None),
    ("os.execv replaces the process", "import os\nos.execv('/bin/true', ['true'])",
     {"full": "error", "hooks": "error", "os-only": "error"}, None),
    ("memory bomb (one block)", "x = bytearray(10**11)", every("memory"), None),
    ("memory bomb (growing)", "x = []\nwhile True:\n    x.append(bytes(10**8))", every("memory"), None),
    ("huge output", "while True:\n    print('x' * 1000)", every("output-limit"),
     lambda r: len(r.stdout) <= LIMITS["max_output_bytes"]),
    ("huge stderr", "import sys\nwhile True:\n    sys.stderr.write('y' * 1000)",
     every("output-limit"), None),
    ("large file", "with open('big', 'wb') as fh:\n    fh.write(b'x' * 10**7)", every("error"),
     has("File too large")),
    ("write outside the temp dir", "open('{S}', 'w').write('pwned')", every("error"), None),
    ("write /tmp canary", "open('/tmp/lmselfplay_pwned', 'w').write('x')", every("error"), None),
    ("os.open write outside", "import os\nos.open('/etc/lmselfplay_pwned', os.O_CREAT | os.O_WRONLY)",
     every("error"), None),
    ("rename into /dev/shm", "open('a', 'w').write('x')\nimport os\n"
     "os.rename('a', '/dev/shm/lmselfplay_pwned')", every("error"), None),
    ("symlink to escape", "import os\nos.symlink('{S}', 'link')\nopen('link', 'w').write('pwned')",
     every("error"), None),
    ("chdir out then write", "import os\nos.chdir('/tmp')\nopen('lmselfplay_pwned', 'w').write('x')",
     every("error"), None),
    ("read /etc/shadow", "def f():\n    return open('/etc/shadow').read()", every("error"), None),
    ("read the host sentinel", "def f():\n    return open('{S}').read()", every("error"), None),
    ("read another process's environ", "def f():\n    return open('/proc/1/environ', 'rb').read()",
     every("error"), None),
    ("import the host project", "import lmselfplay", every("error"), None),
    ("TCP socket", "import socket\ns = socket.socket()\ns.settimeout(0.5)\n"
     "s.connect(('1.1.1.1', 80))", every("error"), None),
    ("UDP socket", "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
     ".sendto(b'x', ('8.8.8.8', 53))", every("error"), None),
    ("deep recursion", "def g(n):\n    return g(n + 1)\ng(0)", every("error"), has("RecursionError")),
    ("deep recursion, raised limit",
     "import sys\nsys.setrecursionlimit(10**8)\ndef g(n):\n    return g(n + 1) + 1\ng(0)",
     every(("timeout", "memory", "killed")), None),
    ("os._exit", "import os\nos._exit(0)", every("error"), has("before returning a result")),
    ("sys.exit", "import sys\nsys.exit(0)", every("error"), has("SystemExit")),
    ("SIGKILL to itself", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
     every("killed"), None),
    ("SIGSEGV to itself", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
     every("killed"), has("SIGSEGV")),
    ("signal to its parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
     {"full": "error", "hooks": None, "os-only": "error"}, None),
    ("signal 0 to its parent", "import os\nos.kill(os.getppid(), 0)", every("error"), None),
    # kill(-1) as the slot uid reaches no other process (Linux then reports success)
    ("kill(-1) everything", "import os, signal\nos.kill(-1, signal.SIGKILL)",
     {"full": "error", "hooks": None, "os-only": "error"}, None),
    ("signal 0 to everything", "import os\nos.kill(-1, 0)", every("error"), None),
    ("killpg its own group", "import os, signal\nos.killpg(0, signal.SIGKILL)",
     {"full": "error", "hooks": "error", "os-only": "killed"}, None),
    ("segfault via ctypes", "import ctypes\nctypes.string_at(0)",
     {"full": "error", "hooks": "error", "os-only": "killed"}, None),
    ("ctypes libc.fork", "import ctypes\nctypes.CDLL(None).fork()\nimport time\ntime.sleep(5)",
     {"full": "error", "hooks": "error", "os-only": "timeout"}, None),
    ("escape with setsid + double fork", "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
     "    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\ndef f():\n    return 1",
     every("error"), None),
    ("grandchild holds stdout open", "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n"
     "def f():\n    return 2", every("error"),
     lambda r: r.status != "ok" or r.value == 2),
    ("threads that outlive the function", "import threading, time\n"
     "def spin():\n    while True:\n        print('tick')\n        time.sleep(0.01)\n"
     "def f():\n    threading.Thread(target=spin).start()\n    return 7",
     every("ok"), lambda r: r.value == 7),
    ("too many threads", "import threading, time\ndef f():\n    for _ in range(500):\n"
     "        threading.Thread(target=time.sleep, args=(5,)).start()",
     every("error"), has("can't start new thread")),
    ("KeyboardInterrupt", "raise KeyboardInterrupt", every("error"), has("KeyboardInterrupt")),
    ("BaseException with a hostile __str__",
     "class E(BaseException):\n    def __str__(self):\n        raise E()\nraise E()",
     every("error"), None),
    ("catch-all that swallows the harness", "def f():\n    try:\n        raise SystemExit\n"
     "    except BaseException:\n        return 'survived'", every("ok"),
     lambda r: r.value == "survived"),
    ("write junk to the result channel", "import os\nos.write(3, b'{\"status\": \"ok\", \"value\": 42')\n"
     "def f():\n    return 1", every("error"), has("corrupt")),
    ("raise rlimits", "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (10**6, 10**6))",
     every("error"), None),
    ("tamper via gc", "import gc\ngc.get_objects()", {"full": "error", "hooks": "error",
                                                      "os-only": "ok"}, None),
    ("add an audit hook, then spawn", "import sys, os\nsys.addaudithook(lambda *a: None)\n"
     "os.system('touch /tmp/lmselfplay_pwned')",
     {"full": "error", "hooks": "error", "os-only": "ok"}, None),
    ("write /proc/self/mem", "open('/proc/self/mem', 'r+b')", every("error"), None),
    ("stdin is closed", "import sys\ndef f():\n    return sys.stdin.read()", every("ok"),
     lambda r: r.value == ""),
    ("syntax error", "def f(:\n", every("error"), has("SyntaxError")),
    ("null byte in source", "x = 1\x00", every("error"), None),
    ("unserializable value", "def f():\n    return (i for i in range(3))", every("error"),
     has("cannot serialize")),
    ("cyclic value", "def f():\n    a = []\n    a.append(a)\n    return a", every("error"), None),
    ("huge value", "def f():\n    return 'v' * 10**6", every("output-limit"), None),
    ("dir_fd write into site-packages", "import os\nfd = os.open('{SITE}', os.O_RDONLY | os.O_DIRECTORY)\n"
     "os.close(os.open('lmselfplay_pwned.py', os.O_CREAT | os.O_WRONLY, dir_fd=fd))",
     # the hook cannot see dir_fd; Landlock refuses the write in every mode
     every("error"), lambda r: not escaped_here(r)),
    ("native module under another name", LOAD_RENAMED + "load('_posixsubprocess')",
     {"full": "error", "os-only": "ok", "hooks": "error"}, None),
    ("renamed _posixsubprocess: a shell and a setsid survivor", SHELL_VIA_FORK_EXEC,
     {"full": "error", "os-only": "error", "hooks": "error"}, None),
    ("renamed _socket: reach a listener on the host's loopback", LOAD_RENAMED +
     "so = load('_socket')\ns = so.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {P}))",
     every("error"), lambda r: not LISTENER_HITS),
    ("abstract unix socket between tasks", LOAD_RENAMED +
     "so = load('_socket')\ns = so.socket(so.AF_UNIX, so.SOCK_STREAM)\ns.bind(b'\\0lmselfplay')",
     every("error"), None),
    ("ptrace the zygote", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "import os\nassert libc.ptrace(16, os.getppid(), 0, 0) == 0, ctypes.get_errno()",
     {"full": "error", "os-only": "error", "hooks": "error"}, None),
    ("new user namespace", "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "assert libc.unshare(0x10000000) == 0, os.strerror(ctypes.get_errno())",
     every("error"), None),
    ("list the other tasks' folders", "import os\ndef f():\n    return os.listdir('..')",
     every("error"), None),
    ("environment holds no secrets", "import os\ndef f():\n    return sorted(os.environ)",
     every("ok"), lambda r: set(r.value) <= {"PATH", "LANG", "HOME", "TMPDIR"}),
    # the zygote's scheduling and limits (assert_host_unharmed reads them back after every case)
    ("renice the zygote", "import os\nos.setpriority(os.PRIO_PROCESS, os.getppid(), 19)", every("error"), None),
    ("renice every process of the uid", "import os\nos.setpriority(os.PRIO_USER, 0, 19)", every("error"), None),
    ("renice the process group", "import os\nos.setpriority(os.PRIO_PGRP, 0, 19)", every("error"), None),
    ("SCHED_IDLE the zygote", "import os\nos.sched_setscheduler(os.getppid(), os.SCHED_IDLE, os.sched_param(0))",
     every("error"), None),
    ("pin the zygote to one CPU", "import os\nos.sched_setaffinity(os.getppid(), {0})", every("error"), None),
    ("cut the zygote's limits", "import os, resource\n"
     "resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (3, 3))", every("error"), None),
    ("renice itself", "import os\ndef f():\n    n = os.getpriority(os.PRIO_PROCESS, 0)\n"
     "    os.setpriority(os.PRIO_PROCESS, os.getpid(), min(n + 1, 19))\n"
     "    return [n, os.getpriority(os.PRIO_PROCESS, 0)]", every("ok"), lambda r: r.value[1] == min(r.value[0] + 1, 19)),
    # the host's environment through /proc, and root-only files, also where the hook is off
    ("read the host's environment", "def f():\n    return open('/proc/{H}/environ', 'rb').read()",
     every("error"), None),
]
# A case whose only expected verdict is "timeout" shows that the wall clock stops it: a short clock
# shows that as well as the default second does (and saves the suite ~20 s of spinning and sleeping).
# Every other case keeps LIMITS' second, so a program that must finish has the time it needs.
CLOCK_CASE_TIMEOUT_S = 0.3


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name,code,expected,check", BATTERY, ids=[b[0] for b in BATTERY])
def test_hostile_battery(executors, sentinel, mode, name, code, expected, check):
    if not ROOT and mode.startswith("namespaces"):
        pytest.skip("the namespaces boundary needs root (a normal user gets bwrap)")
    want = expected[COLUMN[mode]]
    if want is None:
        pytest.skip("not meaningful in this mode (see the battery table)")
    ex = executors[mode]
    code = code.replace("{S}", str(sentinel)).replace("{SITE}", SITE).replace("{P}", str(LISTENER_PORT))
    code = code.replace("{H}", str(os.getpid()))
    limit = CLOCK_CASE_TIMEOUT_S if want == "timeout" else LIMITS["timeout_s"]
    r = ex.run(code, entry="f" if "def f(" in code else None, timeout_s=limit)
    assert r.status in STATUSES
    assert r.status in (want if isinstance(want, tuple) else (want,)), (r.status, r.error, r.stderr)
    if check is not None:
        assert check(r), r
    assert r.duration_s < limit + 2
    assert_host_unharmed(executors.values(), sentinel)


# --------------------------------------------------------------------------------------------
# Protections, isolation facts and the result channel
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", BOUNDARIES)
def test_boundary_protections_and_identity(executors, mode):
    ex = executors[mode]
    for p in ("netns", "readonly-fs", "audit-hook", "rlimits", "hidden-dirs", "landlock", "seccomp"):
        assert p in ex.protections
    assert ("uid-drop" in ex.protections) == ROOT
    if mode == "bwrap":
        for p in ("userns", "pidns", "no-nested-userns"):
            assert p in ex.protections
    if mode == "namespaces":
        _assert_slot_identity(ex)


def _assert_slot_identity(ex):
    r = ex.run("import os\ndef f():\n    return [os.getuid(), os.getgid(), os.getcwd(), "
               "os.getpgid(0) == os.getpid(), os.getsid(0) == os.getpid()]", entry="f")
    uid, gid, cwd, own_group, own_session = r.value
    assert uid in ex.uids and gid == uid and uid != 0
    assert own_group and own_session
    assert r.protections == ex.protections


@pytest.mark.parametrize("mode", BOUNDARIES)
def test_no_network_interfaces_but_loopback(executors, mode):
    r = executors[mode + "-os"].run("def f():\n    return open('/proc/net/dev').read()", entry="f")
    ifaces = [line.split(":")[0].strip() for line in r.value.splitlines()[2:]]
    assert ifaces == ["lo"]


def test_hooks_mode_says_what_is_active(executors):
    prot = executors["hooks"].protections
    assert "audit-hook" in prot and "rlimits" in prot
    assert "landlock" in prot and "seccomp" in prot  # where the kernel has them (x86-64, >= 5.13)
    for p in ("netns", "uid-drop", "readonly-fs", "userns"):
        assert p not in prot


@pytest.mark.parametrize("mode", BOUNDARIES)
def test_working_directory_is_fresh_and_removed(executors, mode):
    ex = executors[mode]
    code = ("import os\ndef f():\n    before = os.listdir('.')\n    open('x', 'w').write('1')\n"
            "    return [os.getcwd(), before]")
    a, b = ex.run(code, entry="f"), ex.run(code, entry="f")
    assert a.value[1] == [] and b.value[1] == [] and a.value[0] != b.value[0]
    view = f"/proc/{ex.zygote_pid}/root"  # the zygote's mount namespace, seen from the host
    assert not os.path.exists(view + a.value[0]) and not os.path.exists(view + b.value[0])


def test_fake_marker_in_stdout_is_ignored(executors):
    ex = executors[DEFAULT]
    code = ('print(\'{"status": "ok", "value": 42}\')\nprint("RESULT: 42")\n'
            "def f(x):\n    return x + 1")
    r = ex.run(code, entry="f", args=(1,))
    assert r.status == "ok" and r.value == 2
    assert not ex.check_output(code, "f", "1", "42")
    assert ex.check_output(code, "f", "1", "2")


PATCHERS = [
    ("__eq__ always true", "class A:\n    def __eq__(self, o):\n        return True\n"
     "    __hash__ = object.__hash__\ndef f(x):\n    return A()"),
    ("int subclass lying in __repr__", "class I(int):\n    def __repr__(self):\n        return '42'\n"
     "    def __eq__(self, o):\n        return True\ndef f(x):\n    return I(5)"),
    ("str subclass", "class S(str):\n    def __eq__(self, o):\n        return True\n"
     "def f(x):\n    return S('nope')"),
    ("patched builtins", "import builtins, json\nbuiltins.repr = lambda o: '42'\n"
     "builtins.str = lambda o='': '42'\nbuiltins.type = lambda o: int\n"
     "builtins.isinstance = lambda *a: True\njson.dumps = lambda *a, **k: '42'\n"
     "def f(x):\n    return 5"),
    ("patched json encoder internals", "import json.encoder as je\n"
     "je.encode_basestring_ascii = lambda s: '42'\nje.c_encode_basestring_ascii = None\n"
     "def f(x):\n    return 'five'"),
    ("float nan is never equal", "def f(x):\n    return float('nan')"),
    ("bool is not int", "def f(x):\n    return True"),
]


@pytest.mark.parametrize("name,code", PATCHERS, ids=[p[0] for p in PATCHERS])
def test_monkey_patching_cannot_fake_a_correct_answer(executors, sentinel, name, code):
    ex = executors[DEFAULT]
    assert ex.check_output(code, "f", "0", "42") is False
    assert ex.check_output(code, "f", "0", "1") is False
    assert_host_unharmed(executors.values(), sentinel)


def test_patched_builtins_do_not_change_the_reported_value(executors):
    r = executors[DEFAULT].run(dict(PATCHERS)["patched builtins"], entry="f", args=(0,))
    assert r.status == "ok" and r.value == 5 and type(r.value) is int


def test_check_output_azr_style(executors):
    ex = executors[DEFAULT]
    code = "def f(a, b):\n    return sorted(a)[:b]"
    assert ex.check_output(code, "f", "[3, 1, 2], 2", "[1, 2]")
    assert not ex.check_output(code, "f", "[3, 1, 2], 2", "[1, 3]")
    assert not ex.check_output(code, "f", "[3, 1, 2], 2", "(1, 2)")  # types matter
    assert ex.check_output(code, "f", ([5, 4], 1), [4])
    assert ex.check_outputs([(code, "f", "[2, 1], 1", "[1]"), ("while True: pass", "f", "", "1"),
                             (code, "g", "[1], 1", "[1]")]) == [True, False, False]


def test_entry_expr_args_kwargs(executors):
    ex = executors[DEFAULT]
    r = ex.run("def f(a, *, k):\n    return {a: k, 'nested': [(1, 2.5), {b'x'}, None]}",
               entry="f", args=("key",), kwargs={"k": frozenset({1})})
    assert r.value == {"key": frozenset({1}), "nested": [(1, 2.5), {b"x"}, None]}
    assert ex.run("x = 6", expr="x * 7").value == 42
    assert ex.run("x = 6").value is None and ex.run("x = 6").status == "ok"
    r = ex.run("def g(): return 1", entry="f")
    assert r.status == "error" and "does not define" in r.error


def test_batch_keeps_order_and_isolates_tasks(executors, sentinel):
    ex = executors[DEFAULT]
    tasks = []
    for i in range(40):
        if i % 10 == 3:
            tasks.append(Program("while True: pass", timeout_s=0.3))
        elif i % 10 == 7:
            tasks.append(Program("import os\nos._exit(3)"))
        else:
            tasks.append(Program("G = []\ndef f(i):\n    G.append(i)\n    return [i, len(G)]", "f", (i,)))
    t0 = time.monotonic()
    results = ex.run_batch(tasks, progress=False)
    assert time.monotonic() - t0 < 10
    for i, r in enumerate(results):
        if i % 10 == 3:
            assert r.status == "timeout"
        elif i % 10 == 7:
            assert r.status == "error" and r.exit_code == 3
        else:
            assert r.status == "ok" and r.value == [i, 1]  # fresh process: no state carried over
    assert_host_unharmed(executors.values(), sentinel)


def test_batch_progress_bar_and_dicts(executors, capsys):
    rs = executors[DEFAULT].run_batch([{"code": "x=1", "expr": f"x + {i}"} for i in range(5)],
                                     progress=True)
    assert [r.value for r in rs] == [1, 2, 3, 4, 5]
    assert "sandbox" in capsys.readouterr().err


def test_hash_seed_fixed_and_random_reseeded(executors):
    ex = executors[DEFAULT]
    a = ex.run("def f():\n    return list({'apple', 'pear', 'fig', 'kiwi', 'plum'})", entry="f")
    b = ex.run("def f():\n    return list({'apple', 'pear', 'fig', 'kiwi', 'plum'})", entry="f")
    assert a.value == b.value  # PYTHONHASHSEED=0 in the zygote: programs are repeatable
    rnd = [ex.run("import random\ndef f():\n    return random.random()", entry="f").value
           for _ in range(3)]
    assert len(set(rnd)) == 3  # each child reseeds like a fresh interpreter would


def test_zygote_death_is_reported_and_recovered(executors, sentinel):
    ex = Executor(ExecutorConfig(**LIMITS))
    try:
        first = ex.zygote_pid
        os.kill(first, signal.SIGKILL)
        r = ex.run("def f():\n    return 1", entry="f")
        assert r.status in ("killed", "ok")
        r = ex.run("def f():\n    return 1", entry="f")
        assert r.status == "ok" and r.value == 1 and ex.zygote_pid != first
        assert_host_unharmed([ex, *executors.values()], sentinel)
    finally:
        ex.close()
    assert not leftovers(executors.values())


def test_close_kills_running_tasks(executors):
    import threading

    ex = Executor(ExecutorConfig(**{**LIMITS, "timeout_s": 30}))
    out = []
    th = threading.Thread(target=lambda: out.append(ex.run("import time\ntime.sleep(60)")))
    th.start()
    time.sleep(0.5)
    ex._proc.stdin.close()  # the host goes away: the zygote must kill its children
    th.join(timeout=10)
    assert out and out[0].status == "killed"
    ex.close()
    assert not leftovers(executors.values())


def test_config_validation():
    with pytest.raises(ValueError, match="timeout_s"):
        ExecutorConfig(timeout_s=0)
    with pytest.raises(ValueError, match="sandbox"):
        ExecutorConfig(sandbox="off")
    with pytest.raises(ValueError, match="memory_mb"):
        ExecutorConfig(memory_mb=-1)


def test_unencodable_task_is_an_error_not_a_crash(executors):
    r = executors[DEFAULT].run_batch([Program("x=1", "f", (object(),)), Program("x=1", expr="x")])
    assert r[0].status == "error" and "not runnable" in r[0].error
    assert r[1].value == 1


# --------------------------------------------------------------------------------------------
# The value codec and the parent-side comparison
# --------------------------------------------------------------------------------------------

CODEC_VALUES = [
    None, True, False, 0, -7, 2**200, 1.5, -0.0, float("inf"), float("-inf"), "", "héllo\n\"",
    "\ud800", b"\x00\xff", 3 + 4j, [], (), {}, set(), frozenset(), [1, (2, [3, {4: "a"}])],
    {(1, 2): {frozenset({1}): [None]}}, {"k": {1, 2, 3}},
]


@pytest.mark.parametrize("value", CODEC_VALUES, ids=range(len(CODEC_VALUES)))
def test_codec_roundtrip(value):
    import json

    back = decode(json.loads(make_encoder(1 << 20)(value)))
    assert values_equal(back, value) and repr(back) == repr(value)


def test_codec_nan_and_rejections():
    import json

    enc = make_encoder(100)
    assert math.isnan(decode(json.loads(enc(float("nan")))))

    class MyInt(int):
        pass

    for bad in (MyInt(3), object(), [MyInt(1)], {"a": bytearray(b"x")}):
        with pytest.raises(TypeError):
            enc(bad)
    with pytest.raises(ValueError):
        enc("x" * 200)  # larger than max_bytes
    nested = []
    for _ in range(200):
        nested = [nested]
    with pytest.raises(ValueError):
        make_encoder(1 << 20)(nested)
    for malformed in ({"q": 1}, {"a": 1, "b": 2}, {"f": "zero"}):
        with pytest.raises(ValueError):
            decode(malformed)


def test_values_equal_and_literal_args():
    assert values_equal([1, (2.0, "a")], [1, (2.0, "a")])
    assert not values_equal(1, 1.0) and not values_equal(1, True) and not values_equal([1], (1,))
    assert values_equal(0.1 + 0.2, 0.3, float_tol=1e-9) and not values_equal(0.1 + 0.2, 0.3)
    assert values_equal(float("nan"), float("nan"))
    assert parse_literal_args("[1, 2], 'a'") == ([1, 2], "a")
    assert parse_literal_args("5") == (5,) and parse_literal_args("") == ()
    with pytest.raises(ValueError):
        parse_literal_args("__import__('os').system('x')")


def test_exec_result_fields():
    r = ExecResult("ok", value=1)
    assert r.ok and r.stdout == "" and r.protections == ()


@pytest.mark.parametrize("mode", BOUNDARIES)
def test_host_sockets_and_private_dirs_are_hidden(executors, mode):
    # Landlock refuses listing the scratch tree's ancestors (/dev, /dev/shm): list the rest
    code = ("import os\ndef f():\n    return [sorted(os.listdir(p)) for p in "
            "('/run', '/tmp', '/home', '/root')]")
    ex = executors[mode + "-os"]
    r = ex.run(code, entry="f")
    assert r.status == "ok", r.error
    run, tmp, home, root = r.value
    # only what leads to the interpreter (e.g. a venv inside a checkout under /tmp) is
    # bound back; everything else in these folders is hidden
    import sys
    from pathlib import Path

    def leading(folder):
        out = set()
        for p in {sys.prefix, sys.base_prefix, os.path.realpath(sys.executable), *sys.path}:
            p = Path(os.path.realpath(p)) if p else None
            if p is not None and Path(folder) in p.parents:
                out.add(p.relative_to(folder).parts[0])
        return out

    assert run == []
    assert set(tmp) <= leading("/tmp") and set(home) <= leading("/home")
    assert set(root) <= leading("/root") | {".pyenv"}


def test_touching_memory_bomb_is_memory_not_host_oom(executors, sentinel):
    # Pages really written (not just reserved): RLIMIT_AS stops it before the host notices.
    # Its own executor with a roomy CPU limit: writing 512 MB of pages can take more than
    # the battery's 1 CPU-second on a busy machine, and then the CPU limit would win the race.
    with Executor(ExecutorConfig(**{**LIMITS, "cpu_s": 15, "timeout_s": 20})) as ex:
        r = ex.run("x = []\nwhile True:\n    x.append(' ' * 10**7)")
    assert r.status == "memory", (r.status, r.error)
    assert_host_unharmed(executors.values(), sentinel)


@pytest.mark.parametrize("mode", BOUNDARIES)
def test_concurrent_tasks_cannot_read_each_other(executors, mode):
    ex = executors[mode + "-os"]  # no audit hook: Landlock, uids and unguessable names hold
    writer = ("import os, time\nopen('secret', 'w').write('s3cr3t')\ntime.sleep(0.6)\n"
              "def f():\n    return os.path.basename(os.getcwd())")
    thief = ("import os, time\ntime.sleep(0.2)\ndef f():\n    found = []\n"
             "    for i in range(1, 5000):\n        try:\n"
             "            found.append(open(f'../t{i}/secret').read())\n"
             "        except OSError:\n            pass\n"
             "    try:\n        listing = os.listdir('..')\n    except OSError:\n"
             "        listing = None\n    return [found, listing]")
    a, b = ex.run_batch([Program(writer, "f"), Program(thief, "f")], progress=False)
    assert a.status == "ok" and b.status == "ok", (a.error, b.error)
    assert b.value == [[], None]


# --------------------------------------------------------------------------------------------
# A result value built to be slow to rebuild, and the host's secrets
# --------------------------------------------------------------------------------------------

# writes on its channel a set of 40,000 distinct ints that all hash alike (multiples of the int
# hash modulus): ~0.9 MB, under max_value_bytes; rebuilt naively on the host, ~100 s of one thread
COLLIDING_SET = ("import os\nm = (1 << 61) - 1\n"
                 "os.write(3, ('{\"status\":\"ok\",\"value\":{\"s\":[' + ','.join(str(i * m) for i in range(1, 40001))"
                 " + ']}}').encode())\nos._exit(0)")


@pytest.mark.parametrize("mode", list(MODES))
def test_a_hostile_result_value_does_not_stall_the_batch(mode):
    if not ROOT and mode.startswith("namespaces"):
        pytest.skip("the namespaces boundary needs root")
    tasks = [Program(COLLIDING_SET)] + [Program("def f(x):\n    return {x, x + 1}", entry="f", args=(i,))
                                        for i in range(6)]
    with Executor(ExecutorConfig(**{**LIMITS, "max_value_bytes": 1 << 20}, **MODES[mode])) as ex:
        t0 = time.monotonic()
        results = ex.run_batch(tasks)
        took = time.monotonic() - t0
    assert results[0].status == "error" and "share a hash value" in results[0].error
    assert [r.value for r in results[1:]] == [{i, i + 1} for i in range(6)]
    assert took < 2 * LIMITS["timeout_s"], took  # the issue's bound: 2x the slowest task's timeout


def test_decode_is_linear_for_colliding_hashes():
    m = (1 << 61) - 1
    with pytest.raises(ValueError, match="share a hash value"):
        decode({"s": [i * m for i in range(1, 40001)]})
    with pytest.raises(ValueError, match="share a hash value"):
        decode({"d": [[i * m, 0] for i in range(1, 40001)]})
    with pytest.raises(ValueError, match="share a hash value"):
        decode({"z": [1] * 100})  # a repeated element: the encoder never writes one
    assert decode({"s": [-1, -2, {"t": [1, 2]}]}) == {-1, -2, (1, 2)}  # hash(-1) == hash(-2): a few alike are fine


@pytest.mark.parametrize("mode", list(MODES))
def test_no_secret_of_the_host_reaches_a_task(mode, monkeypatch):
    """A secret in the host's environment when the sandbox starts: in no mode (the hook on or
    off) does a task see it, in its environment or through /proc."""
    if not ROOT and mode.startswith("namespaces"):
        pytest.skip("the namespaces boundary needs root")
    secret = "hf_secret_0123456789abcdef"
    monkeypatch.setenv("HF_TOKEN", secret)
    code = ("import os\ndef f():\n    seen = [repr(dict(os.environ))]\n"
            "    for pid in [os.getppid(), {H}, 1]:\n"
            "        for name in ('environ', 'cmdline'):\n"
            "            try:\n                seen.append(open(f'/proc/{pid}/{name}', 'rb').read().decode('latin-1'))\n"
            "            except OSError as e:\n                seen.append(type(e).__name__)\n"
            "    return seen").replace("{H}", str(os.getpid()))
    for audit_hook in (True, False):
        with Executor(ExecutorConfig(**LIMITS, **{**MODES[mode], "audit_hook": audit_hook})) as ex:
            r = ex.run(code, entry="f")
        assert r.status == "ok", r.error
        assert not any(secret in s for s in r.value), r.value


def test_the_docs_battery_table_is_this_battery():
    """docs/sandbox.md's battery table has a row per case, with the verdict this test expects
    in each column (namespaces and bwrap: full; the OS layer alone; unsafe-hooks-only)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "sandbox.md").read_text()
    rows = {cells[0]: cells[1:] for line in text.splitlines() if line.startswith("| ")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    for name, _, expected, _ in BATTERY:
        assert name in rows, name
        for column, cell in zip(("full", "full", "os-only", "hooks"), rows[name]):
            want = expected[column]
            shown = "n/a" if want is None else "held (" + ("/".join(want) if isinstance(want, tuple) else want) + ")"
            assert cell == shown, (name, column, cell, shown)
