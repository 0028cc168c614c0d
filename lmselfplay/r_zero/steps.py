"""The steps of R-Zero (Huang et al. 2025), the algorithm of ``recipes/r_zero.py``, whose docstring
is its box (steps 1-4): a challenger writes questions, a solver learns from its referee.

What the loop works on is one :class:`RZero` (roles, referee and truth, held-out set, counters);
the steps are functions of it:

* the questions: :func:`write_and_answer` (the challenger writes, the solver answers m times,
  the referee and the truth score every answer), :func:`heldout_tasks` (the fixed held-out set
  the loop never trains on);
* step 1, challenger: :func:`challenger_plan`, :func:`challenger_step` (:func:`challenger_rewards`:
  uncertainty minus the BLEU repetition penalty of :mod:`lmselfplay.rl.repetition`);
* step 2, filter: :func:`build_pool` (the labelled pool, kept by :func:`in_band`);
* step 3, solver: :func:`solver_plan`, :func:`solver_step` (on the referee's labels).

Its configs are :mod:`lmselfplay.r_zero.config`, its pools and phase checkpoints
:mod:`lmselfplay.r_zero.checkpoints`, its measures (step 4) :mod:`lmselfplay.r_zero.metrics`:
the steps never import the measures.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmselfplay.lm.engines import SamplingParams, generate_fitting, make_engine
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.lm.trajectory import Sample
from lmselfplay.models.policy import load_policy
from lmselfplay.r_zero.config import TASK_SETS, RZeroConfigs
from lmselfplay.rl.advantages import group_advantages
from lmselfplay.rl.overlap import OverlappedRollouts, rollouts_for, serving_all
from lmselfplay.rl.repetition import repetition_penalty
from lmselfplay.rl.rewards import proposer_rewards
from lmselfplay.rl.trainer import PolicyTrainer
from lmselfplay.tasks.answer_formats import with_instruction
from lmselfplay.tasks.arithmetic import QUESTION_WRITE_PROMPT, arithmetic_prompt
from lmselfplay.tasks.programs import program_output_prompt, program_write_prompt, python_program
from lmselfplay.tasks.sums import (
    SUM_WRITE_PROMPT,
    sum_expression,
    sum_question,
)
from lmselfplay.tasks.task_sets import TaskSet, is_heldout
from lmselfplay.utils.run import Run
from lmselfplay.verifiers.checkable import Question, arithmetic_task, program_task, question_problem
from lmselfplay.verifiers.referees import AnswerMatcher, ExecutorReferee, RulesReferee, make_referee

PHASES = ("challenger", "filter", "solver")


# --- the challenger's reward and the filter -----------------------------------------------------

def challenger_rewards(outcomes: np.ndarray, well_formed: np.ndarray, penalty: np.ndarray,
                       malformed_reward: float) -> np.ndarray:
    """Per question: max(0, 1 - 2|p - 1/2| - penalty) when well-formed, with p the share of
    its m answers the referee rewarded (``outcomes`` (n, m) of 0/1); malformed_reward otherwise."""
    u = proposer_rewards(outcomes).uncertainty
    return np.where(well_formed, np.maximum(0.0, u - penalty), malformed_reward)


def in_band(votes: np.ndarray, low: int, high: int) -> np.ndarray:
    """Step 2's filter: low <= votes <= high (votes out of m for the referee's label)."""
    v = np.asarray(votes)
    return (v >= low) & (v <= high)


# --- the run: models, referees, questions --------------------------------------------------------

WRITE_PROMPTS = {"arithmetic": QUESTION_WRITE_PROMPT, "sum": SUM_WRITE_PROMPT}  # what the challenger is asked

@dataclass
class Role:
    trainer: PolicyTrainer
    engine: Any  # cfg.engine: hf | vllm | vllm-server


class RZero:
    """Everything one R-Zero run holds: roles, referees, held-out set, counters; on the
    processes and folder of ``run`` (the recipes' :class:`~lmselfplay.utils.run.Run`)."""

    def __init__(self, cfg: RZeroConfigs, run: Run):
        self.cfg = cfg
        self.run = run
        self.acc, self.out = run.acc, run.out
        per_iter = cfg.rzero.challenger_steps + cfg.rzero.solver_steps
        if cfg.rzero.two_copies:
            self.challenger = self._role(cfg, cfg.rzero.rounds * cfg.rzero.challenger_steps,
                                         cfg.rzero.challenger_vllm_server_urls)
            self.solver = self._role(cfg, cfg.rzero.rounds * cfg.rzero.solver_steps)
        else:
            self.challenger = self.solver = self._role(cfg, cfg.rzero.rounds * per_iter)
        self.tok = self.solver.trainer.tokenizer
        self.matcher = AnswerMatcher(timeout_s=cfg.rzero.check_timeout_s)
        truth_cls = ExecutorReferee if cfg.rzero.task_form == "program" else RulesReferee
        self.truth = truth_cls(matcher=self.matcher)  # the study's ground truth
        self.referee = self.truth if cfg.rzero.referee == self.truth.provenance else \
            make_referee(cfg.rzero.referee, matcher=self.matcher)
        self.heldout = heldout_tasks(cfg)
        self.heldout_questions = {t.question for t in self.heldout}
        self.bad: Counter = Counter()  # bad input, by kind, over the whole run
        self.global_step = 0

    def _role(self, cfg: RZeroConfigs, total_steps: int, server_urls: list[str] | None = None) -> Role:
        """A model, its trainer (its schedules span ``total_steps`` updates) and its engine
        (``server_urls``: this role's own servers)."""
        model, tok = load_policy(cfg.policy, device=str(self.acc.device))
        trainer = PolicyTrainer(model, tok, cfg.trainer, accelerator=self.acc, total_steps=total_steps,
                                surrogate=cfg.surrogate, temperature=cfg.sampling.temperature, seed=cfg.run.seed)
        engine_cfg = cfg.engine
        if server_urls:  # the same settings, this role's servers (a copy: validated already)
            engine_cfg = copy.copy(cfg.engine)
            engine_cfg.vllm_server_urls = list(server_urls)
        return Role(trainer, make_engine(engine_cfg, trainer.unwrapped, tok, answer_budget=cfg.rzero.answer_budget(),
                                         temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                                         seed=cfg.run.seed))

    def roles(self) -> list[tuple[str, Role]]:
        return [("policy", self.solver)] if self.challenger is self.solver else \
            [("challenger", self.challenger), ("solver", self.solver)]

    def sampling(self, max_new_tokens: int, *key: Any, greedy: bool = False) -> SamplingParams:
        seed = hash((self.cfg.run.seed, self.acc.process_index) + key) % (2**31)
        return self.cfg.sampling.params(max_new_tokens, seed, greedy)

    def generate(self, role: Role, prompts: list[str], sampling: SamplingParams):
        """``role``'s answers, from the weights its engine serves (inside :meth:`serving`)."""
        return generate_fitting(role.engine, [encode_prompt(self.tok, p) for p in prompts], sampling)

    @contextmanager
    def serving(self, *roles: Role) -> Iterator[None]:
        """Inside, the engine of every role in ``roles`` (default: all) serves its trainer's
        current weights."""
        with serving_all([(role.trainer, role.engine) for role in roles or [r for _, r in self.roles()]]):
            yield

    def rollouts(self, role: Role, plan, others: tuple[Role, ...] = ()) -> OverlappedRollouts:
        """A phase's rollouts for ``role``'s updates (``max_staleness``), generated with the weights
        of ``role`` and ``others`` (served before each step's generation)."""
        return rollouts_for(self.cfg.overlap.max_staleness, role.trainer, role.engine, plan, also=[(r.trainer, r.engine) for r in others])

    def update(self, role: Role, samples: list[Sample]) -> dict[str, float]:
        metrics = role.trainer.step(samples, engine=role.engine)
        self.global_step += 1
        return metrics

    def close(self) -> None:
        for _, role in self.roles():
            if hasattr(role.engine, "close"):
                role.engine.close()
        self.matcher.close()
        for r in (self.truth, self.referee):
            if hasattr(r, "close"):
                r.close()


def heldout_tasks(cfg: RZeroConfigs) -> list[Question]:
    """The fixed held-out set: the held-out items of the form's task set (:data:`TASK_SETS`; for
    generated questions the held-out bucket that every training stream of the project skips, the
    embedded model's corpus included), the set the referee study's fixed arm evaluates too."""
    if cfg.rzero.task_form == "program":
        return program_heldout(cfg.rzero.heldout_size, cfg.run.seed)
    spec, settings = TASK_SETS[cfg.rzero.task_form]
    items = TaskSet(spec, cfg.rzero.heldout_size, task_config=settings, heldout_seed=cfg.run.seed).heldout
    return [Question(f"heldout-{i}", cfg.rzero.task_form, t.prompt, t.question, answer=t.answer)
            for i, t in enumerate(items)]


def program_heldout(n: int, seed: int) -> list[Question]:
    """The program task set's held-out items (the same draws as :class:`TaskSet`'s), each question
    the program alone, as a challenger's program question is (the held-out exclusion compares them)."""
    rng = random.Random(f"heldout/{seed}")
    out: list[Question] = []
    while len(out) < n:
        t = python_program(rng)
        if is_heldout(t["code"] + t["input"]):
            out.append(Question(f"heldout-{len(out)}", "program", program_output_prompt(t), t["code"], answer=t["output"]))
    return out


def sum_task(task_id: str, text: str) -> tuple[Question | None, str | None]:
    """(Question, None) when ``text`` is a sum of three one-digit numbers; (None, reason) otherwise."""
    problem = question_problem(text)
    if problem:
        return None, problem
    expression = sum_expression(text)
    if expression is None:
        return None, "not_a_question"
    question = sum_question(expression)
    return Question(task_id, "sum", with_instruction(question, "answer"), question, expression=expression), None


def written_text(task_form: str, question: str, expression: str | None) -> str:
    """What the challenger wrote, the text its repetition penalty and the pool's diversity compare:
    the sum itself for sums (their question sets every sum in one template, so that any two
    questions would read as repeats); the question for the other forms."""
    return (expression or "") if task_form == "sum" else question


def challenger_prompts(cfg: RZeroConfigs, rng: random.Random, n: int) -> list[tuple[str, str]]:
    """(prompt, context) per question, challenger_group_size questions per prompt. Programs:
    the prompt asks for an f matching a seed input/output pair; the seed input is the
    input of the question (context)."""
    out = []
    for _ in range(n // cfg.rzero.challenger_group_size):
        if cfg.rzero.task_form != "program":
            item = (cfg.rzero.challenger_prompt or WRITE_PROMPTS[cfg.rzero.task_form], "")
        else:
            seed = python_program(rng)
            item = (program_write_prompt(seed), seed["input"])
        out += [item] * cfg.rzero.challenger_group_size
    return out


def to_task(cfg: RZeroConfigs, task_id: str, text: str, context: str) -> tuple[Question | None, str | None]:
    if cfg.rzero.task_form == "arithmetic":
        return arithmetic_task(task_id, text, lambda q: arithmetic_prompt({"prompt": q}))
    if cfg.rzero.task_form == "sum":
        return sum_task(task_id, text)
    return program_task(task_id, text, context,
                        lambda code, arg: program_output_prompt({"code": code, "input": arg}))


def write_and_answer(rz: RZero, n: int, key: tuple) -> dict[str, Any]:
    """The challenger writes ``n`` questions; the ones in a checkable form (and, for
    programs, that the executor can run) are answered m times by the solver; the referee
    and the truth score every answer. Returns per-question columns (malformed: empty)."""
    cfg = rz.cfg
    rng = random.Random(hash((cfg.run.seed, rz.acc.process_index) + key))
    prompts = challenger_prompts(cfg, rng, n)
    written = rz.generate(rz.challenger, [p for p, _ in prompts], rz.sampling(cfg.rzero.challenger_max_new_tokens, *key, 0))
    tasks, reasons = [], []
    for i, (c, (_, ctx)) in enumerate(zip(written, prompts)):
        task, reason = to_task(cfg, "-".join(map(str, (*key, i))), c.text, ctx)
        if task is not None and task.question in rz.heldout_questions:
            task, reason = None, "heldout"  # never train on the held-out set
        tasks.append(task)
        reasons.append(reason)
    truth = rz.truth.truths([t for t in tasks if t is not None])
    for i, t in enumerate(tasks):
        if t is not None and truth[t.id] is None:  # e.g. a program that crashes: not a question
            tasks[i], reasons[i] = None, "uncheckable"
    rz.bad.update(r for r in reasons if r)
    ok = [t for t in tasks if t is not None]
    flat = [t for t in ok for _ in range(cfg.rzero.num_answers)]
    answers = rz.generate(rz.solver, [t.prompt for t in flat], rz.sampling(cfg.rzero.solver_max_new_tokens, *key, 1))
    texts = [a.text for a in answers]
    verdicts = rz.referee.score(flat, texts)
    truths = rz.truth.score(flat, texts) if rz.referee is not rz.truth else verdicts
    for v in verdicts:
        rz.bad["no_answer"] += v.detail.get("no_answer", False)
        rz.bad["multiple_answers"] += v.detail.get("multiple_answers", False)
    return {"written": written, "tasks": tasks, "reasons": reasons,
            **per_question(cfg.rzero.num_answers, tasks, texts, verdicts, truths)}


def per_question(m: int, tasks: list[Question | None], texts: list[str], verdicts, truths) -> dict[str, list]:
    """Columns per question from the flat (m per well-formed question) answers: the
    referee's 0/1 rewards, votes (their sum), label; the truth and the true solve rate."""
    cols: dict[str, list] = {c: [] for c in ("texts", "finals", "rewards", "votes", "label", "truth", "solve_rate")}
    k = 0
    for t in tasks:
        if t is None:
            for c, v in zip(cols, ([], [], [], -1, None, None, float("nan"))):
                cols[c].append(v)
            continue
        vs, ts = verdicts[k : k + m], truths[k : k + m]
        cols["texts"].append(texts[k : k + m])
        k += m
        cols["finals"].append([v.detail.get("final") for v in vs])
        cols["rewards"].append([int(v.reward) for v in vs])
        cols["votes"].append(sum(int(v.reward) for v in vs))
        cols["label"].append(vs[0].label)
        cols["truth"].append(ts[0].label)
        cols["solve_rate"].append(float(np.mean([v.reward for v in ts])))
    return cols


def samples_of(completions, advantages, rewards, role: str, version: int) -> list[Sample]:
    """The trained samples; each with the weight version it was sampled with (the server's
    record, else ``version``: the engine's when the generation started)."""
    return [Sample(c.prompt_ids, c.token_ids, c.logprobs, float(a), float(r), role, "r_zero",
                   version if c.version is None else c.version)
            for c, a, r in zip(completions, advantages, rewards) if c.token_ids]


# --- the three phases -----------------------------------------------------------------------

def challenger_plan(rz: RZero, it: int):
    """``step -> play``: the challenger's questions and the solver's answers of challenger step
    ``step`` (with the version the challenger's engine served when they were written)."""
    def at(step: int):
        def play():
            version = rz.challenger.engine.version
            return write_and_answer(rz, rz.cfg.rzero.num_questions, (it, 0, step)), version
        return play
    return at


def challenger_step(rz: RZero, rollouts: OverlappedRollouts, step: int) -> dict[str, float]:
    """Step 1: one challenger update on the step's questions (played by ``rollouts``)."""
    cfg = rz.cfg
    batch, version = rollouts.next(step, cfg.rzero.challenger_steps - 1)
    well = np.array([t is not None for t in batch["tasks"]])
    pen = np.zeros(len(well))
    pen[well] = repetition_penalty([written_text(cfg.rzero.task_form, t.question, t.expression)
                                    for t in batch["tasks"] if t is not None],
                                   cfg.rzero.repetition_threshold, cfg.rzero.repetition_weight)
    outcomes = np.array([r if r else [0] * cfg.rzero.num_answers for r in batch["rewards"]], dtype=int)
    rewards = challenger_rewards(outcomes, well, pen, cfg.rzero.malformed_reward)
    adv = group_advantages(rewards.reshape(-1, cfg.rzero.challenger_group_size)).reshape(-1)
    samples, stale = rollouts.keep(samples_of(batch["written"], adv, rewards, "challenger", version),
                                   rz.challenger.trainer.step_count)
    metrics = rz.update(rz.challenger, samples)
    return {**{f"challenger/{k}": v for k, v in metrics.items()}, **stale, "challenger/reward": float(rewards.mean()),
            "challenger/well_formed": float(well.mean()),
            "challenger/repetition_penalty": float(pen[well].mean()) if well.any() else 0.0,
            "challenger/referee_p": float(outcomes[well].mean()) if well.any() else float("nan")}


def build_pool(rz: RZero, it: int) -> list[dict[str, Any]]:
    """Step 2: write the pool, label it, filter it; one record per question."""
    cfg = rz.cfg
    with rz.serving():
        b = write_and_answer(rz, cfg.rzero.pool_size, (it, 1, 0))
    records = []
    for i, t in enumerate(b["tasks"]):
        label, truth = b["label"][i], b["truth"][i]
        records.append({
            "id": t.id if t else f"{it}-1-0-{i}", "iteration": it, "kind": cfg.rzero.task_form,
            "question": t.question if t else b["written"][i].text, "prompt": t.prompt if t else "",
            "expression": (t.expression or "") if t else "", "code": (t.code or "") if t else "",
            "well_formed": t is not None, "reason": b["reasons"][i] or "", "answers": b["texts"][i],
            "finals": [f or "" for f in b["finals"][i]], "label": label or "", "truth": truth or "",
            "votes": b["votes"][i], "agreement": b["votes"][i] / cfg.rzero.num_answers if t else 0.0,
            "true_solve_rate": b["solve_rate"][i],
            "kept": bool(t is not None and label is not None
                         and in_band(b["votes"][i], cfg.rzero.filter_low, cfg.rzero.filter_high)),
            "label_correct": bool(t is not None and rz.matcher.matches(cfg.rzero.task_form, label, truth))})
    return records


def solver_plan(rz: RZero, kept: list[dict[str, Any]], it: int):
    """``step -> play``: solver_batch kept questions (seeded by seed, rank, iteration, step),
    solver_group_size answers each; ``play()`` returns (questions, answers, version), or None
    when this rank kept nothing."""
    cfg = rz.cfg

    def at(step: int):
        if not kept:
            return lambda: None
        rng = random.Random(hash((cfg.run.seed, rz.acc.process_index, it, 2, step)))
        batch = [kept[i % len(kept)] for i in rng.sample(range(max(len(kept), cfg.rzero.solver_batch)), cfg.rzero.solver_batch)]
        flat = [r for r in batch for _ in range(cfg.rzero.solver_group_size)]
        sampling = rz.sampling(cfg.rzero.solver_max_new_tokens, it, 2, step)

        def play():
            version = rz.solver.engine.version
            return flat, rz.generate(rz.solver, [r["prompt"] for r in flat], sampling), version
        return play
    return at


def solver_step(rz: RZero, rollouts: OverlappedRollouts, step: int) -> dict[str, float]:
    """Step 3: one solver update on a batch of kept questions against their labels."""
    cfg = rz.cfg
    played = rollouts.next(step, cfg.rzero.solver_steps - 1)
    if played is None:  # this rank kept nothing but the others did: a zero-loss step keeps them in line
        _, stale = rollouts.keep([], rz.solver.trainer.step_count)  # every rank counts (a collective)
        return {**{f"solver/{k}": v for k, v in rz.update(rz.solver, []).items()}, **stale}
    flat, comps, version = played
    g = cfg.rzero.solver_group_size
    finals = [rz.matcher.final(cfg.rzero.task_form, c.text)[0] for c in comps]
    rewards = np.array([float(rz.matcher.matches(cfg.rzero.task_form, f, r["label"])) for f, r in zip(finals, flat)])
    right = np.array([float(rz.matcher.matches(cfg.rzero.task_form, f, r["truth"])) for f, r in zip(finals, flat)])
    adv = group_advantages(rewards.reshape(-1, g)).reshape(-1)
    samples, stale = rollouts.keep(samples_of(comps, adv, rewards, "solver", version), rz.solver.trainer.step_count)
    metrics = rz.update(rz.solver, samples)
    return {**{f"solver/{k}": v for k, v in metrics.items()}, **stale, "solver/reward": float(rewards.mean()),
            "solver/true_accuracy": float(right.mean()), "study/reward_accuracy": float((rewards == right).mean()),
            "study/n_rewards": len(rewards), "study/rewards_right": int((rewards == right).sum())}
