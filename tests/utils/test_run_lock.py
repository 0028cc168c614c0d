"""One run per output folder: a second run is refused naming the live run's pid; a killed
run's lock (dropped by the kernel) never blocks the next run or ``--resume``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from warm_process import run_warm

from lmselfplay.utils.run import LOCK_FILE, RunLocked, lock_output_dir, release_output_dir

ROOT = Path(__file__).resolve().parents[2]
HOLD = ("import sys, time\nfrom lmselfplay.utils.run import lock_output_dir\n"
        "lock_output_dir(sys.argv[1]); print('locked', flush=True); time.sleep(120)\n")


def _hold(out):
    """A live run (another process) holding ``out``, until the generator is closed."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        yield out, p
    finally:
        p.kill()
        p.wait()


@pytest.fixture(scope="module")
def holder(tmp_path_factory):
    """One live run for the tests that only knock on its door (none writes into it or ends it)."""
    yield from _hold(tmp_path_factory.mktemp("live") / "run")


@pytest.fixture
def own_holder(tmp_path):
    """A live run of this test's own, for a test that kills it."""
    yield from _hold(tmp_path / "run")


def test_second_run_is_refused_naming_the_pid(holder):
    out, p = holder
    assert (out / LOCK_FILE).read_text().strip() == str(p.pid)
    with pytest.raises(RunLocked, match=rf"in use by a live run \(pid {p.pid}\)"):
        lock_output_dir(out)


def test_killed_runs_lock_does_not_block(own_holder):
    out, p = own_holder
    p.send_signal(signal.SIGKILL)
    p.wait()
    try:
        assert lock_output_dir(out) == out.resolve() / LOCK_FILE  # stale file, no lock: taken
        assert (out / LOCK_FILE).read_text().strip() == str(os.getpid())
        assert lock_output_dir(out) is not None  # re-entrant within one process
    finally:
        release_output_dir(out)


def test_other_ranks_do_not_lock(holder, monkeypatch):
    out, _ = holder
    monkeypatch.setenv("RANK", "1")
    assert lock_output_dir(out) is None


RECIPES = ["selfplay_games", "spin", "alphazero"]


@pytest.fixture(scope="module")
def refusals(holder):
    """Each recipe's command run against the live run (a process each, forked warm:
    tests/warm_process.py)."""
    out, _ = holder
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return {r: run_warm([str(ROOT / "recipes" / f"{r}.py"), "--output_dir", str(out)], env, ROOT, timeout=300)
            for r in RECIPES}


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_refuses_a_busy_folder(holder, refusals, recipe):
    """The command a user types: one ``error:`` line naming the pid, exit status 2."""
    out, p = holder
    err = refusals[recipe].stderr
    assert refusals[recipe].returncode == 2, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("error: ") and f"pid {p.pid}" in err
    assert sorted(x.name for x in out.iterdir()) == [LOCK_FILE]  # nothing written into the live run
