"""Tiny deterministic Python programs ``f(x)`` with an input and ``repr(f(x))`` (Absolute
Zero's deduction / abduction / induction triplets), generated from a ``random.Random``.

The code is OURS, built from a small grammar, so evaluating it here is safe; model-written
code only ever runs in the executor sandbox (:mod:`lmselfplay.verifiers.executor`).
"""

from __future__ import annotations

import random
from typing import Any


def _int_expr(rng: random.Random, var: str) -> str:
    c = rng.randint(1, 9)
    return rng.choice([
        f"{var} + {c}", f"{var} - {c}", f"{var} * {c}", f"{var} // {c}", f"{var} % {c + 1}",
        f"{c} - {var}", f"abs({var} - {c})", f"max({var}, {c})", f"min({var}, {c})",
        f"{var} * {var}",
    ])


def _int_cond(rng: random.Random, var: str) -> str:
    c = rng.randint(0, 9)
    return rng.choice([f"{var} > {c}", f"{var} < {c}", f"{var} % 2 == 0", f"{var} % 3 == 0",
                       f"{var} != {c}"])


def _int_program(rng: random.Random) -> tuple[list[str], Any]:
    body = []
    for _ in range(rng.randint(1, 2)):
        body.append(f"    x = {_int_expr(rng, 'x')}")
    if rng.random() < 0.5:
        body += [f"    if {_int_cond(rng, 'x')}:", f"        x = {_int_expr(rng, 'x')}"]
    if rng.random() < 0.3:
        body += [f"    for i in range({rng.randint(1, 4)}):", f"        x = {_int_expr(rng, 'x')}"]
    body.append("    return x")
    return body, rng.randint(-10, 20)


def _list_program(rng: random.Random) -> tuple[list[str], Any]:
    kind = rng.randrange(5)
    if kind == 0:
        body = [f"    return [{_int_expr(rng, 'v')} for v in x if {_int_cond(rng, 'v')}]"]
    elif kind == 1:
        body = ["    total = 0", "    for v in x:", f"        if {_int_cond(rng, 'v')}:",
                f"            total = total + {_int_expr(rng, 'v')}", "    return total"]
    elif kind == 2:
        body = [f"    return {rng.choice(['sorted(x)', 'x[::-1]', 'sorted(x, reverse=True)', 'x[1:] + x[:1]'])}"]
    elif kind == 3:
        body = [f"    return {rng.choice(['sum(x)', 'len(x)', 'max(x)', 'min(x)', 'x[0] + x[-1]'])}"]
    else:
        body = ["    y = []", "    for v in x:", f"        y.append({_int_expr(rng, 'v')})",
                "    return y"]
    return body, [rng.randint(0, 9) for _ in range(rng.randint(1, 5))]


def _str_program(rng: random.Random) -> tuple[list[str], Any]:
    a, b = rng.sample("abcde", 2)
    expr = rng.choice([
        "x[::-1]", "x.upper()", f"x.count('{a}')", f"x.replace('{a}', '{b}')", "len(x)",
        "''.join(sorted(x))", "x + x[0]", "x[1:]", f"'{a}' in x", "x * 2",
    ])
    word = "".join(rng.choice("abcde") for _ in range(rng.randint(1, 6)))
    return [f"    return {expr}"], word


def python_program(rng: random.Random) -> dict[str, str]:
    """``{"code", "input", "output"}``: ``code`` defines ``f(x)``; ``output == repr(f(input))``.

    ``input`` is a Python literal (``repr`` of an int, a list of ints or a string).
    Programs are deterministic and finish instantly (no while loops, small ranges).
    """
    while True:  # resample the rare program whose output is too long to be a short answer
        body, arg = rng.choice([_int_program, _list_program, _str_program])(rng)
        code = "\n".join(["def f(x):", *body]) + "\n"
        namespace: dict[str, Any] = {}
        exec(compile(code, "<synthetic>", "exec"), {"__builtins__": _SAFE_BUILTINS}, namespace)  # noqa: S102
        output = repr(namespace["f"](arg))
        if len(output) <= MAX_OUTPUT_CHARS:
            return {"code": code, "input": repr(arg), "output": output}


MAX_OUTPUT_CHARS = 24
_SAFE_BUILTINS = {"abs": abs, "len": len, "max": max, "min": min, "range": range,
                  "sorted": sorted, "sum": sum}


def program_output_prompt(task: dict[str, str]) -> str:
    """Deduction: predict ``f(input)`` (the answer is ``task['output']``)."""
    return f"Predict the output.\n{task['code']}print(repr(f({task['input']})))"


def program_write_prompt(task: dict[str, str]) -> str:
    """Proposal: write a function ``f`` that maps the input to the output (answer: the code)."""
    return f"Write a Python function f with f({task['input']}) == {task['output']}."
