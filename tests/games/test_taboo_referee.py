"""Adversarial Taboo's referee on its own: folding, word forms, what an utterance says, the guess
form, the verdicts and the shipped word splits (the game's rules table is in test_taboo.py)."""

from lmselfplay.games.base import Invalid
from lmselfplay.games.taboo_referee import (
    ATTACKER,
    ATTACKER_SAID_WORD,
    CORRECT_GUESS,
    DEFENDER,
    WRONG_GUESS,
    clean_utterance,
    fold,
    judge,
    load_words,
    mentions,
    parse_guess,
    word_forms,
)


def test_fold_and_word_forms():
    assert fold("CAFÉ") == "cafe" and fold("Ｃat") == "cat"  # accents dropped, full-width folded
    assert {"run", "runs", "ran", "running"} <= word_forms("run")


def test_mentions_reads_inflections_and_spelled_letters_not_substrings():
    assert mentions("apple", "two apples please")
    assert mentions("apple", "a-p-p-l-e") and mentions("apple", "a p p l e")
    assert not mentions("apple", "pineapple") and not mentions("apple", "a red fruit")


def test_guess_form_and_verdicts():
    assert parse_guess("I know the word! It is apple.") == "apple"
    assert parse_guess("hello there") is None
    assert isinstance(parse_guess("I know the word apple"), Invalid)
    assert judge("apple", DEFENDER, "I know the word: it is apples") == CORRECT_GUESS
    assert judge("apple", DEFENDER, "I know the word: it is pear") == WRONG_GUESS
    assert judge("apple", ATTACKER, "an apple a day") == ATTACKER_SAID_WORD
    assert judge("apple", ATTACKER, "a red fruit") == ""


def test_clean_utterance_and_word_splits():
    assert clean_utterance("  a\tb\x00 c ", 10) == "a b c"
    assert isinstance(clean_utterance("   ", 10), Invalid)
    assert isinstance(clean_utterance("x" * 11, 10), Invalid)
    train, test = load_words("train"), load_words("test")
    assert train and test and not set(train) & set(test)
    assert load_words("all") == train + test
