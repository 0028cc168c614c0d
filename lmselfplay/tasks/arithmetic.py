"""Arithmetic word problems with worked answers, generated from a ``random.Random``.

A given seed always gives the same problems (no data download). The answer is one or two
equations then a GSM8K-style final line ``#### 42``: what SPIN and R-Zero start from, what
the debate tasks ask and what the tiny model's corpus teaches.
"""

from __future__ import annotations

import random

NAMES = ("Ann", "Ben", "Cara", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivy", "Jack", "Kim", "Leo",
         "Mia", "Ned", "Omar", "Pia", "Raj", "Sam", "Tia", "Uma")
ITEMS = ("apples", "books", "coins", "marbles", "pens", "cards", "shells", "stickers", "eggs",
         "cookies", "stamps", "balls")


KINDS = ("addition", "subtraction", "multiplication", "division", "add-then-subtract", "multiply-then-add")


def _final(value: int) -> str:
    return f"#### {value}"


def arithmetic_problem(rng: random.Random) -> dict[str, str]:
    """One word problem: ``{"prompt", "answer", "final", "kind"}`` with a correct worked answer
    (``kind``: one of :data:`KINDS`).

    The answer is one or two equations then ``#### N`` (the GSM8K convention that
    :mod:`lmselfplay.verifiers` math scorers read); ``final`` is ``str(N)``.
    """
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    kind = rng.randrange(6)
    if kind == 0:
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        q = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        work, ans = f"{a} + {b} = {a + b}", a + b
    elif kind == 1:
        a = rng.randint(2, 30)
        b = rng.randint(1, a)
        q = f"{name} has {a} {item} and gives {b} to {other}. How many {item} are left?"
        work, ans = f"{a} - {b} = {a - b}", a - b
    elif kind == 2:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        q = f"{name} buys {a} bags with {b} {item} in each bag. How many {item} is that in total?"
        work, ans = f"{a} * {b} = {a * b}", a * b
    elif kind == 3:
        b, ans = rng.randint(2, 9), rng.randint(1, 9)
        a = b * ans
        q = f"{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?"
        work = f"{a} / {b} = {ans}"
    elif kind == 4:
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        c = rng.randint(1, a + b)
        q = (f"{name} has {a} {item}. {other} gives {name} {b} more, then {name} uses {c}. "
             f"How many {item} does {name} have?")
        work, ans = f"{a} + {b} = {a + b}\n{a + b} - {c} = {a + b - c}", a + b - c
    else:
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 20)
        q = (f"{name} has {a} boxes of {b} {item} and {c} loose {item}. "
             f"How many {item} does {name} have in all?")
        work, ans = f"{a} * {b} = {a * b}\n{a * b} + {c} = {a * b + c}", a * b + c
    return {"prompt": q, "answer": f"{work}\n{_final(ans)}", "final": str(ans), "kind": KINDS[kind]}


def arithmetic_prompt(problem: dict[str, str]) -> str:
    """The question as the model reads it (the formatter adds the Answer: cue)."""
    return f"Solve the problem. End with #### and the number.\n{problem['prompt']}"


QUESTION_WRITE_PROMPT = "Write a short arithmetic word problem."
