"""max_staleness: 0 is the plain loop, k >= 1 generates one step ahead and drops what is too old."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.overlap import OverlappedRollouts, drop_stale
from lmselfplay.utils.config import ConfigError


def _loop(max_staleness, steps=4, gen_s=0.0, train_s=0.0, lag=0):
    """A loop whose 'trainer' version is the step count; generation samples at the version last
    synced (minus ``lag``: an engine deliberately left behind)."""
    state = {"trainer": 0, "engine": 0}
    log = []

    def generate(step):
        log.append(("gen", step, threading.current_thread() is threading.main_thread()))
        time.sleep(gen_s)
        return [Sample([1], [2], [-1.0], policy_version=state["engine"] - lag) for _ in range(3)]

    def sync():
        log.append(("sync", state["trainer"]))
        state["engine"] = state["trainer"]

    r = OverlappedRollouts(generate, max_staleness, SimpleNamespace(shares_module=False), sync=sync)
    out = []
    t0 = time.perf_counter()
    for step in range(steps):
        samples, m = r.next_batch(step, state["trainer"], last_step=steps - 1)
        out.append((len(samples), m))
        time.sleep(train_s)
        state["trainer"] += 1
    r.close()
    return log, out, time.perf_counter() - t0, r


def test_zero_is_the_plain_loop():
    log, out, _, _ = _loop(0)
    assert log == [x for s in range(4) for x in (("sync", s), ("gen", s, True))]  # in the caller, in order
    assert all(n == 3 and m == {} for n, m in out)


def test_one_overlaps_generation_with_training_and_keeps_one_step_old_rollouts():
    log, out, wall, _ = _loop(1, steps=5, gen_s=0.15, train_s=0.15)
    assert [x for x in log if x[0] == "gen"][1:] == [("gen", s, False) for s in range(1, 5)]  # background
    assert [n for n, _ in out] == [3] * 5 and all(m["staleness/dropped"] == 0 for _, m in out)
    assert [m["staleness/age"] for _, m in out][1:] == [1.0] * 4
    assert wall < 5 * 0.3 * 0.8  # overlapped: well under generation + training in series


def test_rollouts_older_than_k_are_dropped_and_counted():
    _, out, _, r = _loop(1, steps=3, lag=1)  # the engine is one more version behind: age 2 > k
    assert [n for n, _ in out][1:] == [0, 0] and r.dropped == 6
    kept, m = drop_stale([Sample([1], [2], [0.0], policy_version=v) for v in (5, 4, 3)], 5, 1)
    assert [s.policy_version for s in kept] == [5, 4] and m == {"staleness/dropped": 1.0, "staleness/age": 0.5}


def test_overlap_refuses_an_engine_sharing_the_trainers_module():
    with pytest.raises(ConfigError, match="vllm-server"):
        OverlappedRollouts(lambda s: [], 1, SimpleNamespace(shares_module=True))
    with pytest.raises(ConfigError, match=">= 0"):
        OverlappedRollouts(lambda s: [], -1)


def test_a_failing_background_generation_surfaces_in_the_caller():
    def generate(step):
        if step == 1:
            raise RuntimeError("server exploded")
        return []

    r = OverlappedRollouts(generate, 1, None)
    r.next_batch(0, 0)
    with pytest.raises(RuntimeError, match="exploded"):
        r.next_batch(1, 1)
