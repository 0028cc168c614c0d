"""Referees behind one interface: ``score(tasks, answers) -> list[Verdict]``, batched.

``tasks[i]`` and ``answers[i]`` are parallel: one verdict per answer. Several answers to
the same task (same ``Question.id``) form a group, which the vote needs. A verdict says the
reward of that answer, the referee's ``label`` for its task (the answer it holds true; None
when it cannot say), what decided (``provenance``) and a ``detail`` dict.

Provenance (:data:`PROVENANCES`): ``rules`` (the task's own checker: a known answer or a
safely evaluated expression), ``executor`` (the sandbox ran the program), ``vote`` (the
solver's own majority over its m answers, R-Zero / TTRL), ``judge`` (a model judge, filled
by the debate recipe through :func:`register_referee`), ``data`` (a reference answer).

Answers are the solver's full texts; :func:`extract_final_answer` takes the final answer
out of them (the last ``#### N`` or ``\\boxed{...}``: several marked answers -> the last one
counts and ``detail["multiple_answers"]`` says so; none -> a non-answer, reward 0, never
part of a majority).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lmselfplay.games.text import visible_answer_text
from lmselfplay.verifiers.answers import count_final_marks, extract_final, extract_tag
from lmselfplay.verifiers.checkable import Question, format_value, safe_eval
from lmselfplay.verifiers.math_equivalence import MathEquivalence
from lmselfplay.verifiers.vote import majority_agreement

PROVENANCES = ("rules", "executor", "vote", "judge", "data")


@dataclass
class Verdict:
    reward: float
    label: str | None  # the referee's answer for the task (truth or pseudo-label)
    provenance: str
    detail: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Referee(Protocol):
    """What every referee offers; ``provenance`` is one of :data:`PROVENANCES`."""

    provenance: str

    def score(self, tasks: Sequence[Question], answers: Sequence[str]) -> list[Verdict]: ...


def extract_final_answer(text: object) -> tuple[str | None, int]:
    """(the last marked final answer, how many marked answers there were): the ``final``
    rule of :mod:`lmselfplay.verifiers.answers`."""
    return extract_final(text), count_final_marks(text)


def program_answer(text: object) -> str | None:
    """A program-output answer: the marked final answer, else the first non-empty line of
    the visible answer (after any think block; none while it is open)."""
    marked, _ = extract_final_answer(text)
    if marked is not None or not isinstance(text, str):
        return marked
    text = visible_answer_text(text)
    return None if text is None else next((ln.strip() for ln in text.splitlines() if ln.strip()), None)


def literal_key(text: str | None, max_chars: int = 200) -> str | None:
    """Canonical form of a printed Python value (``"[1,2]"`` == ``"[1, 2]"``); raw text when
    it is not a literal; None for a non-answer. Length-bounded before parsing."""
    if text is None or not text.strip() or len(text) > max_chars:
        return None
    try:
        return repr(ast.literal_eval(text.strip()))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text.strip()


TAGGED_KINDS = ("sum",)  # question kinds answered between <answer> tags (reasoning-gym's format)


class AnswerMatcher:
    """Does a solver's answer equal a label? Math by :class:`MathEquivalence`, program
    output by :func:`literal_key`. Holds the math worker: ``close()`` when done."""

    def __init__(self, timeout_s: float = 2.0):
        self.math = MathEquivalence(timeout_s=timeout_s)

    def final(self, kind: str, text: object) -> tuple[str | None, int]:
        """(the final answer, how many marked answers): a program's output; between the last
        ``<answer>`` tags for the kinds answered so (:data:`TAGGED_KINDS`); else ``#### N`` / ``\\boxed``."""
        if kind == "program":
            return program_answer(text), 1
        if kind in TAGGED_KINDS:
            return extract_tag(text, "answer"), text.count("</answer>") if isinstance(text, str) else 0
        return extract_final_answer(text)

    def matches(self, kind: str, answer: str | None, label: str | None) -> bool:
        if answer is None or label is None:
            return False
        if kind == "program":
            key = literal_key(answer)
            return key is not None and key == literal_key(label)
        return self.math.equal(answer, label)

    def classes(self, kind: str, answers: list[str | None]) -> list[int]:
        """Equivalence classes of a group of final answers (-1: non-answer)."""
        if kind != "program":
            return self.math.classes(answers)
        keys = [literal_key(a) for a in answers]
        ids: dict[str, int] = {}
        return [-1 if k is None else ids.setdefault(k, len(ids)) for k in keys]

    def close(self) -> None:
        self.math.close()


class _TruthReferee:
    """Shared by rules and executor: reward 1 when the final answer equals the truth."""

    provenance = ""

    def __init__(self, matcher: AnswerMatcher | None = None):
        self.matcher = matcher or AnswerMatcher()

    def truths(self, tasks: Sequence[Question]) -> dict[str, str | None]:
        raise NotImplementedError

    def score(self, tasks: Sequence[Question], answers: Sequence[str]) -> list[Verdict]:
        truth = self.truths(tasks)
        out = []
        for task, text in zip(tasks, answers):
            final, n_marked = self.matcher.final(task.kind, text)
            label = truth[task.id]
            ok = self.matcher.matches(task.kind, final, label)
            out.append(Verdict(float(ok), label, self.provenance,
                               {"final": final, "no_answer": final is None, "multiple_answers": n_marked > 1,
                                "uncheckable": label is None}))
        return out


class RulesReferee(_TruthReferee):
    """The task's own checker: its known ``answer``, else :func:`safe_eval` of its expression."""

    provenance = "rules"

    def truths(self, tasks: Sequence[Question]) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for t in tasks:
            if t.id not in out:
                value = safe_eval(t.expression) if t.answer is None and t.expression else None
                out[t.id] = t.answer if t.answer is not None else (format_value(value) if value is not None else None)
        return out


class ExecutorReferee(_TruthReferee):
    """Program-output tasks: the sandbox runs each distinct program once (one batch call);
    the truth is its stdout. A program that fails, times out or prints nothing is
    uncheckable (label None, reward 0)."""

    provenance = "executor"

    def __init__(self, matcher: AnswerMatcher | None = None, executor: Any = None, timeout_s: float = 2.0):
        super().__init__(matcher)
        self._executor = executor
        self._timeout_s = timeout_s
        self._cache: dict[str, str | None] = {}

    @property
    def executor(self) -> Any:
        if self._executor is None:
            from lmselfplay.verifiers.executor import Executor, ExecutorConfig

            self._executor = Executor(ExecutorConfig(timeout_s=self._timeout_s, cpu_s=self._timeout_s))
        return self._executor

    def truths(self, tasks: Sequence[Question]) -> dict[str, str | None]:
        from lmselfplay.verifiers.executor import Program

        todo = list({t.code: None for t in tasks if t.code and t.code not in self._cache})
        for code, res in zip(todo, self.executor.run_batch([Program(c) for c in todo], progress=False)):
            out = res.stdout.strip() if res.ok else ""
            self._cache[code] = out if out else None
        return {t.id: (t.answer if t.answer is not None else self._cache.get(t.code)) for t in tasks}

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()


class VoteReferee:
    """R-Zero / TTRL: no truth. Per task, the m answers are grouped into equivalence
    classes; the majority class (``majority_agreement``; ties to the class seen first) is the
    pseudo-label, its share the agreement p-hat; an answer's reward is 1 when it is in that
    class. Non-answers are never in it; a task with no answer at all gets label None, p-hat 0."""

    provenance = "vote"

    def __init__(self, matcher: AnswerMatcher | None = None):
        self.matcher = matcher or AnswerMatcher()

    def score(self, tasks: Sequence[Question], answers: Sequence[str]) -> list[Verdict]:
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(tasks):
            groups.setdefault(t.id, []).append(i)
        out: list[Verdict | None] = [None] * len(tasks)
        for idx in groups.values():
            kind = tasks[idx[0]].kind
            finals = [self.matcher.final(kind, answers[i]) for i in idx]
            cls = self.matcher.classes(kind, [f for f, _ in finals])
            # non-answers get distinct ids above every class: never a majority, never tied first
            ids = [c if c >= 0 else len(idx) + 1 + j for j, c in enumerate(cls)]
            label_id, agreement = majority_agreement(np.array([ids]))
            winner = int(label_id[0]) if int(label_id[0]) < len(idx) else -1  # -1: all non-answers
            label = next((finals[j][0] for j, c in enumerate(cls) if c == winner and winner >= 0), None)
            p_hat = float(agreement[0]) if label is not None else 0.0
            for j, i in enumerate(idx):
                out[i] = Verdict(float(label is not None and cls[j] == winner), label, self.provenance,
                                 {"agreement": p_hat, "votes": round(p_hat * len(idx)), "m": len(idx),
                                  "final": finals[j][0], "no_answer": cls[j] < 0,
                                  "multiple_answers": finals[j][1] > 1})
        return out  # type: ignore[return-value]


# --- the registry: the judge slot is filled by the debate recipe ---------------------------

REFEREES: dict[str, Callable[..., Referee]] = {
    "rules": RulesReferee, "executor": ExecutorReferee, "vote": VoteReferee}


def register_referee(name: str, factory: Callable[..., Referee]) -> None:
    """Add a referee (e.g. ``"judge"``: a factory taking ``matcher=`` and returning an
    object with ``provenance = "judge"`` and ``score(tasks, answers)``)."""
    REFEREES[name] = factory


def make_referee(name: str, **kwargs: Any) -> Referee:
    if name not in REFEREES:
        hint = " (the judge referee is registered by the debate recipe)" if name == "judge" else ""
        raise ValueError(f"unknown referee {name!r}{hint}; known: {sorted(REFEREES)}")
    return REFEREES[name](**kwargs)
