"""Run an untrusted program so that its whole process tree dies with it, or with us.

``python process_tree.py HOST_PID -- PROGRAM ARGS...`` (what :func:`kept_command` builds) is
a keeper: it marks itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every process
PROGRAM starts, however it detaches (``setsid``, a double fork), stays its descendant; it
runs PROGRAM with its own stdin and stdout, and it kills every descendant (a ``/proc`` walk,
repeated until none is left) when

* PROGRAM exits (nothing PROGRAM left behind outlives it, and no grandchild keeps the
  host's pipe open);
* it receives SIGTERM, SIGINT or SIGHUP (how the host closes it);
* the host process dies, however it dies (SIGTERM, SIGKILL, a crash): ``PR_SET_PDEATHSIG``
  delivers SIGUSR1, which counts only when the keeper's parent has changed, because the kernel
  also sends it when the host *thread* that started the keeper ends.

Why this design: a process group or session misses a ``setsid`` grandchild; a tree walk
from the host misses a grandchild whose parent has already exited (it is re-parented to
init); ``PR_SET_PDEATHSIG`` alone covers only the direct child; a cgroup or a PID namespace
needs privileges or delegation that a normal user often lacks. A subreaper works
unprivileged on every Linux since 3.4. Not covered: a keeper killed with SIGKILL by someone
else (its descendants are then re-parented past it), programs started through another
service (``at``, ``systemd-run``, ``ssh``). Where ``prctl`` is missing (not Linux)
:func:`kept_command` returns PROGRAM unchanged and the host kills its process group.

The keeper imports only the standard library and runs with ``python -I -S`` (about 20 ms).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
KEEPER = os.path.abspath(__file__)


def supported() -> bool:
    """Whether this system has ``prctl`` subreapers and ``/proc`` (Linux)."""
    return sys.platform.startswith("linux") and os.path.isdir("/proc/self")


def kept_command(command: list[str]) -> list[str]:
    """``command`` run under a keeper tied to this process (see the module doc)."""
    if not supported():
        return list(command)
    return [sys.executable, "-I", "-S", KEEPER, str(os.getpid()), "--", *command]


def descendants(root: int) -> list[int]:
    """Every process whose parent chain reaches ``root`` (read from ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # exited while we read
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> None:
    """SIGKILL every descendant of this process and reap them. Repeats until none is left:
    a process forking while we kill leaves children that are re-parented to us (the
    subreaper) and are found by the next walk."""
    me = os.getpid()
    while pids := descendants(me):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)  # blocks until one of them is reaped
        except ChildProcessError:
            pass


class _Stop(Exception):
    pass


def keep(host: int, command: list[str]) -> int:
    """The keeper's body (see the module doc); returns its exit status."""

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    def host_gone(signum: int, frame: object) -> None:
        if os.getppid() != host:
            raise _Stop

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    signal.signal(signal.SIGUSR1, host_gone)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) or libc.prctl(PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0):
        print(f"keeper: prctl failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 126
    status = 1
    try:
        if os.getppid() != host:
            return 1  # the host died before PDEATHSIG was armed
        try:
            program = subprocess.Popen(command)
        except OSError as e:
            print(f"keeper: cannot start {command[0]!r}: {e}", file=sys.stderr)
            return 127
        while True:  # reap whatever ends (adopted orphans too) until the program does
            pid, code = os.waitpid(-1, 0)
            if pid == program.pid:
                status = os.waitstatus_to_exitcode(code)
                break
    except (_Stop, ChildProcessError):
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1])
        kill_descendants()
    return status


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: process_tree.py HOST_PID -- PROGRAM [ARGS...]")
    sys.exit(keep(int(sys.argv[1]), sys.argv[3:]))
