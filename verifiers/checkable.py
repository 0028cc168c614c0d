"""Questions in a checkable form: model-written text -> a :class:`Question` whose truth a referee
can compute, or the reason it cannot (counted, never raised).

Two forms (chosen by the recipe's config):

* ``arithmetic``: a word problem in one of the shapes the project's generator writes
  (:func:`lmselfplay.tasks.arithmetic.arithmetic_problem`), read back into an arithmetic
  expression (:func:`word_problem_expression`) that :func:`safe_eval` computes; or a bare
  expression such as ``3 + 4 * 2``.
* ``program``: "what does this program print": a function ``f`` the challenger wrote and an
  input from the seed task; the executor sandbox runs it (never this process).

:func:`safe_eval` walks the syntax tree of integer arithmetic (``+ - * / // %``, unary
minus, parentheses, small powers) with exact fractions and bounded sizes: it never calls
``eval`` and never takes long on hostile text.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

MAX_QUESTION_CHARS = 400
MAX_VALUE = 10**12  # any intermediate value beyond this: not a checkable question
INJECTION = re.compile(r"(answer|reply|respond|output|say)\b[^.?!\n]{0,20}?-?\d|####|\\boxed", re.I)


@dataclass(frozen=True)
class Question:
    """One question for a solver. ``answer`` is the truth when the generator knows it;
    otherwise ``expression`` (arithmetic) or ``code`` (a program whose stdout is the
    answer) lets the rules / the executor compute it."""

    id: str
    kind: str  # "arithmetic" | "program"
    prompt: str  # what the solver reads
    question: str = ""  # the question text alone (for diversity / repetition measures)
    answer: str | None = None
    expression: str | None = None
    code: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


# --- safe arithmetic ----------------------------------------------------------------------

_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: Fraction(a // b),
        ast.Mod: lambda a, b: a % b}


def safe_eval(expression: str, max_chars: int = 200) -> Fraction | None:
    """The exact value of an integer-arithmetic expression, or None (not arithmetic, too
    long, division by zero, a value beyond ``MAX_VALUE``, a power above 2**6 or with an
    exponent above 6)."""
    if not isinstance(expression, str) or len(expression) > max_chars:
        return None
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        return _eval(tree.body, 0)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError, TypeError):
        return None


def _eval(node: ast.AST, depth: int) -> Fraction:
    if depth > 40:
        raise ValueError("too deep")
    if isinstance(node, ast.Constant) and type(node.value) is int:
        value = Fraction(node.value)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand, depth + 1)
        value = -value if isinstance(node.op, ast.USub) else value
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exp = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        if exp.denominator != 1 or not 0 <= exp <= 6 or abs(base) > 64:
            raise ValueError("power out of range")
        value = base ** int(exp)
    elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        value = _OPS[type(node.op)](_eval(node.left, depth + 1), _eval(node.right, depth + 1))
    else:
        raise ValueError(f"not arithmetic: {type(node).__name__}")
    if abs(value) > MAX_VALUE:
        raise ValueError("value too large")
    return value


def format_value(value: Fraction) -> str:
    """``7`` or ``7/2``: how a truth is written."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


# --- word problems in the generator's shapes ----------------------------------------------

# Only the numbers are captured: names and items need not be consistent ("8 stickers ... How
# many coins"), since the shape alone fixes the arithmetic, which is what is checked.
_N, _NAME, _ITEM = r"(\d{1,6})", r"[A-Z][a-z]{1,12}", r"[a-z]{2,15}"
WORD_PROBLEMS: list[tuple[re.Pattern, str]] = [(re.compile(p), e) for p, e in [
    (rf"{_NAME} has {_N} {_ITEM} and gets {_N} more\. How many {_ITEM} does {_NAME} have now\?", "{0} + {1}"),
    (rf"{_NAME} has {_N} {_ITEM} and gives {_N} to {_NAME}\. How many {_ITEM} are left\?", "{0} - {1}"),
    (rf"{_NAME} buys {_N} bags with {_N} {_ITEM} in each bag\. How many {_ITEM} is that in total\?", "{0} * {1}"),
    (rf"{_NAME} shares {_N} {_ITEM} equally among {_N} friends\. How many {_ITEM} does each friend get\?",
     "{0} / {1}"),
    (rf"{_NAME} has {_N} {_ITEM}\. {_NAME} gives {_NAME} {_N} more, then {_NAME} uses {_N}\. "
     rf"How many {_ITEM} does {_NAME} have\?", "{0} + {1} - {2}"),
    (rf"{_NAME} has {_N} boxes of {_N} {_ITEM} and {_N} loose {_ITEM}\. How many {_ITEM} does {_NAME} have in all\?",
     "{0} * {1} + {2}"),
]]
_EXPRESSION = re.compile(r"[\d\s()+\-*/%]{1,200}")


def word_problem_expression(text: str) -> str | None:
    """The arithmetic expression a word problem (or bare expression) asks for, or None.
    ``{k}`` in a template is the k-th number of its pattern, counted from 0."""
    t = " ".join(text.split())
    for pattern, template in WORD_PROBLEMS:
        m = pattern.fullmatch(t)
        if m:
            return template.format(*m.groups())
    if _EXPRESSION.fullmatch(t) and re.search(r"\d", t):
        return t
    return None


def question_problem(text: object, max_chars: int = MAX_QUESTION_CHARS) -> str | None:
    """Why model-written ``text`` is not a usable question (``empty``, ``huge``,
    ``injection``, ``not_a_question``), or None when it may be one. Injection: the text
    tells the solver what to answer ("answer 7", "####", "\\boxed")."""
    if not isinstance(text, str) or not text.strip():
        return "empty"
    if len(text) > max_chars:
        return "huge"
    if INJECTION.search(text):
        return "injection"
    return None


def arithmetic_task(task_id: str, text: str, to_prompt: Callable[[str], str]) -> tuple[Question | None, str | None]:
    """(Question, None) for a checkable arithmetic question; (None, reason) otherwise."""
    problem = question_problem(text)
    if problem:
        return None, problem
    question = " ".join(text.split())
    expr = word_problem_expression(question)
    if expr is None:
        return None, "not_a_question"
    if safe_eval(expr) is None:
        return None, "uncheckable"
    return Question(task_id, "arithmetic", to_prompt(question), question, expression=expr), None


def program_task(task_id: str, code: str, arg: str,
                 to_prompt: Callable[[str, str], str]) -> tuple[Question | None, str | None]:
    """(Question, None) for a program defining ``f``; the question prints ``repr(f(arg))``.
    Whether it runs is the executor's to say (a program that fails is uncheckable there)."""
    code = re.sub(r"^```[a-z]*\s*$", "", code, flags=re.M)  # markdown fences around the code
    problem = question_problem(code, max_chars=4 * MAX_QUESTION_CHARS)
    if problem and problem != "injection":  # "answer 7" in code is just a string literal
        return None, problem
    if not re.search(r"^def f\(", code, re.M):
        return None, "not_a_question"
    body = code.rstrip() + "\n"
    full = f"{body}print(repr(f({arg})))"
    return Question(task_id, "program", to_prompt(body, arg), body, code=full), None
