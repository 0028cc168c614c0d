"""R-Zero's measures (``recipes/r_zero.py``, step 4), against the truth the loop computes for
every question but a vote-grounded loop never reads:

* :func:`pool_measures` — from the iteration's pool: label accuracy (on the kept questions and
  on every labelled one), difficulty, pass rate, diversity, malformed share;
* :func:`heldout_accuracy` — the solver's greedy accuracy on the fixed held-out set;
* :func:`plot_run` — ``curves.png``.

The solver phase's reward accuracy is part of its step's row (:func:`~lmselfplay.r_zero.steps.solver_step`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmselfplay.r_zero.config import RZeroArgs
from lmselfplay.r_zero.steps import RZero, written_text
from lmselfplay.rl.repetition import diversity

STUDY_KEYS = ["study/label_accuracy", "study/reward_accuracy", "study/difficulty", "study/pass_rate",
              "study/diversity", "eval/heldout_accuracy"]


def pool_measures(records: list[dict[str, Any]]) -> dict[str, float]:
    """Step 4, from the pool: label accuracy on the kept questions (the ones the loop
    trains on) and on all checkable ones, how many distinct questions were kept, difficulty
    (true solve rate), pass rate, diversity, malformed share."""
    well = [r for r in records if r["well_formed"] and r["truth"]]
    kept = [r for r in well if r["kept"]]
    written = [written_text(r["kind"], r["question"], r["expression"]) for r in well]
    mean = lambda xs: float(np.mean(xs)) if xs else float("nan")  # noqa: E731
    return {"study/label_accuracy": mean([r["label_correct"] for r in kept]), "study/n_kept": len(kept),
            "study/n_kept_distinct": len({w for w, r in zip(written, well) if r["kept"]}),
            "study/label_accuracy_all": mean([r["label_correct"] for r in well if r["label"]]),
            "study/n_labelled": sum(bool(r["label"]) for r in well),
            "study/label_correct_kept": sum(r["label_correct"] for r in kept),
            "study/difficulty": mean([r["true_solve_rate"] for r in well]),
            "study/pass_rate": len(kept) / len(well) if well else float("nan"),
            "study/diversity": diversity(written),
            "study/malformed": 1 - len(well) / len(records) if records else float("nan")}


def heldout_accuracy(rz: RZero, it: int) -> dict[str, float]:
    """Step 4: the solver's greedy accuracy on the fixed held-out set."""
    with rz.serving(rz.solver):
        comps = rz.generate(rz.solver, [t.prompt for t in rz.heldout],
                             rz.sampling(rz.cfg.rzero.solver_max_new_tokens, it, 3, greedy=True))
    v = rz.truth.score(rz.heldout, [c.text for c in comps])
    right = sum(x.reward for x in v)
    return {"eval/heldout_accuracy": right / max(len(v), 1), "eval/heldout_right": right, "eval/heldout_n": len(v)}


def plot_run(args: RZeroArgs, logger: Any) -> None:
    """``curves.png``: the study's measures and both roles' rewards per iteration."""
    logger.plot(STUDY_KEYS + ["challenger/reward", "solver/reward", "solver/true_accuracy"],
                "curves.png", title=f"R-Zero ({args.task_form}, referee {args.referee})")
