"""The keeper of an untrusted program's process tree: the program's exit status comes back, and a
grandchild that detached (``setsid``) dies with the program instead of outliving it."""

import os
import subprocess
import sys
import time

import pytest

from lmselfplay.utils.process_tree import descendants, kept_command, supported

pytestmark = pytest.mark.skipif(not supported(), reason="needs Linux subreapers and /proc")

DETACH = ("import os, subprocess, sys, time\n"
          "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
          "print(p.pid, flush=True)\n"
          "sys.exit(3)\n")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_exit_status_comes_back_and_a_detached_grandchild_dies():
    cmd = kept_command([sys.executable, "-c", DETACH])
    assert cmd[:3] == [sys.executable, "-I", "-S"] and cmd[4:6] == [str(os.getpid()), "--"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, r.stderr
    grandchild = int(r.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_descendants_walks_the_whole_tree():
    p = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                          "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                          "print(c.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(p.stdout.readline())
        assert {p.pid, grandchild} <= set(descendants(os.getpid()))
        assert descendants(grandchild) == []
    finally:
        for pid in descendants(p.pid):
            os.kill(pid, 9)
        p.kill()
        p.wait()
