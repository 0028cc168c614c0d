"""The ONE text protocol shared by every game: prompt layout, answer format, parser.

Answer format (documented in the README): the model may write anything, and its move is
the content of the LAST ``<move>...</move>`` in its answer, e.g. ``<move>3</move>``.
Move names are matched case-insensitively after stripping white space. Parsing never
raises: anything else is an :class:`~lmselfplay.games.base.Invalid` with a reason.

Thinking: a reasoning model writes ``<think>...</think>`` before its answer. Only the text after
the think block closes is its answer (:func:`visible_answer_text`); an unclosed think block is no
answer. Every answer reader (moves here, :mod:`lmselfplay.verifiers.answers`, the code tasks)
and every engine's stop-string rule use that one function. It lives here, at the bottom
layer, because games, engines and verifiers all read it.
"""

from __future__ import annotations

from typing import Any

from lmselfplay.games.base import Invalid

OPEN, CLOSE = "<move>", "</move>"
ANSWER_INSTRUCTION = f"Answer with {OPEN}MOVE{CLOSE}."
# Generation stops at the closing tag (kept in the output). Training, evaluation and play
# all sample with these stop strings and score move answers without an EOS after them,
# so the model is never trained or judged on what it would write after its move.
MOVE_STOP = [CLOSE]
MAX_MOVE_CHARS = 64
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def visible_answer_text(text: str, think_open: bool = False) -> str | None:
    """The part of a model output that can hold its answer.

    Rules: the text after the LAST ``</think>``; ``None`` while a think block is open (a
    ``<think>`` with no ``</think>`` after it, or, with ``think_open`` — the prompt itself
    opened the block — no ``</think>`` at all); the whole text when it never thinks."""
    close = text.rfind(THINK_CLOSE)
    if text.rfind(THINK_OPEN) > close or (think_open and close < 0):
        return None
    return text[close + len(THINK_CLOSE):] if close >= 0 else text


def format_answer(move_name: str) -> str:
    """The canonical answer text for a move (what pre-training and round-trips use)."""
    return f"{OPEN}{move_name}{CLOSE}"


def extract_move(text: Any, max_chars: int = MAX_MOVE_CHARS) -> str | Invalid:
    """The content of the last complete ``<move>...</move>`` after any think block, or an Invalid.

    ``max_chars`` bounds the content: move names are short; games whose moves are free
    text (Taboo's utterances) pass their own, larger bound."""
    if not isinstance(text, str):
        return Invalid(f"answer is not text ({type(text).__name__})")
    text = visible_answer_text(text)
    if text is None:
        return Invalid("the think block never closed (no answer after </think>)")
    end = text.rfind(CLOSE)
    if end < 0:
        return Invalid("no <move>...</move> in the answer")
    start = text.rfind(OPEN, 0, end)
    if start < 0:
        return Invalid("</move> without a matching <move>")
    move = text[start + len(OPEN) : end].strip()
    if not move:
        return Invalid("empty <move></move>")
    if len(move) > max_chars:
        return Invalid(f"move text longer than {max_chars} characters")
    return move


def parse_named_move(text: Any, legal: dict[str, int]) -> int | Invalid:
    """Map an answer to a legal action given ``{lower-case move name: action}``."""
    move = extract_move(text)
    if isinstance(move, Invalid):
        return move
    key = move.casefold()
    if key in legal:
        return legal[key]
    shown = move if len(move) <= 16 else move[:16] + "..."
    return Invalid(f"{shown!r} is not a legal move (legal: {', '.join(legal)})")


def prompt(title: str, rules: str, state_lines: list[str], legal_names: list[str] | None,
           state_last: bool = False) -> str:
    """The layout every game's observation uses (short: tiny models read it): the title and
    rules, the state, the legal moves, the answer instruction.

    ``legal_names=None``: no list (moves are free text, or the state names them: tic-tac-toe's
    cells text). ``state_last``: the state
    lines come after the instruction, next to the answer slot (a small model reads the cells
    nearest its answer best: tic-tac-toe's cells text)."""
    lines = [f"Game: {title}. {rules}"]
    if not state_last:
        lines += state_lines
    if legal_names is not None:
        lines.append("Legal moves: " + " ".join(legal_names))
    lines.append(ANSWER_INSTRUCTION)
    if state_last:
        lines += state_lines
    return "\n".join(lines)
