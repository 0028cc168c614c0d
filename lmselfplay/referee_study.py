"""The referee study: the same R-Zero loop, seed and budget, grounded by different referees.

    lmselfplay referee-study --config recipes/configs/r_zero.yaml [--referees fixed,grounded,vote]
                             [--output_dir DIR] [--any r_zero key ...]

Three arms: ``fixed`` (fixed data + rules: the positive control, ``recipes/rlvr.py``, on the
generator's own questions), ``grounded`` (self-generated + rules or executor) and ``vote``
(self-generated + the solver's majority vote). The fixed arm gets the solver's budget: as many
updates (rounds x solver_steps) of as many questions and answers (solver_batch x
solver_group_size) and answer tokens, evaluated on the same held-out questions after every
solver_steps updates (its "iteration"); its questions' labels are the truth by construction, so
it has no label or reward accuracy, and its difficulty is its training reward.

The study's folder is ``output_dir`` (the run config's, as for every program: the flag's, else
the YAML's, else ``runs/referee_study``). Each referee gets its own run
(``output_dir/<referee>``: the recipe's metrics, curves, data and checkpoints; ``--resume
true`` continues them). The truth is computed for every
question in every run; only the referee under study decides labels and rewards. Per
iteration and referee:

* label accuracy: the referee's label vs the truth on the kept questions (those the solver
  trains on) and on every labelled question of the pool;
* reward accuracy: the share of the solver-phase rewards that were right (reward 1 exactly
  when the answer is true);
* difficulty: the true solve rate of the pool's questions; pass rate: the share passing
  the filter band; diversity: 1 - mean pairwise BLEU of the pool's questions;
* the solver's greedy accuracy on the fixed held-out ground-truth set.

Output in ``output_dir``: ``study.jsonl``, ``study.csv``, ``study.png`` (a panel per measure,
a curve per referee, 95% Wilson intervals shaded) and the table on stdout, closed by a note
on whether the vote's label accuracy falls across iterations (by its 95% intervals).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from lmselfplay.r_zero.config import TASK_SETS, RZeroConfigs
from lmselfplay.rlvr.config import RLVRArgs, RLVRConfigs
from lmselfplay.utils.checkpoint import atomic_write_text
from lmselfplay.utils.config import Config
from lmselfplay.utils.curves import Line, plot_lines
from lmselfplay.utils.metrics_logger import read_jsonl
from lmselfplay.utils.recipe_loader import train_recipe
from lmselfplay.utils.run import PeriodicCheckpoints
from lmselfplay.utils.stats import wilson

# measure -> (numerator key, count key) for a 95% interval, or None (a mean, no interval)
MEASURES: dict[str, tuple[str, str] | None] = {
    "label_accuracy": ("study/label_correct_kept", "study/n_kept"),
    "label_accuracy_all": None,
    "reward_accuracy": ("rewards_right", "n_rewards"),
    "difficulty": None,
    "pass_rate": None,
    "diversity": None,
    "heldout_accuracy": ("eval/heldout_right", "eval/heldout_n"),
}


@dataclass
class RefereeStudyArgs(Config):
    """The study's own field (beside every r_zero key, :class:`RefereeStudyConfigs`); its folder
    is the run config's ``output_dir`` (one folder field)."""

    _argument_group_name = "referee study (lmselfplay.referee_study.RefereeStudyArgs)"
    renamed_keys: ClassVar[dict[str, str]] = {"study_dir": "output_dir"}
    referees: str = field(default="auto", metadata={
        "help": "comma-separated arms; auto = fixed,grounded,vote (+ judge when registered); fixed = the positive "
                "control on the generator's questions at the solver's budget; the study's table, rows and plot go "
                "in output_dir, each arm's run in output_dir/<arm>"})


@dataclass(frozen=True)
class RefereeStudyConfigs(RZeroConfigs):
    """R-Zero's configs (every r_zero key) and the study's own arguments."""

    study: RefereeStudyArgs

    defaults = {**RZeroConfigs.defaults, "output_dir": "runs/referee_study"}


def referee_names(spec: str) -> list[str]:
    from lmselfplay.verifiers.referees import REFEREES

    if spec.strip() == "auto":
        return ["fixed", "grounded", "vote"] + (["judge"] if "judge" in REFEREES else [])
    return [s.strip() for s in spec.split(",") if s.strip()]


def iteration_rows(metrics_path: Path, referee: str) -> list[dict[str, Any]]:
    """One row per iteration: the run's rows merged by iteration; solver-step reward counts summed."""
    by_it: dict[int, dict[str, Any]] = {}
    for r in read_jsonl(metrics_path):
        if "iteration" not in r:
            continue
        row = by_it.setdefault(int(r["iteration"]), {"referee": referee, "iteration": int(r["iteration"]),
                                                     "n_rewards": 0, "rewards_right": 0})
        row["n_rewards"] += r.get("study/n_rewards", 0)
        row["rewards_right"] += r.get("study/rewards_right", 0)
        row.update({k: v for k, v in r.items() if k not in ("study/n_rewards", "study/rewards_right")})
    return [by_it[k] for k in sorted(by_it)]


def fixed_arm_config(cfg: RefereeStudyConfigs, output_dir: Path) -> RLVRConfigs:
    """The positive control at the solver's budget: the generator's questions (task_form), the
    solver's updates, questions, answers and answer tokens, R-Zero's held-out questions
    (:func:`lmselfplay.r_zero.steps.heldout_tasks` draws the same ones), an evaluation every
    solver_steps updates."""
    rz = cfg.rzero
    task, settings = TASK_SETS[rz.task_form]
    args = RLVRArgs(task=task, task_config=json.dumps(settings) if settings else "", heldout_size=rz.heldout_size, heldout_seed=cfg.run.seed,
                    max_steps=rz.rounds * rz.solver_steps, prompts_per_step=rz.solver_batch,
                    num_generations=rz.solver_group_size, max_new_tokens=rz.solver_max_new_tokens,
                    eval_every=rz.solver_steps, check_timeout_s=rz.check_timeout_s)
    shared = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(RLVRConfigs) if f.name in
              {g.name for g in dataclasses.fields(RZeroConfigs)}}
    shared["run"] = dataclasses.replace(cfg.run, output_dir=str(output_dir))
    return RLVRConfigs(**shared, rlvr=args, checkpoints=PeriodicCheckpoints())


def fixed_arm_rows(metrics_path: Path, solver_steps: int) -> list[dict[str, Any]]:
    """The fixed arm's rows in the study's shape: iteration k = the evaluation after k x
    solver_steps updates (0: before training); difficulty = the mean training reward of the
    iteration's updates."""
    rows = list(read_jsonl(metrics_path))
    out = []
    for r in rows:
        if "eval/heldout/accuracy" not in r or r["step"] % solver_steps:
            continue
        k, n = r["step"] // solver_steps, int(r["eval/heldout/n"])
        rewards = [x["train/reward"] for x in rows if "train/reward" in x
                   and (k - 1) * solver_steps < x["step"] <= k * solver_steps]
        out.append({"referee": "fixed", "iteration": k, "n_rewards": 0, "rewards_right": 0,
                    "eval/heldout_accuracy": r["eval/heldout/accuracy"],
                    "eval/heldout_right": round(r["eval/heldout/accuracy"] * n), "eval/heldout_n": n,
                    **({"study/difficulty": sum(rewards) / len(rewards)} if rewards else {})})
    return out


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The study table: every measure per (referee, iteration), with 95% intervals."""
    out = []
    for r in rows:
        t: dict[str, Any] = {"referee": r["referee"], "iteration": r["iteration"]}
        for m, counts in MEASURES.items():
            key = m if m in ("reward_accuracy",) else (f"eval/{m}" if m == "heldout_accuracy" else f"study/{m}")
            if counts is None:
                t[m] = r.get(key, float("nan"))
                continue
            k, n = r.get(counts[0], 0), r.get(counts[1], 0)
            t[m] = k / n if n else float("nan")
            t[f"{m}_lo"], t[f"{m}_hi"] = wilson(k, int(n)) if n else (float("nan"), float("nan"))
            t[f"{m}_n"] = int(n)
        t["n_kept"] = r.get("study/n_kept", 0)
        t["n_kept_distinct"] = r.get("study/n_kept_distinct", 0)
        out.append(t)
    return out


def trend_note(rows: list[dict[str, Any]], referee: str = "vote", measure: str = "label_accuracy") -> str:
    """Does ``referee``'s ``measure`` fall from the first to the last iteration that has
    it? Decided by the 95% intervals: 'falls' / 'rises' only when they do not overlap."""
    its = [r for r in rows if r["referee"] == referee and r["iteration"] >= 1 and r.get(f"{measure}_n", 0) > 0]
    if len(its) < 2:
        return f"{referee} {measure}: fewer than two iterations with data; no trend can be read"
    a, b = its[0], its[-1]
    fmt = lambda r: (f"iteration {r['iteration']}: {r[measure]:.2f} "  # noqa: E731
                     f"[{r[f'{measure}_lo']:.2f}, {r[f'{measure}_hi']:.2f}] (n={r[f'{measure}_n']})")
    if b[f"{measure}_hi"] < a[f"{measure}_lo"]:
        verdict = "falls (95% intervals do not overlap)"
    elif b[f"{measure}_lo"] > a[f"{measure}_hi"]:
        verdict = "rises (95% intervals do not overlap)"
    else:
        verdict = "no significant change (95% intervals overlap)"
    return f"{referee} {measure.replace('_', ' ')} {fmt(a)} -> {fmt(b)}: {verdict}"


def write_outputs(study_dir: Path, rows: list[dict[str, Any]]) -> dict[str, Path]:
    atomic_write_text(study_dir / "study.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(study_dir / "study.csv", buf.getvalue())
    return {"jsonl": study_dir / "study.jsonl", "csv": study_dir / "study.csv", "png": plot(study_dir, rows)}


def study_lines(rows: list[dict[str, Any]]) -> dict[str, list[Line]]:
    """A panel per measure, a line per referee over the iterations that have the measure,
    with its 95% interval where the measure has one."""
    panels: dict[str, list[Line]] = {}
    for m in MEASURES:
        lines = []
        for ref in dict.fromkeys(r["referee"] for r in rows):
            pts = [r for r in rows if r["referee"] == ref and isinstance(r.get(m), float) and not math.isnan(r[m])]
            interval = [(r["iteration"], r[f"{m}_lo"], r[f"{m}_hi"]) for r in pts if f"{m}_lo" in r]
            lines.append(Line(ref, [(r["iteration"], r[m]) for r in pts], interval=interval))
        panels[m] = lines
    return panels


def plot(study_dir: Path, rows: list[dict[str, Any]], out: Path | None = None) -> Path:
    """``study.png`` (or ``out``): the curves of every measure per referee."""
    return plot_lines(study_lines(rows), out or study_dir / "study.png", columns=2, xlabel="iteration",
                      title="Referee study: fixed data + rules, and R-Zero grounded by each referee (95% intervals shaded)")


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ["referee", "it", "label_acc [95% CI]", "label_all", "reward_acc", "difficulty", "pass", "diversity",
            "heldout", "kept", "distinct"]
    print(" | ".join(head))
    for r in rows:
        ci = (f"{r['label_accuracy']:.2f} [{r['label_accuracy_lo']:.2f},{r['label_accuracy_hi']:.2f}]"
              if r.get("label_accuracy_n") else "-")
        print(" | ".join([r["referee"], str(r["iteration"]), ci] + [f"{r[m]:.2f}" for m in (
            "label_accuracy_all", "reward_accuracy", "difficulty", "pass_rate", "diversity", "heldout_accuracy")]
            + [str(r["n_kept"]), str(r["n_kept_distinct"])]))


def main(argv: list[str] | None = None) -> int:
    cfg = RefereeStudyConfigs.parse(argv)
    study_dir = Path(cfg.run.output_dir)
    rows = []
    for name in referee_names(cfg.study.referees):
        if name == "fixed":
            print("\n=== fixed data + rules (the positive control at the solver's budget) ===")
            path = train_recipe("rlvr", fixed_arm_config(cfg, study_dir / "fixed"))
            rows += fixed_arm_rows(path, cfg.rzero.solver_steps)
            continue
        args = dataclasses.replace(cfg.rzero, referee=name)  # validated again: grounded -> rules / executor
        parts = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(RZeroConfigs)}
        run_cfg = RZeroConfigs(**{**parts, "rzero": args,
                                  "run": dataclasses.replace(cfg.run, output_dir=str(study_dir / args.referee))})
        print(f"\n=== referee {args.referee} ===")
        rows += iteration_rows(train_recipe("r_zero", run_cfg), args.referee)
    rows = table(rows)
    paths = write_outputs(study_dir, rows)
    print()
    print_table(rows)
    print()
    for measure in ("label_accuracy", "reward_accuracy", "heldout_accuracy"):
        print(trend_note(rows, "vote", measure))
    print(f"\ntable: {paths['csv']}\nrows: {paths['jsonl']}\nplot: {paths['png']}")
    return 0
