"""Absolute Zero (Zhao et al. 2025): one policy proposes and solves code tasks; the sandboxed
executor is the referee.

The algorithm box and the loop are ``recipes/absolute_zero.py``'s; this module is what the loop
calls: :class:`AbsoluteZeroConfigs`; the fixed held-out set and the seeded task buffers; steps 1-3
of a step (:func:`play_step`: propose, validate, solve, as a :class:`Rollout`) and steps 4-6
(:func:`train_step`: rewards, TRR++ advantages, one update); the held-out evaluation (step 7);
:class:`SharedReferee`, the one referee that the overlapped rollouts and the evaluation share.
"""

from __future__ import annotations

import random
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from lmselfplay.lm.engines import SamplingParams, generate_fitting
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.advantages import task_type_advantages
from lmselfplay.rl.configs import PolicyGradientConfigs
from lmselfplay.rl.rewards import proposer_rewards
from lmselfplay.utils.config import Config, ConfigError, non_negative, positive
from lmselfplay.utils.run import PeriodicCheckpoints
from lmselfplay.utils.stats import wilson
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
    task_key,
)
from lmselfplay.verifiers.executor import ExecutorConfig


@dataclass
class AbsoluteZeroArgs(Config):
    """Absolute Zero's own fields (the loop, proposals, solving, the evaluation); the
    components' fields, the sandbox's among them, are in their own configs
    (:class:`AbsoluteZeroConfigs`)."""

    _argument_group_name = "absolute zero (lmselfplay.rl.absolute_zero.AbsoluteZeroArgs)"
    renamed_keys: ClassVar[dict[str, str]] = {"executor_workers": "max_workers"}
    max_steps: int = field(default=40, metadata={
        "help": "proposer-solver steps (each one trainer.step(); the learning-rate and beta schedules span them)"})
    proposals_per_type: int = field(default=8, metadata={"help": "proposals per task type per step"})
    references: int = field(default=3, metadata={"help": "K buffer tasks shown in each proposal prompt"})
    proposal_style: str = field(default="paper", metadata={
        "help": "paper: the proposer writes program + inputs after K references; io: it writes the program "
                "for one reference's I/O pair and the task takes that reference's inputs (embedded model)"})
    num_generations: int = field(default=4, metadata={"help": "G solver attempts per task"})
    solve_tasks_per_type: int = field(default=8, metadata={"help": "tasks solved per type (topped up from the buffer)"})
    induction_inputs: int = field(default=4, metadata={"help": "inputs per induction task: half shown, half held out"})
    seed_programs: int = field(default=16, metadata={"help": "generated programs seeding each buffer"})
    answer_tags: bool = field(default=False, metadata={
        "help": "ask the solver for <answer>...</answer> (real models); the embedded model answers bare"})
    propose_max_new_tokens: int = field(default=96, metadata={"help": "answer budget of a proposal"})
    solve_max_new_tokens: int = field(default=64, metadata={"help": "answer budget of a solution"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling (behaviour log-probs are before top-p)"})
    format_penalty: float = field(default=-1.0, metadata={"help": "reward of an unparsable proposal or answer"})
    invalid_penalty: float = field(default=-0.5, metadata={"help": "reward of a parsed proposal that fails validation"})
    eval_every: int = field(default=10, metadata={"help": "steps between held-out evaluations"})
    eval_tasks_per_type: int = field(default=200, metadata={"help": "fixed held-out generated tasks per type"})
    save_datasets: bool = field(default=True, metadata={"help": "save each step's proposals and answers (datasets)"})

    def validate(self) -> None:
        positive(self, "max_steps")
        if self.proposal_style not in ("paper", "io") or self.references < 1:
            raise ConfigError(f"proposal_style must be paper or io (got {self.proposal_style!r}) "
                              f"and references >= 1 (got {self.references})")
        positive(self, "proposals_per_type", "num_generations", "solve_tasks_per_type", "induction_inputs",
                 "propose_max_new_tokens", "solve_max_new_tokens", "top_p")
        non_negative(self, "references", "seed_programs", "eval_every", "eval_tasks_per_type")

    def answer_budget(self) -> int:
        """The engine's answer budget (its KV cache is sized for it): the larger of a proposal's and a solution's."""
        return max(self.propose_max_new_tokens, self.solve_max_new_tokens)


@dataclass(frozen=True)
class AbsoluteZeroConfigs(PolicyGradientConfigs):
    """What ``recipes/absolute_zero.py`` parses: the trainer's, policy's, engine's and run's
    configs, its own arguments, the checkpoints' and the sandbox's (``executor``, checked as it
    is parsed, before any model loads). ``defaults`` holds this recipe's sandbox limits."""

    absolute_zero: AbsoluteZeroArgs
    checkpoints: PeriodicCheckpoints
    executor: ExecutorConfig

    defaults = {"output_dir": "runs/absolute_zero", "timeout_s": 1.0, "memory_mb": 512, "max_output_bytes": 16 * 1024}


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


def heldout_tasks(cfg, referee) -> dict[str, list[CodeTask]]:
    """The FIXED evaluation set: eval_tasks_per_type generated tasks per type, from a seed
    stream of their own (the same for every run and --seed, so runs compare); buffers never
    admit them (see :func:`seed_buffers`)."""
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


def seed_buffers(cfg, referee, forbidden: set[str]) -> dict[str, TaskBuffer]:
    """Identity + seed_programs generated programs per type, validated like proposals."""
    rng = random.Random(f"seed/{cfg.trainer.seed}")
    buffers = {tt: TaskBuffer(tt, forbidden) for tt in TASK_TYPES}
    for tt in TASK_TYPES:
        for t in validated(referee, cfg, seed_tasks(tt, rng, cfg.absolute_zero.seed_programs, n_inputs(cfg, tt))):
            buffers[tt].add(t)
    return buffers


def generate(engine, tok, prompts: list[str], cfg, max_new_tokens: int, seed: int, greedy: bool = False):
    """One engine call for all prompts (through THE formatter)."""
    sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0 if greedy else cfg.trainer.temperature,
                        top_p=cfg.absolute_zero.top_p, seed=seed)
    return generate_fitting(engine, [encode_prompt(tok, p) for p in prompts], sp)


def heldout_accuracy(cfg, engine, tok, referee, heldout) -> dict[str, float]:
    """Step 7: greedy accuracy per type on the held-out tasks, with 95% Wilson CIs."""
    items = [t for tt in TASK_TYPES for t in heldout[tt]]
    prompts = [solve_prompt(t, cfg.absolute_zero.answer_tags) for t in items]
    comps = generate(engine, tok, prompts, cfg, cfg.absolute_zero.solve_max_new_tokens, cfg.trainer.seed, greedy=True)
    verdicts = referee.check([(t, c.text) for t, c in zip(items, comps)])
    out = {}
    for tt in TASK_TYPES:
        right = [r > 0 for t, (r, _) in zip(items, verdicts) if t.task_type == tt]
        acc = float(np.mean(right)) if right else float("nan")
        lo, hi = wilson(sum(right), len(right))
        out.update({f"heldout/{tt}/accuracy": acc, f"heldout/{tt}/ci_low": lo, f"heldout/{tt}/ci_high": hi})
    return out


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


def log_eval(cfg, acc, trainer, engine, tok, referee, heldout, logger, step, t0) -> dict[str, float]:
    with trainer.serving(engine):  # every rank evaluates in step (ZeRO-3)
        result = heldout_accuracy(cfg, engine, tok, referee, heldout)
    if acc.is_main_process:
        logger.log(step, {**result, "wall_s": time.time() - t0})
        _plot(logger)
    return result


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
    rng = random.Random(f"{cfg.trainer.seed}/{step}/{acc.process_index}")
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


def _plot(logger):
    keys = [f"heldout/{tt}/accuracy" for tt in TASK_TYPES]
    keys += ["propose/valid_rate", "solve/solve_rate", "propose/reward_mean", "diversity/distinct_ast",
             "time/executor_share"]
    return logger.plot(keys, "curves.png", title="absolute zero")

