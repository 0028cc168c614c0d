"""Run untrusted, model-written Python in a sandbox and compare its result in the parent.

    from lmselfplay.verifiers.executor import Executor, ExecutorConfig

    with Executor(ExecutorConfig(timeout_s=2)) as ex:
        r = ex.run("def f(x):\\n    return x * 2", entry="f", args=(21,))
        r.status, r.value            # 'ok', 42
        ex.check_output("def f(a, b): return a + b", "f", "1, 2", "3")   # True
        ex.run_batch([Program(code, entry="f", args=(i,)) for i in range(1000)])

One trusted zygote process (``sandbox_worker.py``) sets up the boundary once and forks a
fresh child per task; see that module and ``docs/sandbox.md`` for what is guaranteed.
Boundaries (``ExecutorConfig.sandbox``): ``namespaces`` (root), ``bwrap`` (bubblewrap, any
user), ``auto`` (the first of those that works, else :class:`SandboxError`), and the
explicit opt-in ``unsafe-hooks-only``.

The verdict rule: **a child sends data, never a verdict.** Its result channel (fd 3)
carries the value it returned or the error it raised; the host decides the status from
what the zygote observed (a limit it enforced, how the process ended) and only then that
message, parsed here (malformed -> ``error``, for that task alone). Every referee compares
the decoded data with what it holds, here. So anything a child can write on its channel
is at most the same as returning that value; the expected value never enters the child.
Values travel as canonical JSON of exact built-in types and are decoded here into plain
built-ins, so ``__eq__`` overrides or patched builtins in the program change nothing.
"""

from __future__ import annotations

import ast
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lmselfplay.utils.config import Config, ConfigError
from lmselfplay.utils.errors import UserError
from lmselfplay.verifiers import sandbox_worker
from lmselfplay.verifiers.sandbox_worker import decode

WORKER = os.path.abspath(sandbox_worker.__file__)
STATUSES = ("ok", "error", "timeout", "memory", "output-limit", "killed")
SANDBOXES = ("auto", "namespaces", "bwrap", "unsafe-hooks-only")
MAX_WORKERS = 1024  # tasks at once (each holds one uid of the block claimed as root)
CHILD_STATUSES = ("ok", "error", "memory", "output-limit")  # what a result message may say
SCRATCH_PREFIX = "lmselfplay-sandbox-"
REASONS = {"output-limit": "output limit exceeded",
           "killed": "sandbox shut down"}

DEFAULT_PREIMPORT = (
    "collections", "itertools", "functools", "math", "re", "heapq", "bisect", "string",
    "random", "typing", "dataclasses", "copy", "operator", "datetime", "fractions",
    "decimal", "statistics", "json", "traceback", "tempfile", "textwrap", "enum", "abc",
)
HIDDEN_PATHS = ("/root", "/home", "/tmp", "/var/tmp", "/dev/shm", "/run", "/srv", "/mnt", "/media", "/opt")


@dataclass
class ExecutorConfig(Config):
    """Limits and policy; the defaults are the safe choice. A recipe that runs programs parses
    it as its ``executor`` part (one flag per field).

    ``"auto"`` switches use the protection when the platform allows it and fall back
    otherwise; ``ExecResult.protections`` / ``Executor.protections`` say what was active.
    """

    _argument_group_name = "executor (lmselfplay.verifiers.executor.ExecutorConfig)"
    timeout_s: float = field(default=5.0, metadata={
        "help": "wall clock per program; the whole process group is killed at the limit"})
    cpu_s: float | None = field(default=None, metadata={
        "help": "CPU seconds per program (RLIMIT_CPU, rounded up to whole seconds; default: max(1, timeout_s))"})
    memory_mb: int = field(default=1024, metadata={"help": "memory per program (RLIMIT_AS; 0 disables the limit)"})
    max_output_bytes: int = field(default=64 * 1024, metadata={
        "help": "stdout and stderr together per program; past it the program is killed (output-limit)"})
    max_value_bytes: int = field(default=1024 * 1024, metadata={"help": "a program's serialized return value"})
    max_file_bytes: int = field(default=1024 * 1024, metadata={
        "help": "the largest file a program may write (RLIMIT_FSIZE)"})
    max_open_files: int = field(default=64, metadata={"help": "open files per program (RLIMIT_NOFILE)"})
    max_threads: int = field(default=32, metadata={
        "help": "RLIMIT_NPROC of a program's slot uid (threads count too; only where uids are dropped)"})
    max_workers: int = field(default=2, metadata={"help": "sandbox processes running programs at once"})
    sandbox: str = field(default_factory=lambda: os.environ.get("LMSELFPLAY_SANDBOX", "auto"), metadata={
        "help": f"the OS boundary, one of {', '.join(SANDBOXES)} (docs/sandbox.md; default: $LMSELFPLAY_SANDBOX, "
                "else auto); unsafe-hooks-only is the explicit opt-in to run model-written code where none is available"})
    audit_hook: bool = field(default=True, metadata={
        "help": "refuse fork, exec, sockets, ctypes and writes outside the working folder at the Python level"})
    restrict_reads: bool = field(default=True, metadata={
        "help": "the audit hook allows reads only under sys.path and the working folder"})
    allow_ctypes: bool = field(default=False, metadata={"help": "let programs import ctypes"})
    hidden_paths: list[str] = field(default_factory=lambda: list(HIDDEN_PATHS), metadata={
        "help": "folders hidden from programs"})
    hide_host_cwd: bool = field(default=True, metadata={"help": "also hide the folder the host process runs in"})
    scratch_mb: int = field(default=256, metadata={"help": "size of the tmpfs holding all working folders"})
    python: str = field(default=sys.executable, metadata={"help": "the interpreter that runs the programs"})
    hash_seed: int | None = field(default=0, metadata={
        "help": "PYTHONHASHSEED of the zygote, so set orders repeat across runs (none: random)"})
    preimport: list[str] = field(default_factory=lambda: list(DEFAULT_PREIMPORT), metadata={
        "help": "modules imported once in the zygote (speed)"})
    uid_base: int = field(default=1_500_000_000, metadata={"help": "first uid of the block the slots run as"})
    uid_lock_dir: str = field(default="/tmp/lmselfplay-sandbox-uids", metadata={
        "help": "folder of the locks that claim the uid blocks"})
    progress_min: int = field(default=200, metadata={
        "help": "run_batch shows a progress bar from this many programs"})

    def validate(self) -> None:
        """Every limit and the boundary's name, checked when the config is built (a recipe
        builds its executor's config while it parses its own, before any model loads): a
        one-line ConfigError naming the field, or ``LMSELFPLAY_SANDBOX`` when the value came
        from there. ``cpu_s`` left out is ``max(1, timeout_s)``."""
        if self.cpu_s is None and isinstance(self.timeout_s, (int, float)):
            self.cpu_s = max(1.0, self.timeout_s)
        for name in ("timeout_s", "cpu_s", "max_output_bytes", "max_value_bytes",
                     "max_file_bytes", "max_open_files", "max_threads", "max_workers",
                     "scratch_mb"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"ExecutorConfig.{name} must be a positive number, got {v!r}")
        if not isinstance(self.memory_mb, int) or isinstance(self.memory_mb, bool) or self.memory_mb < 0:
            raise ConfigError(f"ExecutorConfig.memory_mb must be an int >= 0 (0 disables the limit), got {self.memory_mb!r}")
        if self.max_workers > MAX_WORKERS:
            raise ConfigError(f"the executor's worker count (max_workers) must be <= {MAX_WORKERS}, "
                              f"got {self.max_workers}")
        if self.sandbox not in SANDBOXES:
            where = "LMSELFPLAY_SANDBOX" if self.sandbox == os.environ.get("LMSELFPLAY_SANDBOX") else "sandbox"
            raise ConfigError(f"{where}: unknown sandbox {self.sandbox!r}; known: {', '.join(SANDBOXES)}")


@dataclass
class Program:
    """One program to run: call ``entry(*args, **kwargs)`` or evaluate ``expr`` after ``code``."""

    code: str
    entry: str | None = None
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] | None = None
    expr: str | None = None
    timeout_s: float | None = None


@dataclass
class ExecResult:
    status: str  # one of STATUSES
    stdout: str = ""
    stderr: str = ""
    value: Any = None  # decoded plain built-ins (only when status == "ok")
    value_repr: str | None = None  # repr(value) computed by the parent
    error: str | None = None
    traceback: str | None = None
    duration_s: float = 0.0
    cpu_s: float | None = None
    exit_code: int | None = None
    protections: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class SandboxError(UserError, RuntimeError):
    """The sandbox itself could not start (not raised for anything a program does)."""


def _encode_arg(value: Any) -> Any:
    return json.loads(sandbox_worker.make_encoder(1 << 30)(value))


def parse_literal_args(text: str) -> tuple:
    """AZR-style input text ``"[1, 2], 'a'"`` -> tuple of arguments (literals only, parent side)."""
    try:
        value = ast.literal_eval(f"({text},)") if text.strip() else ()
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        raise ValueError(f"input is not a Python literal argument list: {text[:80]!r}") from e
    return tuple(value)


def values_equal(a: Any, b: Any, float_tol: float = 0.0) -> bool:
    """Structural equality of plain built-ins with exact types (1 != 1.0 != True, [] != ())."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or (float_tol > 0 and math.isclose(a, b, rel_tol=float_tol, abs_tol=float_tol))
    if isinstance(a, complex):
        return values_equal(a.real, b.real, float_tol) and values_equal(a.imag, b.imag, float_tol)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(values_equal(x, y, float_tol) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k], float_tol) for k in a)
    return a == b  # int, str, bytes, bool, None, set, frozenset of hashable built-ins


# what bubblewrap gives the zygote (bwrap_argv): the host reports it, the zygote adds its own
BWRAP_PROTECTIONS = ("userns", "netns", "pidns", "ipcns", "readonly-fs", "tmpfs-scratch",
                     "hidden-dirs", "no-nested-userns", "die-with-parent")
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")


def resolve_boundary(requested: str) -> str:
    """``auto``: ``namespaces`` as root (one uid per slot), else ``bwrap`` when bubblewrap
    can create its namespaces here; without either, refuse (SandboxError, one line) --
    ``unsafe-hooks-only`` must be asked for by name."""
    if requested in ("namespaces", "unsafe-hooks-only"):
        if requested == "namespaces" and os.geteuid() != 0:
            raise SandboxError("sandbox 'namespaces' needs root; use sandbox: bwrap (bubblewrap)")
        return requested
    if requested == "auto" and os.geteuid() == 0:
        return "namespaces"
    problem = bwrap_problem()
    if problem:
        raise SandboxError(f"no OS sandbox boundary for model-written code: {problem}; install "
                           "bubblewrap (apt-get install bubblewrap) or, knowing it is unsafe, set "
                           "sandbox: unsafe-hooks-only")
    return "bwrap"


_BWRAP_PROBLEM: dict[str, str] = {}


def bwrap_problem() -> str:
    """Why bubblewrap cannot be used here ('' when it can); probed once per process."""
    if "v" not in _BWRAP_PROBLEM:
        exe = shutil.which("bwrap")
        if exe is None:
            _BWRAP_PROBLEM["v"] = "bubblewrap (bwrap) is not installed"
        else:
            probe = subprocess.run(
                [exe, "--unshare-all", "--unshare-user", "--disable-userns", "--ro-bind", "/", "/",
                 "/bin/true"], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
            err = probe.stderr.strip().splitlines()
            _BWRAP_PROBLEM["v"] = "" if probe.returncode == 0 else (
                f"bwrap cannot create its namespaces here ({err[-1] if err else probe.returncode})")
    return _BWRAP_PROBLEM["v"]


def bwrap_argv(cfg: ExecutorConfig, scratch: str, hidden: Sequence[str], info_fd: int,
               as_uid: int | None) -> list[str]:
    """The bubblewrap command around the zygote.

    New user (no nested ones), network, pid, ipc, uts, cgroup namespaces; the host
    read-only; only the devices in :data:`DEVICES`; the hidden directories empty, with the
    Python installation bound back read-only; a private, size-limited tmpfs as scratch;
    the zygote is pid 1 (no process inside can signal it to death), dies with the host,
    and runs in its own session with no capabilities. ``as_uid``: root runs bwrap as this
    unprivileged uid (:func:`root_launcher`), so root-only files stay unreadable."""
    needed = python_paths(cfg.python) + [WORKER]
    hide = {os.path.realpath(h) for h in hidden if os.path.isdir(h)}
    argv = root_launcher(as_uid, scratch, needed) if as_uid is not None else []
    argv += ["bwrap", "--unshare-user", "--unshare-net", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--disable-userns", "--die-with-parent",
            "--new-session", "--as-pid-1", "--cap-drop", "ALL", "--info-fd", str(info_fd),
            "--ro-bind", "/", "/", "--tmpfs", "/dev"]
    for dev in DEVICES:
        if os.path.exists(dev):
            argv += ["--dev-bind", dev, dev]
    argv += ["--proc", "/proc"]
    for h in _outermost(hide):
        inside = [p for p in needed if p == h or p.startswith(h + "/")]
        if h in inside:  # a needed directory itself: it stays visible
            continue
        argv += ["--tmpfs", h]
        for p in inside:
            argv += ["--ro-bind", p, p]
    argv += ["--perms", "0700", "--size", str(int(cfg.scratch_mb) << 20), "--tmpfs", scratch,
             "--chdir", "/", "--"]
    return argv


def _outermost(dirs: Iterable[str]) -> list[str]:
    dirs = set(dirs)
    return sorted(d for d in dirs if not any(d.startswith(o + "/") for o in dirs))


def root_launcher(uid: int, scratch: str, needed: Sequence[str]) -> list[str]:
    """As root: ``unshare --mount`` (a private view for bwrap only), where every directory
    on the way to ``needed`` that an unprivileged uid cannot enter is covered by an
    enterable tmpfs with the needed paths bound back; then ``setpriv`` to ``uid`` with no
    capabilities, and bwrap. Staging binds live in the (host-owned) scratch folder."""
    blocked = set()
    for p in needed:
        parts = p.strip("/").split("/")
        blocked |= {a for a in ("/" + "/".join(parts[:k]) for k in range(1, len(parts) + 1))
                    if not os.stat(a).st_mode & 0o001 and os.path.isdir(a)}
    lines = ["set -e"]
    for k, a in enumerate(_outermost(blocked)):
        inside = [p for p in needed if p.startswith(a + "/")]
        stage = [f"{scratch}/expose{k}-{j}" for j in range(len(inside))]
        for p, st in zip(inside, stage):
            lines.append(f"mkdir -p {shlex.quote(st)} && mount --rbind {shlex.quote(p)} {shlex.quote(st)}")
        lines.append(f"mount -t tmpfs -o mode=0755,size=1m tmpfs {shlex.quote(a)}")
        for p, st in zip(inside, stage):
            lines.append(f"mkdir -p {shlex.quote(p)} && mount --rbind {shlex.quote(st)} {shlex.quote(p)}")
    lines.append('exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
            "\n".join(lines), "sh", "setpriv", f"--reuid={uid}", f"--regid={uid}",
            "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--"]


_PYTHON_PATHS: dict[str, list[str]] = {}


def python_paths(python: str) -> list[str]:
    """Directories the zygote's interpreter needs: its prefixes and ``sys.path`` under -I."""
    if python not in _PYTHON_PATHS:
        code = "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, *sys.path]))"
        out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=60, check=True).stdout
        paths = [os.path.realpath(p) for p in json.loads(out) if p]
        paths.append(os.path.dirname(os.path.realpath(python)))
        _PYTHON_PATHS[python] = sorted({p for p in paths if os.path.isdir(p)})
    return _PYTHON_PATHS[python]


def remove_stale_scratch(root: str = "/dev/shm") -> list[str]:
    """Remove the scratch folders of executors whose host process is gone (killed -9, say):
    ``lmselfplay-sandbox-<pid>-*`` owned by us whose ``<pid>`` no longer exists. A live
    owner's folder, another user's, or a name of another form is left alone."""
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        pid_text = name[len(SCRATCH_PREFIX):].split("-", 1)[0] if name.startswith(SCRATCH_PREFIX) else ""
        path = os.path.join(root, name)
        if not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        try:
            if os.lstat(path).st_uid != os.geteuid():
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Executor:
    """A pool of one-shot sandboxed processes behind one trusted zygote. Thread-safe."""

    def __init__(self, config: ExecutorConfig | None = None):
        self.config = config or ExecutorConfig()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._scratch: str | None = None
        self._uid_lock: int | None = None
        self.protections: tuple[str, ...] = ()
        self.zygote_pid: int | None = None
        self._next_id = 0
        self._start()

    # -- lifecycle -------------------------------------------------------------------------
    def _start(self) -> None:
        cfg = self.config
        boundary = resolve_boundary(cfg.sandbox)
        remove_stale_scratch()
        # /dev/shm (tmpfs) when usable: cheap to create and remove directories in; the
        # sandbox mounts a private tmpfs over it anyway. The name carries our pid so that a
        # later start can tell a dead host's folder from a live one's.
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self._scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=shm)
        hidden = list(cfg.hidden_paths)
        if cfg.hide_host_cwd and os.getcwd() != "/":
            hidden.append(os.getcwd())
        wcfg = asdict(cfg)
        wcfg.update(scratch_dir=self._scratch, hidden_paths=hidden, preimport=list(cfg.preimport),
                    boundary=boundary, outer_protections=list(BWRAP_PROTECTIONS))
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        if cfg.hash_seed is not None:
            env["PYTHONHASHSEED"] = str(cfg.hash_seed)
        argv: list[str] = []
        info_r = info_w = as_uid = None
        keep: list[int] = []
        if boundary == "bwrap":
            if os.geteuid() == 0:  # root runs bwrap as an unprivileged uid of its own
                self._uid_lock, uids = sandbox_worker.claim_uid_block(
                    {"uid_lock_dir": cfg.uid_lock_dir, "max_workers": 1, "uid_base": cfg.uid_base})
                as_uid = uids[0]
                wcfg["outer_protections"].append("uid-drop")
            info_r, info_w = os.pipe()
            argv = bwrap_argv(cfg, self._scratch, hidden, info_w, as_uid)
            keep.append(info_w)
        argv += [cfg.python, "-I", WORKER, json.dumps(wcfg)]
        try:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd="/",
                close_fds=True, pass_fds=keep, start_new_session=True)
        finally:
            for fd in keep:
                os.close(fd)
        line = self._proc.stdout.readline()
        try:
            hello = json.loads(line)
        except ValueError:
            hello = {"ready": False, "error": f"unreadable greeting {line[:200]!r}"}
        if info_r is not None:
            with os.fdopen(info_r) as f:
                info = f.read() if hello.get("ready") else ""
        if not hello.get("ready"):
            self.close()
            raise SandboxError(f"sandbox ({boundary}) failed to start: {hello.get('error')}")
        self.boundary = boundary
        self.protections = tuple(hello["protections"])
        # the zygote's pid as the host sees it (inside bwrap's pid namespace it is 1)
        self.zygote_pid = json.loads(info)["child-pid"] if info_r is not None else hello["pid"]
        self.uids = tuple(hello["uids"] or ())

    @property
    def process_ids(self) -> tuple[int, ...]:
        """Host pids of the sandbox's own long-lived processes (launcher, zygote)."""
        if self._proc is None:
            return ()
        return tuple(sorted({self._proc.pid, self.zygote_pid}))

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        lock, self._uid_lock = self._uid_lock, None
        if lock is not None:
            os.close(lock)

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- running ---------------------------------------------------------------------------
    def run(self, code: str, entry: str | None = None, args: Sequence[Any] = (),
            kwargs: dict[str, Any] | None = None, expr: str | None = None,
            timeout_s: float | None = None) -> ExecResult:
        return self.run_batch([Program(code, entry, args, kwargs, expr, timeout_s)], progress=False)[0]

    def run_batch(self, tasks: Iterable[Program | dict], progress: bool | None = None) -> list[ExecResult]:
        """Run many tasks with bounded concurrency; results come back in input order."""
        tasks = [t if isinstance(t, Program) else Program(**t) for t in tasks]
        if not tasks:
            return []
        results: list[ExecResult | None] = [None] * len(tasks)
        lines = []
        base = self._next_id
        self._next_id += len(tasks)
        for i, t in enumerate(tasks):
            try:
                msg = {"id": base + i, "code": str(t.code), "entry": t.entry, "expr": t.expr,
                       "args": [_encode_arg(a) for a in t.args],
                       "kwargs": {str(k): _encode_arg(v) for k, v in (t.kwargs or {}).items()},
                       "timeout_s": t.timeout_s}
                lines.append(json.dumps(msg, ensure_ascii=False).encode("utf-8", "surrogatepass"))
            except (TypeError, ValueError) as e:
                results[i] = ExecResult("error", error=f"task not runnable: {e}",
                                        protections=self.protections)
        show = progress if progress is not None else len(tasks) >= self.config.progress_min
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self.close()
                self._start()
            self._exchange(lines, results, base, show)
        return results  # type: ignore[return-value]

    def _exchange(self, lines: list[bytes], results: list, base: int, show: bool) -> None:
        proc = self._proc
        expected = sum(r is None for r in results)

        def writer():
            try:
                for line in lines:
                    proc.stdin.write(line + b"\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

        th = threading.Thread(target=writer, daemon=True)
        th.start()
        bar = None
        if show:
            from tqdm.auto import tqdm

            bar = tqdm(total=expected, desc="sandbox", unit="task")
        got = 0
        try:
            while got < expected:
                line = proc.stdout.readline()
                if not line:
                    break
                msg = json.loads(line)
                i = msg["id"] - base
                if 0 <= i < len(results) and results[i] is None:
                    results[i] = self._to_result(msg)
                    got += 1
                    if bar is not None:
                        bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            if got < expected:  # zygote died or we were interrupted: drop it with its work
                self.close()
            th.join(timeout=5)
        if got < expected:  # never hand back a half-batch silently
            for i, r in enumerate(results):
                if r is None:
                    results[i] = ExecResult("killed", error="sandbox worker died",
                                            protections=self.protections)

    def _to_result(self, msg: dict) -> ExecResult:
        """The status, decided here (see the module docstring): what the zygote observed
        first (a limit it enforced, a signal), then the child's result message, which is
        data -- a value, or the error it raised -- parsed here, malformed -> ``error``."""
        r = ExecResult("error", stdout=msg.get("stdout", ""), stderr=msg.get("stderr", ""),
                       duration_s=msg.get("duration_s", 0.0), cpu_s=msg.get("cpu_s"),
                       exit_code=msg.get("exit_code"), protections=self.protections)
        reason, code = msg.get("reason"), msg.get("exit_code")
        if reason is not None:
            r.status = reason if reason in STATUSES else "error"
            r.error = REASONS.get(reason, msg.get("error")) or "sandbox error"
            if reason == "timeout":
                r.error = f"wall time limit {msg.get('timeout_s')}s exceeded"
            return r
        if msg.get("result_too_large"):
            r.status, r.error = "output-limit", "result channel over max_value_bytes"
            return r
        if msg.get("result") is not None:
            return self._child_message(r, msg["result"])
        sig = -code if isinstance(code, int) and code < 0 else None
        if sig is not None:
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and (r.cpu_s or 0.0) >= self.config.cpu_s):
                r.status, r.error = "timeout", f"CPU limit {self.config.cpu_s}s exceeded"
            else:
                r.status, r.error = "killed", f"killed by signal {signal.Signals(sig).name}"
            return r
        r.error = f"process exited with code {code} before returning a result"
        return r

    def _child_message(self, r: ExecResult, text: str) -> ExecResult:
        try:
            m = json.loads(text)
            if not isinstance(m, dict) or m.get("status") not in CHILD_STATUSES:
                raise ValueError("not a result message")
            if m["status"] == "ok":
                if "value" not in m:
                    raise ValueError("no value")
                r.value = decode(m["value"])
                r.value_repr = repr(r.value)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as e:
            r.status, r.value, r.error = "error", None, f"sandbox: corrupt result channel ({str(e)[:80]})"
            return r
        r.status = m["status"]
        if r.status != "ok":
            r.error = str(m.get("error"))[:4000] if m.get("error") is not None else r.status
            tb = m.get("traceback")
            r.traceback = tb[-8000:] if isinstance(tb, str) else None
        return r

    # -- grading ---------------------------------------------------------------------------
    def check_output(self, code: str, func_name: str, input: str | Sequence[Any],
                     expected: Any, float_tol: float = 0.0) -> bool:
        """Does ``func_name(*input)`` return ``expected``? Decided here, on decoded data.

        ``input`` / ``expected`` may be Python literal text (AZR style: ``"[1, 2], 3"``).
        """
        return self.check_outputs([(code, func_name, input, expected)], float_tol)[0]

    def check_outputs(self, cases: Sequence[tuple[str, str, Any, Any]], float_tol: float = 0.0,
                      progress: bool | None = None) -> list[bool]:
        tasks, wants = [], []
        for code, func_name, inp, expected in cases:
            args = parse_literal_args(inp) if isinstance(inp, str) else tuple(inp)
            if isinstance(expected, str):
                expected = ast.literal_eval(expected)
            tasks.append(Program(code, entry=func_name, args=args))
            wants.append(expected)
        results = self.run_batch(tasks, progress=progress)
        return [r.ok and values_equal(r.value, w, float_tol) for r, w in zip(results, wants)]
