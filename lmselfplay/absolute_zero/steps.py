"""The steps of Absolute Zero (Zhao et al. 2025), the algorithm of ``recipes/absolute_zero.py``,
whose docstring is its box (steps 1-7): one policy proposes and solves code tasks; the sandboxed
executor is the referee.

* the task buffers: :func:`seed_buffers` (identity + generated programs, validated like
  proposals), :func:`load_buffers` (a resumed rank's own);
* steps 1-3, propose, validate, solve: :func:`rollout_plan`, :func:`play_step` (a :class:`Rollout`,
  timed per phase by :class:`PhaseClock`);
* steps 4-6, rewards (:func:`learnability`, :func:`proposer_reward`), TRR++ advantages, one
  update: :func:`train_step` (the step's row :func:`step_metrics`, its data :func:`save_step_data`);
* :class:`SharedReferee`, the one referee that the overlapped rollouts and the evaluation share.

Its configs are :mod:`lmselfplay.absolute_zero.config`, its held-out evaluation (step 7)
:mod:`lmselfplay.absolute_zero.metrics`: the steps never import evaluation.
"""

from __future__ import annotations

import random
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmselfplay.lm.engines import generate_fitting
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.advantages import task_type_advantages
from lmselfplay.rl.rewards import proposer_rewards
from lmselfplay.verifiers.code_tasks import (
    TASK_TYPES,
    CodeReferee,
    CodeTask,
    Proposal,
    TaskBuffer,
    diversity,
    parse_proposal,
    propose_prompt,
    seed_tasks,
    solve_prompt,
    status_counts,
)


def n_inputs(cfg, task_type: str) -> int:
    return cfg.absolute_zero.induction_inputs if task_type == "induction" else 1


def validated(referee, cfg, tasks: list[CodeTask]) -> list[CodeTask]:
    """Run unvalidated tasks (seeds, held-out) through step 2's validation; keep the valid."""
    props = [(t.task_type, Proposal(t.program, t.inputs, t.message)) for t in tasks]
    out = []
    for t, v in zip(tasks, referee.validate(props)):
        if v.valid:
            v.task.source = t.source
            out.append(v.task)
    return out


def seed_buffers(cfg, referee, forbidden: set[str]) -> dict[str, TaskBuffer]:
    """Identity + seed_programs generated programs per type, validated like proposals."""
    rng = random.Random(f"seed/{cfg.run.seed}")
    buffers = {tt: TaskBuffer(tt, forbidden) for tt in TASK_TYPES}
    for tt in TASK_TYPES:
        for t in validated(referee, cfg, seed_tasks(tt, rng, cfg.absolute_zero.seed_programs, n_inputs(cfg, tt))):
            buffers[tt].add(t)
    return buffers


def generate(engine, tok, prompts: list[str], cfg, max_new_tokens: int, seed: int, greedy: bool = False):
    """One engine call for all prompts (through THE formatter)."""
    sp = cfg.sampling.params(max_new_tokens, seed, greedy)
    return generate_fitting(engine, [encode_prompt(tok, p) for p in prompts], sp)


def solve_set(cfg, buffers, new_tasks, rng) -> list[CodeTask]:
    """Step 3's tasks: the step's new valid tasks per type, topped up from the buffer."""
    out = []
    for tt in TASK_TYPES:
        mine = [t for t in new_tasks if t.task_type == tt][: cfg.absolute_zero.solve_tasks_per_type]
        extra = cfg.absolute_zero.solve_tasks_per_type - len(mine)
        out += mine + (buffers[tt].sample(rng, extra, exclude=mine) if extra > 0 else [])
    return out


def make_sample(comp, advantage: float, reward: float, role: str, task_type: str, version: int) -> Sample:
    return Sample(list(comp.prompt_ids), list(comp.token_ids), list(comp.logprobs), advantage, reward,
                  role, task_type, version)


def load_buffers(buffers, extra, rank: int) -> None:
    """This rank's task buffers from a checkpoint's ``extra`` (every rank saved its own)."""
    for tt in TASK_TYPES:
        buffers[tt].load_state_dict(extra["buffers"][rank][tt])


class SharedReferee:
    """The run's referee, one batch at a time: with overlap the next step's rollouts are checked
    in their own thread while an evaluation's answers are checked in the loop's. Its
    ``seconds`` / ``programs_run`` count the calling thread's batches only, so a step's executor
    metrics never include an evaluation's programs."""

    def __init__(self, referee: CodeReferee):
        self.referee, self.lock, self._mine = referee, threading.Lock(), threading.local()

    def __getattr__(self, name: str):
        return getattr(self.referee, name)

    @property
    def seconds(self) -> float:
        return getattr(self._mine, "seconds", 0.0)

    @property
    def programs_run(self) -> int:
        return getattr(self._mine, "programs", 0)

    def _counted(self, judge, batch):
        with self.lock:
            seconds, programs = self.referee.seconds, self.referee.programs_run
            out = judge(batch)
            self._mine.seconds = self.seconds + self.referee.seconds - seconds
            self._mine.programs = self.programs_run + self.referee.programs_run - programs
        return out

    def validate(self, proposals):
        return self._counted(self.referee.validate, proposals)

    def check(self, items):
        return self._counted(self.referee.check, items)


class PhaseClock:
    """Seconds per phase of a step: ``with clock("executor"): ...``."""

    def __init__(self):
        self.seconds: dict[str, float] = {"generation": 0.0, "executor": 0.0, "train": 0.0}

    @contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t

    def shares(self) -> dict[str, float]:
        total = sum(self.seconds.values()) or 1.0
        return {f"time/{k}_share": v / total for k, v in self.seconds.items()} | {"time/step_s": total}


@dataclass
class Rollout:
    """Steps 1-3 of one step (what :func:`rollout_plan`'s ``play`` returns): the proposals, their
    validation, the attempts and their verdicts, the weight version they were sampled with and
    the buffers as they stood after this step's additions when a checkpoint follows the step
    (it saves those: with overlap the next step's rollouts are already adding to the live
    buffers)."""

    version: int
    types: list[str]
    props: list
    parsed: list
    checks: list
    added: list[bool]
    attempts: list[CodeTask]
    answers: list
    verdicts: list
    clock: PhaseClock
    executor_s: float
    programs: int
    buffers: dict[str, list] | None
    buffer_sizes: dict[str, int]


def rollout_plan(cfg, acc, engine, tok, referee, buffers, checkpoint_after=lambda step: False):
    """``step -> play``; ``play()`` runs steps 1-3 with the weights the engine serves (entered by
    the caller: :func:`lmselfplay.rl.overlap.rollouts_for`), adds the valid proposals to the
    buffers and returns the :class:`Rollout` (with the buffers' state if
    ``checkpoint_after(step)``). The step's seeds come from (seed, step, rank)."""
    def at(step: int):
        keep_state = checkpoint_after(step)
        return lambda: play_step(cfg, acc, engine, tok, referee, buffers, step, keep_state)
    return at


def play_step(cfg, acc, engine, tok, referee, buffers, step: int, keep_state: bool = False) -> Rollout:
    """Steps 1-3 of the algorithm box."""
    rng = random.Random(f"{cfg.run.seed}/{step}/{acc.process_index}")
    seed = rng.randrange(2**31)
    version = engine.version
    clock = PhaseClock()
    exec_before = (referee.seconds, referee.programs_run)

    # 1: propose, per type, conditioned on K reference tasks of that type's buffer
    types = [tt for tt in TASK_TYPES for _ in range(cfg.absolute_zero.proposals_per_type)]
    refs = [buffers[tt].sample(rng, cfg.absolute_zero.references) for tt in types]
    prompts = [propose_prompt(tt, r, n_inputs(cfg, tt), cfg.absolute_zero.proposal_style) for tt, r in zip(types, refs)]
    with clock("generation"):
        props = generate(engine, tok, prompts, cfg, cfg.absolute_zero.propose_max_new_tokens, seed)

    # 2: validate in the executor (one batch); valid tasks enter the buffer (dedup)
    io = cfg.absolute_zero.proposal_style == "io"
    parsed = [parse_proposal(c.text, n_inputs(cfg, tt), tt == "induction" and not io, r[0].inputs if io else None)
              for tt, c, r in zip(types, props, refs)]
    with clock("executor"):
        checks = referee.validate(list(zip(types, parsed)))
    new_tasks = [v.task for v in checks if v.valid and not buffers[v.task.task_type].is_forbidden(v.task)]
    added = [buffers[t.task_type].add(t) for t in new_tasks]

    # 3: solve, G attempts per task, checked by the executor (one batch)
    attempts = [t for t in solve_set(cfg, buffers, new_tasks, rng) for _ in range(cfg.absolute_zero.num_generations)]
    with clock("generation"):
        answers = generate(engine, tok, [solve_prompt(x, cfg.absolute_zero.answer_tags) for x in attempts], cfg,
                           cfg.absolute_zero.solve_max_new_tokens, seed + 1)
    with clock("executor"):
        verdicts = referee.check([(x, c.text) for x, c in zip(attempts, answers)])
    return Rollout(version, types, props, parsed, checks, added, attempts, answers, verdicts, clock,
                   referee.seconds - exec_before[0], referee.programs_run - exec_before[1],
                   {tt: b.state_dict() for tt, b in buffers.items()} if keep_state else None,
                   {tt: len(b) for tt, b in buffers.items()})


def train_step(cfg, acc, trainer, engine, ro: Rollout, rollouts, step: int, out_dir: Path) -> dict[str, float]:
    """Steps 4-6 on the step's :class:`Rollout` (generated by ``engine``); returns the step's metrics."""
    # 4: rewards: solver 1/0 (format error: penalty); proposer learnability over G attempts
    solve_r = [cfg.absolute_zero.format_penalty if status == "format" else r for r, status in ro.verdicts]
    learn = learnability(ro.attempts, ro.verdicts)
    prop_r = [proposer_reward(cfg, p, v, learn) for p, v in zip(ro.parsed, ro.checks)]

    # 5: advantages: TRR++, one bucket per (task type, role)
    keys = [f"{tt}/propose" for tt in ro.types] + [f"{x.task_type}/solve" for x in ro.attempts]
    adv = task_type_advantages(keys, prop_r + solve_r)

    # 6: update both roles in one trainer step; a rollout older than max_staleness versions is dropped
    samples = [make_sample(c, a, r, "propose", tt, ro.version if c.version is None else c.version)
               for c, a, r, tt in zip(ro.props, adv[: len(ro.props)], prop_r, ro.types)]
    samples += [make_sample(c, a, r, "solve", x.task_type, ro.version if c.version is None else c.version)
                for c, a, r, x in zip(ro.answers, adv[len(ro.props):], solve_r, ro.attempts)]
    samples, stale = rollouts.keep([s for s in samples if s.completion_ids], trainer.step_count)
    with ro.clock("train"):
        metrics = trainer.step(samples, engine=engine)

    if cfg.absolute_zero.save_datasets and acc.is_main_process:
        save_step_data(out_dir, step, ro.version, ro.types, ro.props, ro.parsed, ro.checks, prop_r, ro.attempts,
                       ro.answers, ro.verdicts, solve_r)
    row = {f"train/{k}": v for k, v in metrics.items()}
    row.update(step_metrics(ro.types, ro.parsed, ro.checks, prop_r, ro.attempts, ro.verdicts, ro.buffer_sizes,
                            ro.added))
    row.update(ro.clock.shares())
    row.update({"executor/programs_per_s": ro.programs / ro.executor_s if ro.executor_s > 0 else 0.0,
                "executor/programs": ro.programs, **stale})
    return row


def learnability(attempts, verdicts) -> dict[int, float]:
    """id(task) -> AZR's learnability over its G attempts (right = 1; wrong or unparsable = 0)."""
    outcome: dict[int, list[int]] = {}
    for x, (r, _) in zip(attempts, verdicts):
        outcome.setdefault(id(x), []).append(int(r > 0))
    if not outcome:
        return {}
    return dict(zip(outcome, proposer_rewards(list(outcome.values())).absolute_zero.tolist()))


def proposer_reward(cfg, parsed, check, learn: dict[int, float]) -> float:
    """Format error: format_penalty; fails validation: invalid_penalty; else learnability
    (0 for a valid task that was not solved this step: a held-out collision)."""
    if parsed.error:
        return cfg.absolute_zero.format_penalty
    if not check.valid:
        return cfg.absolute_zero.invalid_penalty
    return float(learn.get(id(check.task), 0.0))


def step_metrics(types, parsed, checks, prop_r, attempts, verdicts, buffer_sizes, added) -> dict[str, float]:
    row: dict[str, float] = {}
    for tt in TASK_TYPES:
        mine = [v.valid for t, v in zip(types, checks) if t == tt]
        row[f"propose/{tt}/valid_rate"] = float(np.mean(mine)) if mine else 0.0
        got = [r > 0 for x, (r, _) in zip(attempts, verdicts) if x.task_type == tt]
        row[f"solve/{tt}/solve_rate"] = float(np.mean(got)) if got else 0.0
        row[f"buffer/{tt}/size"] = buffer_sizes[tt]
    row["propose/valid_rate"] = float(np.mean([v.valid for v in checks])) if checks else 0.0
    row["solve/solve_rate"] = float(np.mean([r > 0 for r, _ in verdicts])) if verdicts else 0.0
    row["propose/reward_mean"] = float(np.mean(prop_r)) if prop_r else 0.0
    row["propose/new_in_buffer"] = int(sum(added))
    row.update({f"validate/{k}": v for k, v in status_counts([v.status for v in checks]).items()})
    row.update({f"answers/{k}": v for k, v in status_counts([s for _, s in verdicts]).items()})
    div = diversity([p.program for p in parsed if p.program])
    row.update({f"diversity/{k}": v for k, v in div.items()})
    return row


def save_step_data(out_dir, step, version, types, props, parsed, checks, prop_r, attempts, answers, verdicts,
                   solve_r) -> None:
    """Every data set of the step, tagged with the policy version that produced it."""
    import json

    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()  # two tiny saves per step: the step bar is the progress
    d = Path(out_dir) / "data" / f"step-{step + 1:05d}"
    Dataset.from_list([
        {"policy_version": version, "task_type": tt, "text": c.text, "parse_error": p.error or "",
         "valid": v.valid, "status": v.status, "reason": v.reason, "reward": r,
         "outputs": json.dumps(v.task.outputs) if v.task else ""}
        for tt, c, p, v, r in zip(types, props, parsed, checks, prop_r)]).save_to_disk(str(d / "proposals"))
    Dataset.from_list([
        {"policy_version": version, "task_type": x.task_type, "program": x.program, "inputs": json.dumps(x.inputs),
         "outputs": json.dumps(x.outputs), "source": x.source, "answer": c.text, "status": s, "reward": r}
        for x, c, (_, s), r in zip(attempts, answers, verdicts, solve_r)]).save_to_disk(str(d / "answers"))
