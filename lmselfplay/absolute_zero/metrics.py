"""Absolute Zero's evaluation (``recipes/absolute_zero.py``, step 7 and the end of the run):

* :func:`heldout_tasks` — the fixed held-out set, the same for every run (buffers never admit it);
* :func:`heldout_accuracy`, :func:`log_eval` — greedy accuracy per task type with 95% Wilson
  intervals, logged and plotted (:func:`plot_curves`);
* :func:`print_final`, :func:`print_run_summary` — the closing summary.

Each measures the weights the engine serves; the recipe serves them (``trainer.serving``) and
trains: evaluation never touches the trainer.
"""

from __future__ import annotations

import random
import time

import numpy as np

from lmselfplay.absolute_zero.steps import generate, n_inputs, validated
from lmselfplay.utils.stats import wilson
from lmselfplay.verifiers.code_tasks import TASK_TYPES, CodeTask, seed_tasks, solve_prompt, task_key


def heldout_tasks(cfg, referee) -> dict[str, list[CodeTask]]:
    """The FIXED evaluation set: eval_tasks_per_type generated tasks per type, from a seed
    stream of their own (the same for every run and --seed, so runs compare); buffers never
    admit them (see :func:`~lmselfplay.absolute_zero.steps.seed_buffers`)."""
    rng = random.Random("heldout/0")
    out = {}
    for tt in TASK_TYPES:
        cands = seed_tasks(tt, rng, cfg.absolute_zero.eval_tasks_per_type * 2, n_inputs(cfg, tt))[1:]  # no identity
        tasks, keys = [], set()
        for t in validated(referee, cfg, cands):
            if task_key(t) not in keys and len(tasks) < cfg.absolute_zero.eval_tasks_per_type:
                keys.add(task_key(t))
                tasks.append(t)
        out[tt] = tasks
    return out


def heldout_accuracy(cfg, engine, tok, referee, heldout) -> dict[str, float]:
    """Step 7: greedy accuracy per type on the held-out tasks, with 95% Wilson CIs."""
    items = [t for tt in TASK_TYPES for t in heldout[tt]]
    prompts = [solve_prompt(t, cfg.absolute_zero.answer_tags) for t in items]
    comps = generate(engine, tok, prompts, cfg, cfg.absolute_zero.solve_max_new_tokens, cfg.run.seed, greedy=True)
    verdicts = referee.check([(t, c.text) for t, c in zip(items, comps)])
    out = {}
    for tt in TASK_TYPES:
        right = [r > 0 for t, (r, _) in zip(items, verdicts) if t.task_type == tt]
        acc = float(np.mean(right)) if right else float("nan")
        lo, hi = wilson(sum(right), len(right))
        out.update({f"heldout/{tt}/accuracy": acc, f"heldout/{tt}/ci_low": lo, f"heldout/{tt}/ci_high": hi})
    return out


def log_eval(cfg, acc, engine, tok, referee, heldout, logger, step, t0) -> dict[str, float]:
    """Step 7 on the weights ``engine`` serves (every rank evaluates in step: ZeRO-3); the main
    process logs the row and redraws the curves."""
    result = heldout_accuracy(cfg, engine, tok, referee, heldout)
    if acc.is_main_process:
        logger.log(step, {**result, "wall_s": time.time() - t0})
        plot_curves(logger)
    return result


def plot_curves(logger):
    keys = [f"heldout/{tt}/accuracy" for tt in TASK_TYPES]
    keys += ["propose/valid_rate", "solve/solve_rate", "propose/reward_mean", "diversity/distinct_ast",
             "time/executor_share"]
    return logger.plot(keys, "curves.png", title="absolute zero")


def print_final(final, logger, model_dir) -> None:
    print("\nheld-out accuracy (greedy, 95% CI):")
    for tt in TASK_TYPES:
        print(f"  {tt:<10} {final[f'heldout/{tt}/accuracy']:.3f} "
              f"[{final[f'heldout/{tt}/ci_low']:.3f}, {final[f'heldout/{tt}/ci_high']:.3f}]")
    print_run_summary(logger.rows())
    print(f"\ncurves: {logger.dir / 'curves.png'}\nmetrics: {logger.path}\nmodel: {model_dir}")


def print_run_summary(rows) -> None:
    """The closing note: first/last valid-proposal and solve rates, time shares over the run."""
    train = [r for r in rows if "propose/valid_rate" in r]
    if not train:
        return
    total = sum(r["time/step_s"] for r in train)
    print(f"\nvalid-proposal rate: first step {train[0]['propose/valid_rate']:.2f}, "
          f"last step {train[-1]['propose/valid_rate']:.2f}; solve rate {train[0]['solve/solve_rate']:.2f} -> "
          f"{train[-1]['solve/solve_rate']:.2f}")
    shares = {k: sum(r[f"time/{k}_share"] * r["time/step_s"] for r in train) / total
              for k in ("executor", "generation", "train")}
    print("share of step time: " + ", ".join(f"{k} {v:.1%}" for k, v in shares.items())
          + f"; executor {sum(r['executor/programs'] for r in train)} programs")
