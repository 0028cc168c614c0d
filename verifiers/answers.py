"""THE answer-extraction rules: one per task family, each paired with the instruction
that asks for it, so a prompt and its extraction can never disagree.

| rule      | the prompt asks for                    | extracted                                      |
|-----------|----------------------------------------|------------------------------------------------|
| `boxed`   | ``\\boxed{ANSWER}``                    | content of the last balanced ``\\boxed{...}``  |
| `hash`    | a last line ``#### ANSWER`` (GSM8K)    | text after the last ``####`` up to end of line |
| `answer`  | ``<answer>ANSWER</answer>``            | content of the last closed ``<answer>`` tag    |
| `final`   | ``#### ANSWER`` (``\\boxed{}`` accepted)  | whichever of the two marks comes last          |
| `code`    | Python code, optionally fenced         | the last ```` ``` ```` block, else all text    |
| `raw`     | nothing                                | the whole text, stripped                       |

Rules shared by all: an extractor never raises; anything that is not a ``str`` gives
``None``; only the text after a closed think block is read, and an unclosed ``<think>`` gives
``None`` (:func:`lmselfplay.games.text.visible_answer_text`, the rule every answer reader
shares); only the last ``MAX_SCAN_CHARS`` characters are looked at (the answer is at the
end, and a 10 MB output then costs the same as a 100 kB one); a missing or unclosed answer
gives ``None`` (a cut-off answer is no answer). Extraction is not equivalence: whether
``"1/2"`` equals ``"0.5"`` is decided by the benchmark's scorer (or math-verify), not here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from lmselfplay.games.text import visible_answer_text
from lmselfplay.tasks.answer_formats import INSTRUCTIONS, with_instruction  # noqa: F401 - the prompt side, re-exported

MAX_SCAN_CHARS = 100_000

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")


def _tail(text: object) -> str | None:
    """The visible answer text (after any think block) of the last ``MAX_SCAN_CHARS``, or None."""
    if not isinstance(text, str):
        return None
    return visible_answer_text(text[-MAX_SCAN_CHARS:])


def extract_boxed(text: object) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) whose braces balance.

    "Last" = the outermost box that closes last, so ``\\boxed{\\frac{1}{2}}`` gives
    ``\\frac{1}{2}`` and a box nested inside another box is part of the outer answer.
    One linear pass over the braces; a stray ``}`` is ignored.
    """
    s = _tail(text)
    if s is None:
        return None
    stack: list[tuple[int, bool]] = []  # (content start, opened by a box?)
    boxes_open = 0
    best: tuple[int, int] | None = None
    for m in _BOXED.finditer(s):
        tok = m.group()
        if tok == "}":
            if not stack:
                continue
            start, is_box = stack.pop()
            if is_box:
                boxes_open -= 1
                if boxes_open == 0:
                    best = (start, m.start())
        else:
            is_box = tok != "{"
            stack.append((m.end(), is_box))
            boxes_open += is_box
    return None if best is None else s[best[0]:best[1]].strip()


def extract_hash(text: object) -> str | None:
    """Text after the last ``####`` up to the end of its line, stripped; thousands
    separators inside numbers (``1,234``) and a final period are dropped, as in GSM8K."""
    s = _tail(text)
    if s is None:
        return None
    i = s.rfind("####")
    if i < 0:
        return None
    line = s[i + 4:].split("\n", 1)[0].strip().rstrip(".").strip()
    return _THOUSANDS.sub("", line) or None


def extract_tag(text: object, tag: str = "answer") -> str | None:
    """Content of the last ``<tag>...</tag>`` pair, stripped (``None`` if never closed)."""
    s = _tail(text)
    if s is None:
        return None
    close = s.rfind(f"</{tag}>")
    if close < 0:
        return None
    open_ = s.rfind(f"<{tag}>", 0, close)
    if open_ < 0:
        return None
    return s[open_ + len(tag) + 2:close].strip()


def extract_final(text: object) -> str | None:
    """Either mark, whichever comes last: ``#### N`` or ``\\boxed{N}`` (R-Zero's solver and
    checkable questions accept both)."""
    s = _tail(text)
    if s is None:
        return None
    box = max(s.rfind("\\boxed"), s.rfind("\\fbox"))
    return extract_hash(s) if s.rfind("####") > box else extract_boxed(s)


def count_final_marks(text: object) -> int:
    """How many ``#### N`` / ``\\boxed{`` answer marks a text holds (several = several answers)."""
    s = _tail(text)
    if s is None:
        return 0
    hashes = sum(1 for line in re.findall(r"####([^\n#]*)", s) if line.strip())
    return hashes + len(re.findall(r"\\(?:boxed|fbox)\s*\{", s))


def extract_code(text: object) -> str | None:
    """The last fenced code block (any language tag) or, without a fence, the whole text.
    Never stripped of indentation: a function body stays a function body."""
    s = _tail(text)
    if s is None:
        return None
    blocks = _FENCE.findall(s)
    if blocks:
        return blocks[-1][1]
    return s


def extract_raw(text: object) -> str | None:
    s = _tail(text)
    return None if s is None else s.strip()


@dataclass(frozen=True)
class AnswerRule:
    name: str
    instruction: str  # appended to the question: what the prompt asks for
    extract: Callable[[object], str | None]
    stop: tuple[str, ...] = ()  # generation may stop here (the answer is complete)


RULES: dict[str, AnswerRule] = {
    "boxed": AnswerRule("boxed", INSTRUCTIONS["boxed"], extract_boxed),
    "hash": AnswerRule("hash", INSTRUCTIONS["hash"], extract_hash),
    "answer": AnswerRule("answer", INSTRUCTIONS["answer"], extract_tag, stop=("</answer>",)),
    "final": AnswerRule("final", INSTRUCTIONS["final"], extract_final),
    "code": AnswerRule("code", INSTRUCTIONS["code"], extract_code),
    "raw": AnswerRule("raw", INSTRUCTIONS["raw"], extract_raw),
}


def get_rule(name: str) -> AnswerRule:
    if name not in RULES:
        raise ValueError(f"unknown answer format {name!r}; known: {', '.join(RULES)}")
    return RULES[name]


def extract_answer(text: object, rule: str) -> str | None:
    """``RULES[rule].extract(text)``; never raises for any ``text``."""
    return get_rule(rule).extract(text)
