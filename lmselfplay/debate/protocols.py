"""Debate, consultancy and double consultancy: who speaks, what each speaker sees, and
the text every speech and every judgment is read from.

Protocols (``PROTOCOLS``), each over ``num_rounds`` rounds:

* ``debate`` — two debaters, one per answer; which one defends the correct answer is
  assigned at random, balanced over the tasks. ``turn_order: simultaneous``: in round r
  both see the speeches of rounds < r; ``sequential``: the second speaker also sees the
  first speaker's speech of round r.
* ``consultancy`` — one consultant, assigned the correct answer for exactly half of the
  tasks (balanced); it sees only its own earlier speeches.
* ``double_consultancy`` — two independent consultancies side by side: one consultant
  per answer, each seeing only its own speeches; the judge reads both.
* ``none`` — the judge alone with the question (the baseline every protocol must beat).

The answer shown first to the judge (label A) is the correct one for exactly half of the
tasks, independently of the side assignment.

One prompt format for every speech (:func:`speech_prompt`), one for every judgment
(:func:`judge_prompt`), both turned into tokens by THE formatter
(:func:`lmselfplay.lm.prompt.encode_prompt`). Speakers are named by the answer they
defend (never by a letter), so a speech reads the same when the judge's labels swap.
Both prompts end with what the reader must act on (its side; the two labelled options),
so even the last-resort cut of rule 5 keeps it.

Rules for hostile speeches (model output), applied by :func:`sanitize_speech`, each
counted in ``Speech.flags``, none of them raising:

1. fake verification markers — any ``<v_quote>``/``</v_quote>``/``<u_quote>``/``</u_quote>``
   a speaker wrote itself — are deleted before quotes are checked (``fake_markers``);
2. every ``<quote>X</quote>`` is checked against the context: X, whitespace-normalized,
   non-empty and a substring of the whitespace-normalized context -> ``<v_quote>X</v_quote>``
   (verified), else ``<u_quote>X</u_quote>``; an unpaired ``<quote>`` or ``</quote>`` is
   deleted. The judge's prompt explains the two markers;
3. a line that claims a role in the transcript (``Judge:``, ``Verdict:``, ``Debater for ..:``,
   ``Consultant ..:``) or says "I am the judge" is replaced by ``[removed: role claim]``
   (``impersonation``);
4. an empty speech becomes ``(no speech)`` (``empty``); a speech longer than
   ``max_speech_chars`` is cut there and ends in ``[cut]`` (``cut``); a generation that hit
   ``max_new_tokens`` is counted (``at_max_tokens``);
5. a prompt longer than ``max_prompt_tokens`` drops the oldest speeches first (replaced
   by one line saying how many), then shortens the context, and at last keeps the first
   token and the newest tokens (``prompt_cut``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lmselfplay.debate.tasks import DebateTask
from lmselfplay.lm.engines.base import generate_fitting
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.utils.config import Config, ConfigError, positive

PROTOCOLS = ("debate", "consultancy", "double_consultancy", "none")
LABELS = ("A", "B")


@dataclass
class ProtocolConfig(Config):
    _argument_group_name = "protocol (lmselfplay.debate.protocols.ProtocolConfig)"
    num_rounds: int = field(default=2, metadata={"help": "speeches per speaker"})
    turn_order: str = field(default="simultaneous", metadata={"help": "simultaneous | sequential (debate)"})
    hidden_context: bool = field(default=True, metadata={"help": "the judge does not see the context"})
    max_new_tokens: int = field(default=48, metadata={"help": "tokens per speech"})
    max_speech_chars: int = field(default=600, metadata={"help": "a longer speech is cut (and counted)"})
    max_prompt_tokens: int = field(default=320, metadata={"help": "speech and judge prompts are fitted to this"})

    def validate(self) -> None:
        if self.turn_order not in ("simultaneous", "sequential"):
            raise ConfigError(f"turn_order must be simultaneous or sequential, got {self.turn_order!r}")
        positive(self, "num_rounds", "max_new_tokens", "max_speech_chars")
        if self.max_prompt_tokens < 16:
            raise ConfigError(f"max_prompt_tokens must be >= 16, got {self.max_prompt_tokens}")


# --- speeches: quotes and hostile text -------------------------------------------------------

QUOTE_RE = re.compile(r"<quote>(.*?)</quote>", re.S | re.I)
FAKE_MARKER_RE = re.compile(r"<\s*/?\s*[vu]_quote\s*>", re.I)
STRAY_QUOTE_RE = re.compile(r"<\s*/?\s*quote\s*>", re.I)
ROLE_CLAIM_RE = re.compile(r"(?im)^[ \t]*(?:judge|verdict|debater\b[^:\n]{0,20}|consultant\b[^:\n]{0,20})[ \t]*:.*$"
                           r"|i\s+am\s+the\s+judge[^\n]*")
ROLE_CLAIM_TEXT = "[removed: role claim]"
EMPTY_TEXT = "(no speech)"
CUT_TEXT = " [cut]"


def normalize_ws(text: str) -> str:
    return " ".join(text.split())


def verify_quote(quote: str, context: str) -> bool:
    """Exact match after whitespace normalization; an empty quote verifies nothing."""
    q = normalize_ws(quote)
    return bool(q) and q in normalize_ws(context)


def sanitize_speech(raw: str, context: str, max_chars: int) -> tuple[str, dict[str, int]]:
    """The speech as the judge reads it, and counts of what the rules did (module doc)."""
    flags = dict(fake_markers=0, quotes=0, verified=0, impersonation=0, empty=0, cut=0)
    text = raw if isinstance(raw, str) else ""
    if len(text) > max_chars:
        text, flags["cut"] = text[:max_chars] + CUT_TEXT, 1
    text, flags["fake_markers"] = FAKE_MARKER_RE.subn("", text)
    text, flags["impersonation"] = ROLE_CLAIM_RE.subn(ROLE_CLAIM_TEXT, text)

    def mark(m: re.Match) -> str:
        flags["quotes"] += 1
        inner = m.group(1)
        if verify_quote(inner, context):
            flags["verified"] += 1
            return f"<v_quote>{inner}</v_quote>"
        return f"<u_quote>{inner}</u_quote>"

    pieces = []  # verify closed quotes, drop the unpaired tags between them
    last = 0
    for m in QUOTE_RE.finditer(text):
        pieces.append(STRAY_QUOTE_RE.sub("", text[last : m.start()]))
        pieces.append(mark(m))
        last = m.end()
    pieces.append(STRAY_QUOTE_RE.sub("", text[last:]))
    text = "".join(pieces).strip()
    if not text:
        text, flags["empty"] = EMPTY_TEXT, 1
    return text, flags


# --- transcripts ----------------------------------------------------------------------------

@dataclass
class Speech:
    speaker: int  # index into Transcript.sides
    round: int
    text: str  # sanitized: what the judge and the other speakers read
    raw: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    flags: dict[str, int]
    version: int | None = None  # the weights it was sampled with, where the engine knows it (servers)


@dataclass
class Transcript:
    task: DebateTask
    protocol: str
    options: tuple[str, str]  # as labelled A, B for the judge
    sides: list[int]  # per speaker: the option index (0 = A, 1 = B) it defends
    speeches: list[Speech] = field(default_factory=list)
    prompt_cuts: int = 0

    @property
    def correct_index(self) -> int:
        return self.options.index(self.task.correct)

    def side_is_correct(self, speaker: int) -> bool:
        return self.sides[speaker] == self.correct_index


def balanced_flags(n: int, rng: random.Random) -> list[bool]:
    """n booleans, exactly half True (the odd one out random), in random order."""
    flags = [i < n // 2 for i in range(n)]
    if n % 2:
        flags[-1] = rng.random() < 0.5
    rng.shuffle(flags)
    return flags


def new_transcripts(tasks: list[DebateTask], protocol: str, seed: int) -> list[Transcript]:
    """Options ordered and sides assigned, both balanced over ``tasks`` and independent."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; known: {PROTOCOLS}")
    rng = random.Random(f"{protocol}/{seed}/{len(tasks)}")
    correct_first = balanced_flags(len(tasks), rng)
    speaker0_correct = balanced_flags(len(tasks), rng)
    out = []
    for t, cf, s0 in zip(tasks, correct_first, speaker0_correct):
        options = (t.correct, t.incorrect) if cf else (t.incorrect, t.correct)
        ci = 0 if cf else 1
        s = ci if s0 else 1 - ci
        sides = {"debate": [s, 1 - s], "consultancy": [s], "double_consultancy": [0, 1], "none": []}[protocol]
        out.append(Transcript(t, protocol, options, sides))
    return out


def visible_speeches(tr: Transcript, speaker: int, round_: int, sequential: bool) -> list[Speech]:
    """What ``speaker`` reads before its round-``round_`` speech (module doc)."""
    if tr.protocol == "debate":
        return [s for s in tr.speeches
                if s.round < round_ or (sequential and s.round == round_ and s.speaker < speaker)]
    return [s for s in tr.speeches if s.speaker == speaker and s.round < round_]


# --- prompt texts -----------------------------------------------------------------------------

ROLE_TEXT = {
    "debate": "Debate: you and an opponent each defend one answer; a judge decides.",
    "consultancy": "Consultancy: you defend one answer; a judge decides.",
    "double_consultancy": "Consultancy: you defend one answer; a judge decides.",
}


def speech_prompt(tr: Transcript, speaker: int, round_: int, shown: list[Speech], context: str,
                  omitted: int = 0) -> str:
    """THE speech prompt: every debater and consultant reads this format."""
    mine = tr.options[tr.sides[speaker]]
    other = tr.options[1 - tr.sides[speaker]]
    lines = [ROLE_TEXT[tr.protocol], f"Question: {tr.task.question}", "Context:", context or "(none)"]
    if omitted or shown:
        lines.append("Speeches so far:")
    if omitted:
        lines.append(f"({omitted} earlier speeches omitted)")
    lines += [f"For {tr.options[tr.sides[s.speaker]]}: {s.text}" for s in shown]
    lines += [f"You defend: {mine} (the other answer: {other})",
              f"Your speech, round {round_ + 1}; quote the context as <quote>exact words</quote>:"]
    return "\n".join(lines)


JUDGE_HEADER = {
    "debate": "Two debaters argued, each for one answer:",
    "consultancy": "One consultant argued for one answer (it may defend the wrong one):",
    "double_consultancy": "Two consultants argued separately, each for one answer:",
    "none": "",
}


def judge_prompt(tr: Transcript, swapped: bool, hidden_context: bool, omitted: int = 0,
                 context: str | None = None) -> str:
    """THE judge prompt: the options labelled A/B (reversed when ``swapped``), the
    speeches, and the question the label scores answer."""
    options = tr.options[::-1] if swapped else tr.options

    def name(s: Speech) -> str:
        label = LABELS[tr.sides[s.speaker] ^ int(swapped)]
        return f"{'Debater' if tr.protocol == 'debate' else 'Consultant'} for {label}"

    lines = ["You are the judge. Exactly one answer is correct.", f"Question: {tr.task.question}"]
    if not hidden_context:
        lines += ["Context:", tr.task.context if context is None else context]
    speeches = tr.speeches
    if tr.protocol == "double_consultancy":  # side by side: one consultancy after the other
        speeches = sorted(speeches, key=lambda s: (tr.sides[s.speaker] ^ int(swapped), s.round))
    if speeches or omitted:
        lines += [JUDGE_HEADER[tr.protocol],
                  "(<v_quote> marks a quote checked against the hidden context; <u_quote> one that failed.)"]
    if omitted:
        lines.append(f"({omitted} earlier speeches omitted)")
    lines += [f"{name(s)}: {s.text}" for s in speeches[omitted:]]
    lines += [f"{LABELS[0]}: {options[0]}", f"{LABELS[1]}: {options[1]}", "Which answer is correct? Reply A or B."]
    return "\n".join(lines)


def fit_prompt(tokenizer: Any, build: Callable[[int, str | None], str], n_speeches: int, context: str,
               max_tokens: int) -> tuple[list[int], bool]:
    """Token ids of ``build(omitted, context)`` within ``max_tokens`` (rule 5 of the module
    doc). Returns (ids, whether anything was cut)."""
    ids = encode_prompt(tokenizer, build(0, None))
    if len(ids) <= max_tokens:
        return ids, False
    for k in range(1, n_speeches + 1):
        ids = encode_prompt(tokenizer, build(k, None))
        if len(ids) <= max_tokens:
            return ids, True
    ctx = context
    while len(ctx) > 16:
        ctx = ctx[: len(ctx) // 2] + " [...]"
        ids = encode_prompt(tokenizer, build(n_speeches, ctx))
        if len(ids) <= max_tokens:
            return ids, True
    return ids[:1] + ids[len(ids) - max_tokens + 1 :], True


def speech_prompt_ids(tokenizer: Any, tr: Transcript, speaker: int, round_: int, shown: list[Speech],
                      max_tokens: int) -> tuple[list[int], bool]:
    """:func:`speech_prompt` as token ids within ``max_tokens`` (rule 5)."""
    def build(omitted: int, ctx: str | None) -> str:
        return speech_prompt(tr, speaker, round_, shown[omitted:], tr.task.context if ctx is None else ctx, omitted)

    return fit_prompt(tokenizer, build, len(shown), tr.task.context, max_tokens)


# --- running a protocol ---------------------------------------------------------------------------

def run_protocol(tasks: list[DebateTask], protocol: str, engine: Any, tokenizer: Any, cfg: ProtocolConfig,
                 sampling: Any, seed: int = 0) -> list[Transcript]:
    """All transcripts of ``protocol`` on ``tasks``: one engine call per round (per turn
    when sequential) for all transcripts at once."""
    trs = new_transcripts(tasks, protocol, seed)
    n_speakers = len(trs[0].sides) if trs else 0
    sequential = protocol == "debate" and cfg.turn_order == "sequential"
    groups = [[k] for k in range(n_speakers)] if sequential else [list(range(n_speakers))]
    for r in range(cfg.num_rounds if n_speakers else 0):
        for group in groups:
            jobs = [(tr, k) for tr in trs for k in group]
            prompts = []
            for tr, k in jobs:
                ids, cut = speech_prompt_ids(tokenizer, tr, k, r, visible_speeches(tr, k, r, sequential),
                                             cfg.max_prompt_tokens)
                tr.prompt_cuts += int(cut)
                prompts.append(ids)
            for (tr, k), c in zip(jobs, generate_fitting(engine, prompts, sampling)):
                text, flags = sanitize_speech(c.text, tr.task.context, cfg.max_speech_chars)
                flags["at_max_tokens"] = int(c.finish_reason == "length")
                tr.speeches.append(Speech(k, r, text, c.text, list(c.prompt_ids), list(c.token_ids),
                                          list(c.logprobs), flags, c.version))
    return trs
