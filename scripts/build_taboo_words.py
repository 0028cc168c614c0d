"""Build the Taboo target words: ``games/data/taboo_words_{train,test}.txt``.

    python scripts/build_taboo_words.py [--n 3000]

Reproducible from two packages' data, nothing downloaded: the English frequency ranking of
``wordfreq`` and the lexicon of ``lemminflect`` (both pinned in the file header written).
A word is kept when it is

* lower-case ASCII letters, 3 to 12 of them;
* a noun, and its own lemma, in lemminflect's lexicon, with a plural in its table; no
  adjective / adverb / auxiliary readings ("light", "good", "will"), no inflected forms
  ("things", "thought"), no words lemminflect does not know (names);
* mostly a noun: when it is also a verb, its past and -ing forms are together less than
  ``MAX_VERB_SHARE`` as frequent as the word itself ("dog", "water", "book" stay; "make",
  "work", "train", "help" go);
* not in the short hand-written ``EXCLUDE`` list below;

in wordfreq's order, the first ``n``. About one word in ten goes to the held-out split, by a
hash of the word (so the split of a word never changes when ``n`` does).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import tempfile
from importlib.metadata import version
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "games" / "data"
# What lemminflect tags as nouns but a player would not call a common noun: names that
# wordfreq lower-cases, pronoun-like and number words, a preposition, an adjective, slurs.
EXCLUDE = set("""
other via responsible nobody nothing anybody everybody somebody million billion trillion
fourth fifth sixth seventh eighth ninth tenth china smith tom christ jesus ass hell dude
pro nay sir mom dad damn bitch shit crap fuck dick pussy whore slut""".split())


MAX_VERB_SHARE = 0.2


def verb_share(word: str) -> float:
    """Frequency of the word's past / -ing forms relative to the word's."""
    import lemminflect
    import wordfreq

    table = lemminflect.getAllInflections(word, upos="VERB")
    forms = {f for tag in ("VBD", "VBG", "VBN") for f in table.get(tag, ()) if f != word}
    own = wordfreq.word_frequency(word, "en")
    return sum(wordfreq.word_frequency(f, "en") for f in forms) / own if own else float("inf")


def is_target(word: str) -> bool:
    import lemminflect

    if not re.fullmatch(r"[a-z]{3,12}", word) or word in EXCLUDE:
        return False
    lemmas = lemminflect.getAllLemmas(word)
    if "NOUN" not in lemmas or not set(lemmas) <= {"NOUN", "VERB"}:
        return False
    if any(forms != (word,) for forms in lemmas.values()):
        return False
    if not lemminflect.getAllInflections(word, upos="NOUN").get("NNS"):
        return False
    return "VERB" not in lemmas or verb_share(word) < MAX_VERB_SHARE


def held_out(word: str) -> bool:
    return int(hashlib.sha256(word.encode()).hexdigest()[:8], 16) % 10 == 0


def build(n: int) -> dict[str, list[str]]:
    import wordfreq

    words = [w for w in wordfreq.top_n_list("en", 60000) if is_target(w)][:n]
    if len(words) < n:
        raise SystemExit(f"only {len(words)} words qualify, asked for {n}")
    return {"train": [w for w in words if not held_out(w)], "test": [w for w in words if held_out(w)]}


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3000)
    args = ap.parse_args(argv)
    header = (f"# Taboo target words ({{split}}), most frequent first. Built by scripts/build_taboo_words.py "
              f"--n {args.n} with wordfreq {version('wordfreq')} and lemminflect {version('lemminflect')}.\n")
    for split, words in build(args.n).items():
        path = OUT / f"taboo_words_{split}.txt"
        write_atomic(path, header.format(split=split) + "\n".join(words) + "\n")
        print(f"{path}: {len(words)} words")


if __name__ == "__main__":
    main()
