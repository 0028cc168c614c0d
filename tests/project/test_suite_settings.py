"""The test suite's own machinery: one torch thread per process and the longest files first
(tests/conftest.py), documented commands forked from a warm interpreter (tests/warm_process.py)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import conftest
import pytest
from warm_process import run_warm


def test_each_process_runs_the_threads_omp_num_threads_names():
    """conftest sets OMP_NUM_THREADS before anything imports torch; were torch imported first, it
    would have taken one thread per core and the xdist workers would spin against each other."""
    import torch

    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])


def test_the_longest_files_exist_and_are_collected_first(request):
    tests = Path(__file__).resolve().parents[1]
    assert all((tests / name).is_file() for name in conftest.LONGEST_FILES), conftest.LONGEST_FILES
    first = request.session.items[0].path.as_posix()
    assert first.endswith("tests/" + conftest.LONGEST_FILES[0]) or len(request.session.items) < 50, first


# --- tests/warm_process.py: a documented command forked from a warm interpreter ---------------

def _script(tmp_path, body: str) -> str:
    path = tmp_path / "cmd.py"
    path.write_text(body)
    return str(path)


def test_a_warm_command_has_its_own_argv_env_cwd_streams_and_status(tmp_path):
    script = _script(tmp_path, (
        "import atexit, os, sys\n"
        "atexit.register(lambda: open('atexit_ran', 'w').close())\n"
        "print('out', sys.argv[1:], os.environ['ONLY_HERE'], os.getcwd(), sys.path[0], sys.stdin.read() == '')\n"
        "print('err', file=sys.stderr)\n"
        "assert 'lmselfplay' not in sys.modules\n"
        "sys.exit(3)\n"))
    work = tmp_path / "work"
    work.mkdir()
    env = {"ONLY_HERE": "yes", "PATH": "/usr/bin", "OMP_NUM_THREADS": "1"}
    proc = run_warm([script, "--flag", "1"], env, work, timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == f"out ['--flag', '1'] yes {work} {tmp_path} True\n" and proc.stderr == "err\n"
    assert (work / "atexit_ran").exists()


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_command_runs_warm_only_single_threaded_and_gets_its_threads(tmp_path, threads):
    """A fork of an interpreter that imported torch runs a 2-thread OpenMP pool pathologically
    (a matmul loop 50x slower than in a fresh process), so a 2-thread command runs cold."""
    script = _script(tmp_path, "import sys, torch\nprint(torch.get_num_threads(), 'matplotlib.pyplot' in sys.modules)\n")
    proc = run_warm([script], {**os.environ, "OMP_NUM_THREADS": threads}, tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{threads} {threads == '1'}\n"  # warm: pyplot came with the preload


def test_a_warm_command_that_raises_exits_1_with_its_traceback(tmp_path):
    proc = run_warm([_script(tmp_path, "raise ValueError('bad config')\n")], dict(os.environ), tmp_path, timeout=60)
    assert proc.returncode == 1 and "ValueError: bad config" in proc.stderr


@pytest.mark.parametrize("omp", ["1", "2"], ids=["warm", "cold"])
def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path, omp):
    script = _script(tmp_path, (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "open('child_pid', 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"))
    with pytest.raises(subprocess.TimeoutExpired):
        run_warm([script], {**os.environ, "OMP_NUM_THREADS": omp}, tmp_path, timeout=1.5)
    pid = int((tmp_path / "child_pid").read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # killed; reaped by init once it is gone
            os.kill(pid, 0)
            time.sleep(0.1)
