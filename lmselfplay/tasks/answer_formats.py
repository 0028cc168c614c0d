"""The prompt side of the answer formats: what a prompt asks for, per format name.

The extraction side (and the pairing of the two) is :mod:`lmselfplay.verifiers.answers`, whose
rules take their instruction from here; task generators and the embedded model's corpus, which
sit below the referees, write their prompts with :func:`with_instruction`.
"""

from __future__ import annotations

INSTRUCTIONS: dict[str, str] = {
    "boxed": "Put your final answer within \\boxed{}.",
    "hash": "End with a line of the form '#### <answer>'.",
    "answer": "Give your final answer between <answer> and </answer>.",
    "final": "End with a line of the form '#### <answer>'.",
    "code": "Write the Python code.",
    "raw": "",
}


def with_instruction(question: str, rule: str) -> str:
    """The question followed by the format's instruction (ValueError for an unknown format)."""
    if rule not in INSTRUCTIONS:
        raise ValueError(f"unknown answer format {rule!r}; known: {', '.join(INSTRUCTIONS)}")
    ins = INSTRUCTIONS[rule]
    return f"{question.rstrip()}\n{ins}" if ins else question
