"""Adversarial Taboo's referee: word forms, what an utterance says, the guess form, and
the shipped target words. The rules and every decision about hostile utterances are
stated in :mod:`lmselfplay.games.taboo`; the game and the scripted bots both build on this."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from importlib import resources

from lmselfplay.games.base import Invalid

ATTACKER, DEFENDER = 0, 1
ROLES = ("attacker", "defender")
GUESS_FORM = "I know the word! It is <word>."

# The end of a game: who won, and why.
ATTACKER_SAID_WORD = "attacker_said_word"  # defender wins
DEFENDER_SAID_WORD = "defender_said_word"  # attacker wins
CORRECT_GUESS = "correct_guess"  # defender wins
WRONG_GUESS = "wrong_guess"  # attacker wins
WINNER = {ATTACKER_SAID_WORD: DEFENDER, DEFENDER_SAID_WORD: ATTACKER,
          CORRECT_GUESS: DEFENDER, WRONG_GUESS: ATTACKER}

# --- the referee: folding, word forms, mentions -----------------------------------------

_LOOKALIKES = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p",
    "с": "c", "т": "t", "у": "y", "х": "x", "і": "i", "ї": "i", "ј": "j", "ѕ": "s", "ԁ": "d",
    "һ": "h", "ӏ": "l", "ԛ": "q", "ԝ": "w", "ү": "y",
    "А": "a", "В": "b", "Е": "e", "К": "k", "М": "m", "Н": "h", "О": "o", "Р": "p", "С": "c",
    "Т": "t", "У": "y", "Х": "x", "І": "i", "Ј": "j", "Ѕ": "s",
    # Greek
    "α": "a", "β": "b", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t",
    "υ": "u", "χ": "x", "Α": "a", "Β": "b", "Ε": "e", "Ζ": "z", "Η": "h", "Ι": "i", "Κ": "k",
    "Μ": "m", "Ν": "n", "Ο": "o", "Ρ": "p", "Τ": "t", "Υ": "y", "Χ": "x",
    # Latin letters outside a-z that NFKC keeps
    "ı": "i", "ȷ": "j", "ɑ": "a", "ɡ": "g", "ꞵ": "b", "ł": "l", "ø": "o", "đ": "d", "ħ": "h",
    "ŧ": "t", "Ł": "l", "Ø": "o", "Đ": "d",
}
CONFUSABLES = str.maketrans(_LOOKALIKES)

_DASHES = "-\u2010\u2011\u2012\u2013\u2014\u2015\u2212"
_MARKS = "_*`~|" + _DASHES  # join letters with or without spaces around them
_SPACE = set(" \t\n\r\f\v")
_TIGHT = set(_MARKS + "'\u2018\u2019\u02bc\".,:;/+\u00b7\u2022")  # join only without spaces
_SPELL = _TIGHT | _SPACE  # between spelled-out single letters
_RUN = re.compile(r"[a-z]+")


def is_plain_word(word: str) -> bool:
    """Letters a-z only: the words a target can be."""
    return _RUN.fullmatch(word) is not None


def fold(text: str) -> str:
    """NFKC, look-alike letters to Latin, accents and invisible characters dropped, casefold."""
    t = unicodedata.normalize("NFKC", text).translate(CONFUSABLES).casefold()
    t = unicodedata.normalize("NFKD", t)  # after casefold, which can add accents ("İ")
    return "".join(c for c in t if unicodedata.category(c) not in ("Mn", "Cf"))


@lru_cache(maxsize=8192)
def word_forms(word: str) -> frozenset[str]:
    """Every inflected form of ``word`` (folded), from lemminflect's tables; for a word it
    does not know, its rules for a regular noun and verb."""
    import lemminflect

    w = fold(word).strip()
    table = dict(lemminflect.getAllInflections(w))
    if not table:
        for upos in ("NOUN", "VERB"):
            table.update(lemminflect.getAllInflectionsOOV(w, upos))
    forms = {w} | {fold(f) for fs in table.values() for f in fs}
    return frozenset(f for f in forms if _RUN.fullmatch(f))


def _pieces(folded: str) -> list[list[str]]:
    """Letter runs grouped into pieces that are read together (rules 4 and 5)."""
    pieces: list[list[str]] = []
    end = 0
    for m in _RUN.finditer(folded):
        gap, run = folded[end:m.start()], m.group()
        end = m.end()
        if pieces and gap:
            spaced = any(c in _SPACE for c in gap)
            if not spaced and set(gap) <= _TIGHT:
                pieces[-1].append(run)
                continue
            if len(run) == 1 and len(pieces[-1][-1]) == 1 and set(gap) <= _SPELL:
                pieces[-1].append(run)
                continue
        pieces.append([run])
    return pieces


def said(text: str, max_len: int = 32) -> set[str]:
    """Every letter string ``text`` says, up to ``max_len`` letters: its runs and the joins
    that rules 4 and 5 of the module docstring read together, folded."""
    out = set()
    for piece in _pieces(fold(text)):
        for i in range(len(piece)):
            joined = ""
            for run in piece[i:]:
                joined += run
                if len(joined) > max_len:
                    break
                out.add(joined)
    return out


def mentions(word: str, text: str) -> bool:
    """Does ``text`` say ``word`` in any form (rules 1-6 of the module docstring)?"""
    forms = word_forms(word)
    return bool(forms) and not forms.isdisjoint(said(text, max(map(len, forms))))


_GUESS_START = re.compile(r"[\W_]*i\s*know\s+the\s+word")
_GUESS = re.compile(
    r"i know the word\s*[!.,:]?\s*it(?: is|'s)\s+(?:(?:a|an|the)\s+)?"
    r"[\"'`*]*([a-z]+(?:[-'][a-z]+)*)[\"'`*]*\s*[.!]?")


def parse_guess(utterance: str) -> str | None | Invalid:
    """The guessed word of a defender's utterance, ``None`` if it is not a guess, or an
    ``Invalid`` for a malformed guess (starts like one, is not of the fixed form)."""
    t = " ".join(fold(utterance).replace("\u2019", "'").replace("\u2018", "'").split())
    t = t.strip("\"'`* ")
    if not _GUESS_START.match(t):
        return None
    m = _GUESS.fullmatch(t)
    if m is None:
        return Invalid(f"a guess must be the whole answer, exactly: {GUESS_FORM}")
    return m.group(1).replace("-", "").replace("'", "")


def clean_utterance(text: str, max_chars: int) -> str | Invalid:
    """White space collapsed, control characters dropped; empty or too long: Invalid."""
    if not isinstance(text, str):
        return Invalid(f"utterance is not text ({type(text).__name__})")
    kept = "".join(" " if c.isspace() else c for c in text if c.isspace() or unicodedata.category(c) != "Cc")
    u = " ".join(kept.split())
    if not u:
        return Invalid("empty utterance")
    if len(u) > max_chars:
        return Invalid(f"utterance longer than {max_chars} characters")
    return u


def judge(target: str, player: int, utterance: str) -> str:
    """The end reason this utterance causes ('' if the game goes on). Assumes a clean,
    well-formed utterance (see :meth:`Taboo.parse_action`)."""
    if player == DEFENDER:
        guess = parse_guess(utterance)
        if isinstance(guess, str):
            return CORRECT_GUESS if guess in word_forms(target) else WRONG_GUESS
        return DEFENDER_SAID_WORD if mentions(target, utterance) else ""
    return ATTACKER_SAID_WORD if mentions(target, utterance) else ""


# --- the target words ----------------------------------------------------------------------

SPLITS = ("train", "test")


@lru_cache(maxsize=4)
def load_words(split: str = "train") -> tuple[str, ...]:
    """The shipped target words of a split (``train``, held-out ``test``, or ``all``)."""
    if split == "all":
        return load_words("train") + load_words("test")
    if split not in SPLITS:
        raise ValueError(f"unknown taboo split {split!r}; known: train, test, all")
    text = resources.files("lmselfplay.games").joinpath(f"data/taboo_words_{split}.txt").read_text("utf-8")
    return tuple(w for w in (line.strip() for line in text.splitlines()) if w and not w.startswith("#"))
