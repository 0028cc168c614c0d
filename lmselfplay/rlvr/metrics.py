"""The positive control's evaluation (``recipes/rlvr.py``, step 6 and the end of the run):

* :func:`heldout_accuracy` — greedy accuracy on the held-out items with 95% Wilson intervals,
  overall and per family (:func:`accuracy_row`);
* :func:`plot`, :func:`print_final` — ``curves.png`` and the closing summary.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from lmselfplay.lm.engines import SamplingParams
from lmselfplay.rlvr.steps import generate
from lmselfplay.tasks.task_sets import TaskItem
from lmselfplay.utils.stats import wilson
from lmselfplay.verifiers.task_referee import TaskReferee


def heldout_accuracy(engine: Any, tok: Any, referee: TaskReferee, heldout: list[TaskItem],
                     greedy: SamplingParams) -> dict[str, float]:
    """Accuracy of ``greedy`` answers on the held-out items with a 95% Wilson interval, overall and per family."""
    if not heldout:
        return {}
    comps = generate(engine, tok, heldout, greedy)
    right = [v.reward >= 1.0 for v in referee.score(heldout, [c.text for c in comps])]
    out = accuracy_row("eval/heldout", right)
    by_family: dict[str, list[bool]] = defaultdict(list)
    for t, r in zip(heldout, right):
        if t.family:
            by_family[t.family].append(r)
    for fam, rs in sorted(by_family.items()):
        out.update(accuracy_row(f"eval/heldout/{fam}", rs))
    return out


def accuracy_row(prefix: str, right: list[bool]) -> dict[str, float]:
    lo, hi = wilson(sum(right), len(right))
    return {f"{prefix}/accuracy": float(np.mean(right)) if right else float("nan"),
            f"{prefix}/ci_low": lo, f"{prefix}/ci_high": hi, f"{prefix}/n": len(right)}


def plot(logger: Any) -> Any:
    keys = ["eval/heldout/accuracy", "train/reward", "train/informative_groups", "kl", "clip_frac"]
    return logger.plot(keys, "curves.png", title="rlvr")


def print_final(first: dict[str, float], last: dict[str, float], logger: Any, model_dir: Any) -> None:
    def line(row: dict[str, float]) -> str:
        return (f"{row['eval/heldout/accuracy']:.3f} [{row['eval/heldout/ci_low']:.3f}, "
                f"{row['eval/heldout/ci_high']:.3f}]")

    if first and last:
        print(f"\nheld-out accuracy (greedy, 95% CI): {line(first)} -> {line(last)}")
    if logger is not None:
        print(f"curves: {logger.dir / 'curves.png'}\nmetrics: {logger.path}")
    print(f"model: {model_dir}")
