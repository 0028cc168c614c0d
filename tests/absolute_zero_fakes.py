"""Absolute Zero's scripted engines for the recipe tests (``tests/rl/test_absolute_zero.py``,
``tests/rl/test_overlap.py``): a proposer whose valid proposals change with the prompt."""

from __future__ import annotations

import random

from fake_engine import ScriptedEngine

from lmselfplay.lm.prompt import PLAIN_TEMPLATE
from lmselfplay.verifiers.code_tasks import inputs_like


def prompt_text(decoded: str) -> str:
    """The task text of a decoded plain-format prompt."""
    return decoded[: -len(PLAIN_TEMPLATE.format(prompt=""))]


def patch_make_engine(monkeypatch, make) -> None:
    """The recipe's engine comes from ``make``: ``run_recipe`` executes the recipe afresh, so its
    ``from lmselfplay.lm.engines import make_engine`` reads the patched name."""
    import lmselfplay.lm.engines as engines

    monkeypatch.setattr(engines, "make_engine", make)


def proposing_engine(tok):
    """Deterministic valid proposals that change with the prompt: the buffers grow."""
    from lmselfplay.tasks.programs import python_program

    def answer(decoded):
        prompt = prompt_text(decoded)
        rng = random.Random(prompt)
        if not prompt.startswith("Propose"):
            return rng.choice(["1", "[1, 2]", "def f(x):\n    return x", "'ab'"])
        n = 4 if "half of the input/output pairs" in prompt else 1
        p = python_program(rng)
        lines = [p["code"].rstrip("\n")] + [f"input: {i}" for i in inputs_like(rng, p["input"], n)]
        return "\n".join(lines + (["message: guess"] if n > 1 else []))
    return ScriptedEngine(tok, answer)
