"""What a referee hands back: one :class:`Verdict` per (task, answer).

Referees share one batched interface, ``score(tasks, answers) -> list[Verdict]``, so
studies can compare what decided (``provenance``: rules, executor, vote, judge, data) on
the same questions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    reward: float
    label: Any
    provenance: str
    detail: dict = field(default_factory=dict)
