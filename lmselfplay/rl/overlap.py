"""Generation overlapped with training, under a bounded staleness (``max_staleness: 0 | 1 | k``).

``max_staleness = 0``: :meth:`OverlappedRollouts.next_batch` generates the step's rollouts there
and then, with the weights the trainer has now — strictly on-policy, the same calls in the same
order as a loop without this class (bit-identical results).

``max_staleness = k >= 1``: while step t trains, a background thread already generates the
rollouts of step t + 1 with the weights the engine serves (pushed after step t - 1, so one version
behind). A rollout sampled with weights more than k versions older than the trainer's when it is
trained on is dropped, counted and logged (``staleness/dropped``), never silently trained on;
``staleness/age`` is the mean age of the samples kept. The trainer corrects what remains
(its PPO ratio is taken against the behaviour log-probs; with ``tis_cap`` it is truncated
importance sampling, :mod:`lmselfplay.rl.importance`).

Overlap needs an engine with its own copy of the weights (a vLLM server or engine): an engine
sharing the trainer's module (HF) would sample from weights the optimizer is writing, so it is
refused. The weight push of the next step waits for the background generation's requests in
flight (the server engine's pause) — it does not interleave with a half-finished batch.

The background thread's many HTTP client threads each need the GIL briefly per request, while
the training thread holds it between its torch calls: at Python's default 5 ms switch interval
they queue behind it, and generation slowed the overlapped loop below the serial one
(benchmarks/bench_scale.py: 0.76x). With overlap on, the interpreter's switch interval is lowered
to ``SWITCH_INTERVAL_S`` (1.75x in the same benchmark).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from lmselfplay.lm.trajectory import Sample
from lmselfplay.utils.config import ConfigError

SWITCH_INTERVAL_S = 2e-4


def check_overlap(max_staleness: int, engine: Any) -> None:
    if max_staleness < 0:
        raise ConfigError(f"max_staleness must be >= 0, got {max_staleness}")
    if max_staleness > 0 and getattr(engine, "shares_module", False):
        raise ConfigError(f"max_staleness {max_staleness} overlaps generation with training, which needs an engine "
                          "with its own weights (engine: vllm-server or vllm); the hf engine shares the trainer's")


def drop_stale(samples: list[Sample], version: int, max_staleness: int) -> tuple[list[Sample], dict[str, float]]:
    """The samples at most ``max_staleness`` versions behind ``version``, and the metrics."""
    kept = [s for s in samples if version - s.policy_version <= max_staleness]
    ages = [version - s.policy_version for s in kept]
    return kept, {"staleness/dropped": float(len(samples) - len(kept)),
                  "staleness/age": sum(ages) / len(ages) if ages else 0.0}


class OverlappedRollouts:
    """``generate(step) -> samples`` (each with its ``policy_version``) run one step ahead.

    ``sync()`` pushes the trainer's current weights to the engine; it runs in the calling thread
    between two steps (never while the optimizer writes the weights), before the next step's
    generation starts. ``generate`` itself must not push."""

    def __init__(self, generate: Callable[[int], list[Sample]], max_staleness: int, engine: Any = None,
                 sync: Callable[[], None] | None = None):
        check_overlap(max_staleness, engine)
        if max_staleness > 0:
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self.generate, self.max_staleness, self.sync = generate, max_staleness, sync or (lambda: None)
        self._ahead: tuple[int, Future] | None = None
        self.dropped = 0

    def _start(self, step: int) -> None:
        future: Future = Future()

        def run():
            try:
                future.set_result(self.generate(step))
            except BaseException as e:  # surfaced by next_batch, in the main thread
                future.set_exception(e)

        threading.Thread(target=run, name=f"rollouts-step-{step}", daemon=True).start()
        self._ahead = (step, future)

    def next_batch(self, step: int, version: int, last_step: int | None = None) -> tuple[list[Sample], dict[str, float]]:
        """The rollouts to train step ``step`` on (trainer at ``version``); with overlap, the next
        step's generation starts before this returns (none after ``last_step``)."""
        if self.max_staleness == 0:
            self.sync()
            return self.generate(step), {}
        if self._ahead is not None and self._ahead[0] == step:
            samples = self._ahead[1].result()
        else:  # the first step (or a resumed run): nothing was generated ahead
            self.sync()
            samples = self.generate(step)
        self._ahead = None
        if last_step is None or step < last_step:
            self.sync()
            self._start(step + 1)
        kept, metrics = drop_stale(samples, version, self.max_staleness)
        self.dropped += int(metrics["staleness/dropped"])
        return kept, metrics

    def close(self) -> None:
        """Wait for a generation still running (its engine calls must finish before shutdown)."""
        if self._ahead is not None:
            self._ahead[1].exception()
            self._ahead = None
