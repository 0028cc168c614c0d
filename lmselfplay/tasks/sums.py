"""Sums of three one-digit numbers as questions a model writes: reasoning-gym's ``chain_sum`` in the
positive control's settings (``recipes/configs/rlvr.yaml``), for R-Zero's ``task_form: sum``.

The challenger is asked :data:`SUM_WRITE_PROMPT` and writes an expression (``4 + 3 - 2``); the
solver reads it as reasoning-gym phrases a ``chain_sum`` question (:func:`sum_question`) and answers
between ``<answer>`` tags, so its questions, its held-out set (``chain_sum`` items) and the positive
control's are one family in one format.
"""

from __future__ import annotations

import random
import re

SUM_WRITE_PROMPT = "Write a sum of three one-digit numbers."
CHAIN_SUM_CONFIG = {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}
SUM_TASK = "reasoning_gym:chain_sum"
_SUM = re.compile(r"\d [+-] \d [+-] \d")


def chain_sum_expression(rng: random.Random) -> str:
    """Three numbers 0-9 joined by + or - (reasoning-gym's chain_sum generator in these settings)."""
    terms = [str(rng.randint(0, 9)) for _ in range(3)]
    ops = [rng.choice("+-") for _ in range(2)]
    return f"{terms[0]} {ops[0]} {terms[1]} {ops[1]} {terms[2]}"


def sum_expression(text: object) -> str | None:
    """The expression a written text is, whitespace normalised; None unless it is exactly three
    one-digit numbers joined by + or -."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    expression = " ".join(text.split())
    return expression if _SUM.fullmatch(expression) else None


def sum_question(expression: str) -> str:
    """The question text reasoning-gym's chain_sum gives ``expression``."""
    return f"State the final answer to the following arithmetic problem: {expression} ="
