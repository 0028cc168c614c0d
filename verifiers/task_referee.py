"""The referee of fixed task sets (:mod:`lmselfplay.tasks.task_sets`): the rules of each item.

``score(items, texts) -> list[Verdict]``, as every referee of :mod:`lmselfplay.verifiers.referees`.
What decides is the item's own checker, never the answer's text beyond its final answer:

* ``arithmetic`` / ``jsonl``: the last ``#### N`` (or ``\\boxed{}``) is math-equivalent to the known
  answer (:class:`~lmselfplay.verifiers.referees.AnswerMatcher`);
* ``program``: the printed value, as a Python literal, equals the known output;
* ``reasoning_gym``: the text between the last ``<answer>`` tags, scored by the task's own
  ``score_answer`` (reasoning-gym's rules); reward 1 only for a full score.

Provenance is ``rules`` for all of them (the task's checker, not a model or a vote).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmselfplay.verifiers.answers import extract_tag, with_instruction
from lmselfplay.verifiers.referees import AnswerMatcher, Verdict

MATH_KINDS = ("arithmetic", "jsonl")


def item_prompt(item: Any) -> str:
    """What the model reads for ``item``: its prompt and its answer format's instruction."""
    return with_instruction(item.prompt, item.answer_format) if item.answer_format else item.prompt


class TaskReferee:
    """Rewards of task-set items; holds the math worker: ``close()`` when done."""

    provenance = "rules"

    def __init__(self, timeout_s: float = 2.0):
        self.matcher = AnswerMatcher(timeout_s=timeout_s)

    def final(self, item: Any, text: object) -> str | None:
        if item.kind == "reasoning_gym":
            return extract_tag(text, "answer")
        return self.matcher.final("program" if item.kind == "program" else "arithmetic", text)[0]

    def reward(self, item: Any, final: str | None) -> float:
        if final is None:
            return 0.0
        if item.kind == "reasoning_gym":
            try:
                return 1.0 if item.score(final) >= 1.0 else 0.0
            except Exception:  # a task's scorer on hostile text: no reward, never a crash
                return 0.0
        kind = "program" if item.kind == "program" else "arithmetic"
        return float(self.matcher.matches(kind, final, item.answer))

    def score(self, items: Sequence[Any], texts: Sequence[object]) -> list[Verdict]:
        out = []
        for item, text in zip(items, texts):
            final = self.final(item, text)
            out.append(Verdict(self.reward(item, final), item.answer, self.provenance,
                               {"final": final, "no_answer": final is None}))
        return out

    def close(self) -> None:
        self.matcher.close()
