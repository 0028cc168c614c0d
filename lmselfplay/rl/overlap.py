"""Generation overlapped with training, under a bounded staleness (``max_staleness: 0 | 1 | k``).

``max_staleness = 0``: :meth:`OverlappedRollouts.next` generates the step's rollouts there and
then, with the weights the trainer has now — strictly on-policy, the same calls in the same
order as a loop without this class (bit-identical results).

``max_staleness = k >= 1``: while step t trains, a background thread already generates the
rollouts of step t + 1 with the weights the engine serves (pushed before step t trains, so one
version behind). A rollout sampled with weights more than k versions older than the trainer's
when it is trained on is dropped, counted and logged (``staleness/dropped``), never silently
trained on; ``staleness/age`` is the mean age of the samples kept. The trainer corrects what
remains (its PPO ratio is taken against the behaviour log-probs; with ``tis_cap`` it is
truncated importance sampling, :mod:`lmselfplay.rl.importance`).

Recipes reach it through :func:`rollouts_for` (``max_staleness`` lives in the engine config):
``rollouts.next(step)`` replaces the step's ``with trainer.serving(engine): generate`` and
``rollouts.keep(samples, version)`` filters what is trained on.

Under data parallelism each rank drops its own stale samples (by the versions its own
completions were sampled with); every rank calls :meth:`OverlappedRollouts.keep` at every
step, which sums the counts over the ranks (a collective), so every rank logs the same
run-wide counts. A rank left with nothing to train on while the others train is safe: the
trainer pads every rank to the same micro-batches (the forwards and backwards stay
collective-aligned, its gradient is zero, no NaN; ``tests/mp_scripts/stale_ranks.py``, DDP
and ZeRO-3 on 2 gloo ranks).

A recipe whose rollouts use several engines (R-Zero: the challenger writes, the solver
answers) serves each of them before the generation starts (``also`` in :func:`rollouts_for`).

Overlap needs an engine with its own copy of the weights (a vLLM server or engine): an engine
sharing the trainer's module (HF) would sample from weights the optimizer is writing, so it is
refused. The weight push of the next step waits for the background generation's requests in
flight (the server engine's pause) — it does not interleave with a half-finished batch.

The background generation's HTTP client threads each need the GIL briefly per request, while
the training thread holds it between its torch calls: at Python's default 5 ms switch interval
they queue behind it. With overlap on, the interpreter's switch interval is lowered to
``SWITCH_INTERVAL_S``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

from lmselfplay.lm.engines.factory import check_staleness
from lmselfplay.lm.trajectory import Sample

SWITCH_INTERVAL_S = 2e-4


def check_overlap(max_staleness: int, engine: Any) -> None:
    check_staleness(max_staleness, shares_module=getattr(engine, "shares_module", False))


def sampled(s: Sample) -> bool:
    """Whether ``s`` holds tokens an engine sampled; a supervised target (search distillation,
    exact feedback) or an empty completion was sampled by no policy and is never stale."""
    return bool(s.completion_ids) and s.target is None


def drop_stale(samples: list[Sample], version: int, max_staleness: int,
               rank_sum: Callable[[list[float]], list[float]] | None = None) -> tuple[list[Sample], dict[str, float]]:
    """The samples at most ``max_staleness`` versions behind ``version``, and the metrics
    (``staleness/age``: mean age of the sampled ones kept). With ``rank_sum`` (element-wise
    sum over the data-parallel ranks; every rank calls it) the metrics are the run's, the
    same on every rank."""
    kept = [s for s in samples if not sampled(s) or version - s.policy_version <= max_staleness]
    ages = [version - s.policy_version for s in kept if sampled(s)]
    counts = [float(len(samples) - len(kept)), float(sum(ages)), float(len(ages))]
    dropped, age_sum, n = rank_sum(counts) if rank_sum else counts
    return kept, {"staleness/dropped": dropped, "staleness/age": age_sum / n if n else 0.0}


class OverlappedRollouts:
    """A step's rollouts, generated one step ahead when ``max_staleness >= 1``.

    ``plan(step)`` runs in the calling thread (it may read the run's state: league, buffers,
    seeds) and returns ``play()``, the generation itself, which returns the step's result.
    ``serving()`` is a context manager inside which the engine serves the trainer's current
    weights (``PolicyTrainer.serving(engine)``; it pushes when the engine is behind): with
    ``max_staleness = 0`` the step is ``with serving(): plan(step)()`` — exactly the loop without
    this class. With overlap, ``serving()`` is entered (a push) in the calling thread between two
    steps (never while the optimizer writes the weights) and ``play()`` of the next step runs in a
    background thread after it; ``play`` itself must not push."""

    def __init__(self, plan: Callable[[int], Callable[[], Any]], max_staleness: int, engine: Any = None,
                 serving: Callable[[], AbstractContextManager] | None = None,
                 rank_sum: Callable[[list[float]], list[float]] | None = None):
        check_overlap(max_staleness, engine)
        self.rank_sum = rank_sum
        if max_staleness > 0:
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self.plan, self.max_staleness, self.serving = plan, max_staleness, serving or nullcontext
        self._ahead: tuple[int, Future] | None = None
        self.dropped = 0

    def _start(self, step: int) -> None:
        future: Future = Future()
        play = self.plan(step)

        def run():
            try:
                future.set_result(play())
            except BaseException as e:  # surfaced by next, in the main thread
                future.set_exception(e)

        threading.Thread(target=run, name=f"rollouts-step-{step}", daemon=True).start()
        self._ahead = (step, future)

    def next(self, step: int, last_step: int | None = None) -> Any:
        """The result of ``plan(step)()``; with overlap, the next step's generation starts before
        this returns (none after ``last_step``)."""
        if self.max_staleness == 0:
            return self._play_now(step)
        if self._ahead is not None and self._ahead[0] == step:
            result = self._ahead[1].result()
        else:  # the first step (or a resumed run): nothing was generated ahead
            result = self._play_now(step)
        self._ahead = None
        if last_step is None or step < last_step:
            with self.serving():
                pass
            self._start(step + 1)
        return result

    def _play_now(self, step: int) -> Any:
        """``plan(step)()`` in this thread, on the trainer's current weights."""
        play = self.plan(step)
        with self.serving():
            return play()

    def keep(self, samples: list[Sample], version: int) -> tuple[list[Sample], dict[str, float]]:
        """The samples fresh enough to train at trainer ``version``, and the metrics to log
        (none with ``max_staleness`` 0: every sample is on-policy)."""
        if self.max_staleness == 0:
            return samples, {}
        kept, metrics = drop_stale(samples, version, self.max_staleness, self.rank_sum)
        self.dropped += int(metrics["staleness/dropped"])
        return kept, metrics

    def next_batch(self, step: int, version: int, last_step: int | None = None) -> tuple[list[Sample], dict[str, float]]:
        """:meth:`next` for a ``play`` returning samples, then :meth:`keep`."""
        return self.keep(self.next(step, last_step), version)

    def close(self) -> None:
        """Wait for a generation still running (its engine calls must finish before shutdown)."""
        if self._ahead is not None:
            self._ahead[1].exception()
            self._ahead = None


def rollouts_for(max_staleness: int, trainer: Any, engine: Any, plan: Callable[[int], Callable[[], Any]],
                 also: list[tuple[Any, Any]] = ()) -> OverlappedRollouts:
    """The recipes' hook: ``plan``'s rollouts with the run's ``max_staleness`` (the engine config's),
    served through ``trainer.serving(engine)`` and that of every other ``(trainer, engine)`` in
    ``also`` (the rollouts' other roles; ``play`` itself must not enter ``serving``). The counts
    of what is dropped are summed over the ranks of ``trainer``'s accelerator."""
    pairs = [(trainer, engine), *[(t, e) for t, e in also if e is not engine]]
    for _, e in pairs[1:]:
        check_overlap(max_staleness, e)

    return OverlappedRollouts(plan, max_staleness, engine, lambda: serving_all(pairs),
                              rank_sum_of(trainer.accelerator))


@contextmanager
def serving_all(pairs: list[tuple[Any, Any]]) -> Iterator[None]:
    """Inside, every ``(trainer, engine)``'s engine serves its trainer's current weights."""
    with ExitStack() as stack:
        for trainer, engine in pairs:
            stack.enter_context(trainer.serving(engine))
        yield


def rank_sum_of(accelerator: Any) -> Callable[[list[float]], list[float]] | None:
    """Element-wise sum over the data-parallel ranks (a collective: every rank calls it);
    None in one process."""
    if accelerator is None or accelerator.num_processes == 1:
        return None

    def rank_sum(values: list[float]) -> list[float]:
        import torch

        t = torch.tensor(values, dtype=torch.float64, device=accelerator.device)
        return accelerator.reduce(t, reduction="sum").tolist()
    return rank_sum
