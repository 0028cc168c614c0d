"""R-Zero (Huang et al. 2025): a challenger writes questions, a solver learns from its referee.

The algorithm box and the command are ``recipes/r_zero.py``'s; this module is what that box
calls, so that the recipe and the referee study (:mod:`lmselfplay.referee_study`, the same loop
once per referee) run one loop: :class:`RZeroConfigs`; the challenger's reward (uncertainty minus
the BLEU repetition penalty of :mod:`lmselfplay.rl.repetition`) and the filter band; the run
object :class:`RZero` (roles, referee and truth, held-out set); the three phases (challenger
steps, the labelled and filtered pool, solver steps on the referee's labels), the measures
against the truth; the pools and the phase checkpoints; :func:`train`, the loop itself.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from tqdm.auto import tqdm

from lmselfplay.lm.engines import SamplingParams, generate_fitting, make_engine
from lmselfplay.lm.engines.factory import check_sleep_mode_engines
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.lm.trajectory import Sample
from lmselfplay.models.policy import load_policy
from lmselfplay.rl.advantages import group_advantages
from lmselfplay.rl.configs import PolicyGradientConfigs
from lmselfplay.rl.overlap import OverlappedRollouts, rollouts_for, serving_all
from lmselfplay.rl.repetition import diversity, repetition_penalty
from lmselfplay.rl.rewards import proposer_rewards
from lmselfplay.rl.trainer import PolicyTrainer
from lmselfplay.tasks.arithmetic import QUESTION_WRITE_PROMPT, arithmetic_problem, arithmetic_prompt
from lmselfplay.tasks.programs import program_output_prompt, program_write_prompt, python_program
from lmselfplay.tasks.task_sets import is_heldout
from lmselfplay.utils.checkpoint import (
    MARKER,
    atomic_dir,
    checkpoint_dirs,
    commit_dir,
    save_json,
    writing,
)
from lmselfplay.utils.config import Config, ConfigError, non_negative, positive
from lmselfplay.utils.run import Run
from lmselfplay.verifiers.checkable import Question, arithmetic_task, program_task
from lmselfplay.verifiers.executor import ExecutorConfig
from lmselfplay.verifiers.referees import AnswerMatcher, ExecutorReferee, RulesReferee, make_referee

PHASES = ("challenger", "filter", "solver")
STUDY_KEYS = ["study/label_accuracy", "study/reward_accuracy", "study/difficulty", "study/pass_rate",
              "study/diversity", "eval/heldout_accuracy"]


@dataclass
class RZeroArgs(Config):
    """R-Zero's own fields (the tasks, the roles, the phases, the filter, the budgets); the
    components' fields are in their own configs (:class:`RZeroConfigs`)."""

    _argument_group_name = "r_zero (lmselfplay.rl.r_zero.RZeroArgs)"
    renamed_keys: ClassVar[dict[str, str]] = {"iterations": "rounds"}  # beside the trainer's num_iterations
    resume_fixed: ClassVar[frozenset[str]] = frozenset({"task_form", "two_copies", "pool_size"})
    task_form: str = field(default="arithmetic", metadata={"help": "arithmetic | program"})
    referee: str = field(default="vote", metadata={
        "help": "vote | grounded (= rules for arithmetic, executor for programs) | rules | executor | judge"})
    two_copies: bool = field(default=False, metadata={"help": "challenger and solver as two models"})
    challenger_vllm_server_urls: list[str] = field(default_factory=list, metadata={
        "help": "two_copies with engine=vllm-server: the challenger's `vllm serve` URLs (a server holds one model's "
                "weights; vllm_server_urls serve the solver)"})
    challenger_prompt: str = field(default="", metadata={
        "help": "what the challenger is asked (arithmetic); empty: the corpus's word-problem request"})
    rounds: int = field(default=3, metadata={"help": "challenger + filter + solver rounds (each logged as an iteration)"})
    challenger_steps: int = field(default=2, metadata={"help": "challenger updates per iteration"})
    num_questions: int = field(default=32, metadata={"help": "N: questions per challenger step"})
    challenger_group_size: int = field(default=8, metadata={"help": "questions per prompt (GRPO group)"})
    num_answers: int = field(default=10, metadata={"help": "m: solver answers per question"})
    pool_size: int = field(default=64, metadata={"help": "questions written for the filter"})
    filter_low: int = field(default=3, metadata={"help": "keep questions with >= this many votes of m"})
    filter_high: int = field(default=7, metadata={"help": "... and <= this many"})
    solver_steps: int = field(default=4, metadata={"help": "solver updates per iteration"})
    solver_batch: int = field(default=16, metadata={"help": "kept questions per solver step"})
    solver_group_size: int = field(default=8, metadata={"help": "answers per question (GRPO group)"})
    repetition_weight: float = field(default=1.0, metadata={"help": "lambda of the repetition penalty"})
    repetition_threshold: float = field(default=0.5, metadata={"help": "BLEU above which two questions cluster"})
    malformed_reward: float = field(default=-1.0, metadata={"help": "challenger reward of a malformed question"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling (behaviour log-probs are before top-p)"})
    challenger_max_new_tokens: int = field(default=64, metadata={"help": "answer budget of a question"})
    solver_max_new_tokens: int = field(default=40, metadata={"help": "answer budget of a solution"})
    check_timeout_s: float = field(default=2.0, metadata={"help": "time limit of every answer check"})
    heldout_size: int = field(default=100, metadata={"help": "fixed ground-truth questions for eval"})

    def validate(self) -> None:
        positive(self, "rounds", "challenger_steps", "num_questions", "challenger_group_size", "num_answers",
                 "pool_size", "solver_steps", "solver_batch", "solver_group_size", "challenger_max_new_tokens",
                 "solver_max_new_tokens", "check_timeout_s", "top_p")
        non_negative(self, "heldout_size")
        if self.task_form not in ("arithmetic", "program"):
            raise ConfigError(f"task_form must be arithmetic or program, got {self.task_form!r}")
        grounded = {"arithmetic": "rules", "program": "executor"}[self.task_form]
        if self.referee == "grounded":
            self.referee = grounded
        if self.referee in ("rules", "executor") and self.referee != grounded:
            raise ConfigError(f"referee {self.referee!r} cannot check {self.task_form} questions; use {grounded!r}")
        if not 0 <= self.filter_low <= self.filter_high <= self.num_answers:
            raise ConfigError("need 0 <= filter_low <= filter_high <= num_answers")
        if self.num_questions % self.challenger_group_size or self.pool_size % self.challenger_group_size:
            raise ConfigError("num_questions and pool_size must be multiples of challenger_group_size")

    def answer_budget(self) -> int:
        """The engine's answer budget (its KV cache is sized for it): the larger of a question's and a solution's."""
        return max(self.challenger_max_new_tokens, self.solver_max_new_tokens)


@dataclass(frozen=True)
class RZeroConfigs(PolicyGradientConfigs):
    """What ``recipes/r_zero.py`` parses: the trainer's, policy's, engine's and run's configs and
    its own arguments (checkpoints: one per phase)."""

    rzero: RZeroArgs

    defaults = {"output_dir": "runs/r_zero"}

    def validate(self) -> None:
        """Two copies on servers: one set of servers per model, none shared; one policy: one set.
        At most one sleep-mode vLLM engine per process. Programs: the sandbox's settings
        (``LMSELFPLAY_SANDBOX``) are checked here, before any model loads."""
        args, engine = self.rzero, self.engine
        if args.task_form == "program":
            ExecutorConfig()
        mine = engine.engine == "vllm-server" and args.two_copies
        if args.challenger_vllm_server_urls and not mine:
            raise ConfigError("challenger_vllm_server_urls serve the challenger of two_copies with engine vllm-server; "
                              "one policy uses vllm_server_urls for both roles")
        if mine and not args.challenger_vllm_server_urls:
            raise ConfigError("two_copies with engine vllm-server needs challenger_vllm_server_urls: the challenger "
                              "and the solver are two models, and a server holds one model's weights")
        shared = sorted(set(args.challenger_vllm_server_urls) & set(engine.vllm_server_urls or []))
        if mine and shared:
            raise ConfigError(f"challenger_vllm_server_urls and vllm_server_urls share {shared}: "
                              "a server holds one model's weights")
        check_sleep_mode_engines(engine, 2 if args.two_copies else 1)


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



# --- the run: models, referees, data --------------------------------------------------------

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
        truth_cls = RulesReferee if cfg.rzero.task_form == "arithmetic" else ExecutorReferee
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
                                surrogate=cfg.surrogate)
        engine_cfg = cfg.engine
        if server_urls:  # the same settings, this role's servers (a copy: validated already)
            engine_cfg = copy.copy(cfg.engine)
            engine_cfg.vllm_server_urls = list(server_urls)
        return Role(trainer, make_engine(engine_cfg, trainer.unwrapped, tok, answer_budget=cfg.rzero.answer_budget(),
                                         temperature=cfg.trainer.temperature, top_p=cfg.rzero.top_p,
                                         seed=cfg.trainer.seed))

    def roles(self) -> list[tuple[str, Role]]:
        return [("policy", self.solver)] if self.challenger is self.solver else \
            [("challenger", self.challenger), ("solver", self.solver)]

    def sampling(self, max_new_tokens: int, *key: Any, greedy: bool = False) -> SamplingParams:
        seed = hash((self.cfg.trainer.seed, self.acc.process_index) + key) % (2**31)
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0 if greedy else self.cfg.trainer.temperature,
                              top_p=self.cfg.rzero.top_p, seed=seed)

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
    """The fixed held-out set: generated ground-truth questions of the held-out bucket
    (:func:`~lmselfplay.tasks.task_sets.is_heldout`, the split every training stream of the
    project skips, the embedded model's corpus included), drawn by a stream of their own."""
    rng = random.Random(f"heldout/{cfg.trainer.seed}")
    out: list[Question] = []
    while len(out) < cfg.rzero.heldout_size:
        i = len(out)
        if cfg.rzero.task_form == "arithmetic":
            p = arithmetic_problem(rng)
            if is_heldout(p["prompt"]):
                out.append(Question(f"heldout-{i}", "arithmetic", arithmetic_prompt(p), p["prompt"], answer=p["final"]))
        else:
            t = python_program(rng)
            if is_heldout(t["code"] + t["input"]):
                out.append(Question(f"heldout-{i}", "program", program_output_prompt(t), t["code"], answer=t["output"]))
    return out


def challenger_prompts(cfg: RZeroConfigs, rng: random.Random, n: int) -> list[tuple[str, str]]:
    """(prompt, context) per question, challenger_group_size questions per prompt. Programs:
    the prompt asks for an f matching a seed input/output pair; the seed input is the
    input of the question (context)."""
    out = []
    for _ in range(n // cfg.rzero.challenger_group_size):
        if cfg.rzero.task_form == "arithmetic":
            item = (cfg.rzero.challenger_prompt or QUESTION_WRITE_PROMPT, "")
        else:
            seed = python_program(rng)
            item = (program_write_prompt(seed), seed["input"])
        out += [item] * cfg.rzero.challenger_group_size
    return out


def to_task(cfg: RZeroConfigs, task_id: str, text: str, context: str) -> tuple[Question | None, str | None]:
    if cfg.rzero.task_form == "arithmetic":
        return arithmetic_task(task_id, text, lambda q: arithmetic_prompt({"prompt": q}))
    return program_task(task_id, text, context,
                        lambda code, arg: program_output_prompt({"code": code, "input": arg}))


def write_and_answer(rz: RZero, n: int, key: tuple) -> dict[str, Any]:
    """The challenger writes ``n`` questions; the ones in a checkable form (and, for
    programs, that the executor can run) are answered m times by the solver; the referee
    and the truth score every answer. Returns per-question columns (malformed: empty)."""
    cfg = rz.cfg
    rng = random.Random(hash((cfg.trainer.seed, rz.acc.process_index) + key))
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
    pen[well] = repetition_penalty([t.question for t in batch["tasks"] if t is not None],
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


def build_pool(rz: RZero, it: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Step 2: write the pool, label it, filter it; the records and the study measures."""
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
    return records, pool_measures(records)


def pool_measures(records: list[dict[str, Any]]) -> dict[str, float]:
    """Step 4, from the pool: label accuracy on the kept questions (the ones the loop
    trains on) and on all checkable ones, difficulty (true solve rate), pass rate,
    diversity, malformed share."""
    well = [r for r in records if r["well_formed"] and r["truth"]]
    kept = [r for r in well if r["kept"]]
    mean = lambda xs: float(np.mean(xs)) if xs else float("nan")  # noqa: E731
    return {"study/label_accuracy": mean([r["label_correct"] for r in kept]), "study/n_kept": len(kept),
            "study/label_accuracy_all": mean([r["label_correct"] for r in well if r["label"]]),
            "study/n_labelled": sum(bool(r["label"]) for r in well),
            "study/label_correct_kept": sum(r["label_correct"] for r in kept),
            "study/difficulty": mean([r["true_solve_rate"] for r in well]),
            "study/pass_rate": len(kept) / len(well) if well else float("nan"),
            "study/diversity": diversity([r["question"] for r in well]),
            "study/malformed": 1 - len(well) / len(records) if records else float("nan")}


def solver_plan(rz: RZero, kept: list[dict[str, Any]], it: int):
    """``step -> play``: solver_batch kept questions (seeded by seed, rank, iteration, step),
    solver_group_size answers each; ``play()`` returns (questions, answers, version), or None
    when this rank kept nothing."""
    cfg = rz.cfg

    def at(step: int):
        if not kept:
            return lambda: None
        rng = random.Random(hash((cfg.trainer.seed, rz.acc.process_index, it, 2, step)))
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


def heldout_accuracy(rz: RZero, it: int) -> dict[str, float]:
    """Step 4: the solver's greedy accuracy on the fixed held-out set."""
    with rz.serving(rz.solver):
        comps = rz.generate(rz.solver, [t.prompt for t in rz.heldout],
                             rz.sampling(rz.cfg.rzero.solver_max_new_tokens, it, 3, greedy=True))
    v = rz.truth.score(rz.heldout, [c.text for c in comps])
    right = sum(x.reward for x in v)
    return {"eval/heldout_accuracy": right / max(len(v), 1), "eval/heldout_right": right, "eval/heldout_n": len(v)}


# --- data and checkpoints ----------------------------------------------------------------------

def pool_dir(out: Path, it: int, rank: int) -> Path:
    """``data/iteration-K`` (every rank writes and answers its own questions: rank r > 0
    keeps its pool in ``data/iteration-K-rank-r``)."""
    return out / "data" / (f"iteration-{it}" if rank == 0 else f"iteration-{it}-rank-{rank}")


def save_pool(path: Path, records: list[dict[str, Any]]) -> Path:
    """The iteration's questions, answers, labels and agreement as a `datasets` folder (atomic)."""
    import datasets

    with atomic_dir(path) as tmp:
        datasets.Dataset.from_list(records).save_to_disk(str(tmp / "pool"))
    return path


def load_kept(path: Path) -> list[dict[str, Any]]:
    import datasets

    return [r for r in datasets.load_from_disk(str(path / "pool")) if r["kept"]]


def save_phase(rz: RZero, it: int, phase: int) -> None:
    """An atomic checkpoint after phase ``phase`` of iteration ``it``: every role's trainer
    state + the progress; the dir name orders them (phase-IIII-P)."""
    acc, out = rz.acc, rz.out
    final, tmp = out / f"phase-{it:04d}-{phase}", out / f".phase-{it:04d}-{phase}.tmp"
    with writing(final, tmp, remove_tmp=acc.is_main_process):
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        for name, role in rz.roles():
            role.trainer.save_checkpoint(tmp / name, keep=1)
        if acc.is_main_process:
            save_json(tmp / "progress.json", {"iteration": it, "phase": phase, "global_step": rz.global_step,
                                              "bad": dict(rz.bad)})
            commit_dir(tmp, final)  # the marker holds every file's digest
            for old in phase_dirs(out)[:-2]:
                shutil.rmtree(old, ignore_errors=True)
    acc.wait_for_everyone()


def phase_dirs(out: Path) -> list[Path]:
    """Complete phase checkpoints (marker present, not verified), oldest first."""
    return sorted(p for p in out.glob("phase-*") if (p / MARKER).exists())


def resume(rz: RZero) -> tuple[int, int]:
    """(iteration, next phase) from the run's phase checkpoint; (1, 0) when it starts fresh."""
    last = rz.run.checkpoint
    if last is None:
        rz.run.report_start(1, "iteration")
        return 1, 0
    progress = json.loads((last / "progress.json").read_text())
    for name, role in rz.roles():  # each engine keeps its version: the first serving pushes the restored weights
        role.trainer.load_checkpoint(checkpoint_dirs(last / name)[-1])
    rz.global_step, rz.bad = progress["global_step"], Counter(progress["bad"])
    it, phase = progress["iteration"], progress["phase"] + 1
    rz.run.report_start(f"{it}, phase {PHASES[phase] if phase < 3 else 'next'}", "iteration")
    return (it + 1, 0) if phase == len(PHASES) else (it, phase)


# --- the loop ------------------------------------------------------------------------------------

def train(cfg: RZeroConfigs) -> Path:
    """Run R-Zero with ``cfg``; returns the metrics JSONL path. The checker and sandbox
    processes end with it, also on error."""
    with Run(cfg.run, cfg.as_dict(), resume_fixed=cfg.fixed_on_resume(),
             gradient_accumulation_steps=cfg.trainer.gradient_accumulation_steps,
             checkpoints=phase_dirs) as run:
        return loop(run.closing(RZero(cfg, run)))


def loop(rz: RZero) -> Path:
    """Steps 1-4 for every iteration, from where a resumed run stopped."""
    cfg, acc, out = rz.cfg, rz.acc, rz.out
    start_it, start_phase = resume(rz)
    resumed = rz.run.checkpoint is not None
    logger = rz.run.open_log(rz.global_step if resumed else None)
    log = rz.run.log
    t0 = time.time()
    bar = tqdm(total=cfg.rzero.rounds * len(PHASES), initial=(start_it - 1) * len(PHASES) + start_phase,
               desc=f"r-zero ({cfg.rzero.referee})", disable=not acc.is_main_process)
    try:
        if not resumed:
            log(0, {"iteration": 0, **heldout_accuracy(rz, 0), "wall_s": 0.0})
        for it in range(start_it, cfg.rzero.rounds + 1):
            first = start_phase if it == start_it else 0
            # 1: challenger phase
            if first <= 0:  # max_staleness >= 1: a step's questions are written while the previous one trains
                with closing(rz.rollouts(rz.challenger, challenger_plan(rz, it), others=(rz.solver,))) as rollouts:
                    for step in range(cfg.rzero.challenger_steps):
                        log(rz.global_step + 1, {"iteration": it, **challenger_step(rz, rollouts, step)})
                save_phase(rz, it, 0)
                bar.update(1)
            # 2: filter; 4: the pool saved with `datasets`, its measures logged
            if first <= 1:
                records, measures = build_pool(rz, it)
                save_pool(pool_dir(out, it, acc.process_index), records)
                log(rz.global_step, {"iteration": it, **measures, **{f"bad/{k}": v for k, v in rz.bad.items()},
                                      "checker_timeouts": rz.matcher.math.timeouts, "wall_s": time.time() - t0})
                save_phase(rz, it, 1)
                bar.update(1)
            # 3: solver phase on the kept questions and their labels
            kept = load_kept(pool_dir(out, it, acc.process_index))
            study = Counter()
            # every rank makes the same number of updates (collectives); alone, none without data
            with closing(rz.rollouts(rz.solver, solver_plan(rz, kept, it))) as rollouts:
                for step in range(cfg.rzero.solver_steps if kept or acc.num_processes > 1 else 0):
                    row = solver_step(rz, rollouts, step)
                    study.update({k: row.get(k, 0) for k in ("study/n_rewards", "study/rewards_right")})
                    log(rz.global_step, {"iteration": it, **row})
            # 4: measures of the iteration, held-out accuracy, checkpoint
            log(rz.global_step, {"iteration": it, **heldout_accuracy(rz, it), "study/reward_accuracy_iteration":
                                  study["study/rewards_right"] / study["study/n_rewards"]
                                  if study["study/n_rewards"] else float("nan"), "wall_s": time.time() - t0})
            save_phase(rz, it, 2)
            bar.update(1)
            if logger:
                logger.plot(STUDY_KEYS + ["challenger/reward", "solver/reward", "solver/true_accuracy"],
                            "curves.png", title=f"R-Zero ({cfg.rzero.task_form}, referee {cfg.rzero.referee})")
        save_final(rz)
    finally:
        bar.close()
    return out / "metrics.jsonl"


def save_final(rz: RZero) -> None:
    """The trained model(s) as plain HF folders: final_model (the solver / the one policy)
    and, with two copies, final_challenger."""
    for name, role in rz.roles():
        rz.run.save_final_model(role.trainer.model, role.trainer.unwrapped, rz.tok,
                                      "final_challenger" if name == "challenger" else "final_model")

