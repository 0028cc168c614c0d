"""v8, the language recipes' build: numbers as whole tokens, a corpus that never draws a held-out
question (the held-out bucket of word problems and programs, the reasoning suite's questions),
the reasoning suite's tasks at training seeds, and ``embedded:v8`` as a model name."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from lmselfplay.games.model_texts import game_params_of
from lmselfplay.lm.prompt import format_prompt
from lmselfplay.models import tiny
from lmselfplay.models.policy import resolve_model_path
from lmselfplay.models.pretrain import Corpus
from lmselfplay.models.tokenizer import train_tokenizer
from lmselfplay.tasks.task_sets import SUITE_TASKS, TaskSet, is_heldout, suite_questions
from lmselfplay.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def test_earlier_keys_do_not_change_and_v8_has_its_own():
    assert tiny.build_config("v7").key() == "92ae7ac73836"
    assert tiny.build_config("v8").key() not in {tiny.build_config(b).key() for b in tiny.BUILDS if b != "v8"}


def test_the_suite_tasks_are_the_default_suites():
    suite = yaml.safe_load((ROOT / "eval" / "suites" / "default.yaml").read_text())
    assert {t["name"]: (t["seed"], t["size"], t.get("config", {})) for t in suite["tasks"]} == SUITE_TASKS


def _corpus_sample(cfg, n: int, seed: int = 0):
    corpus = Corpus(cfg, random.Random(seed))
    return [corpus.sample() for _ in range(n)]


def test_the_v8_corpus_never_draws_a_heldout_question():
    cfg = tiny.build_config("v8")
    heldout_prompts = {t.prompt for t in TaskSet("arithmetic", 500).heldout} | \
        {t.prompt for t in TaskSet("program", 500).heldout}
    suite = suite_questions()
    seen = _corpus_sample(cfg, 3000)
    prompts = [p for p, _, _ in seen]
    assert not set(prompts) & heldout_prompts
    assert not any(q in p for p in prompts for q in suite if p.startswith(q[:40]))
    word_problems = [p.split("\n", 1)[1] for p in prompts if p.startswith("Solve the problem.")]
    assert word_problems and not any(is_heldout(q) for q in word_problems)
    assert sum(a.startswith("<answer>") for _, a, _ in seen) > 300  # the suite's tasks, in their format


def test_without_exclude_heldout_the_corpus_does_draw_heldout_questions():
    """The check above can fail: the same corpus without the exclusion meets the bucket."""
    cfg = tiny.build_config("v8", exclude_heldout=False)
    word_problems = [p.split("\n", 1)[1] for p, _, _ in _corpus_sample(cfg, 2000)
                     if p.startswith("Solve the problem.")]
    assert any(is_heldout(q) for q in word_problems)


def test_the_numbers_tokenizer_keeps_common_numbers_whole():
    cfg = tiny.build_config("v8", tokenizer_texts=1500)
    texts = [format_prompt(None, p) + a for p, a, _ in _corpus_sample(cfg, 1500)]
    numbers = train_tokenizer(cfg, texts)
    bpe = train_tokenizer(tiny.build_config("v8", tokenizer="bpe"), texts)
    for text in ("17 + 25 = 42", "Ann has 12 pens and gets 19 more."):
        whole = numbers(text, add_special_tokens=False)["input_ids"]
        split = bpe(text, add_special_tokens=False)["input_ids"]
        assert len(whole) < len(split), (numbers.convert_ids_to_tokens(whole), bpe.convert_ids_to_tokens(split))
    assert "12" in numbers.tokenize("Ann has 12 pens") and "12" not in bpe.tokenize("Ann has 12 pens")


def test_embedded_build_names_resolve_and_unknown_ones_are_one_line():
    with pytest.raises(UserError, match="no embedded build 'v99'"):
        resolve_model_path("embedded:v99")
    assert game_params_of(resolve_model_path("embedded:v7")) == tiny.build_config("v7").game_kwargs()
