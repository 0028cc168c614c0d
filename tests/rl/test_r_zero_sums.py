"""R-Zero's ``task_form: sum``: the written sum as reasoning-gym's chain_sum question, its checker,
its held-out set (the positive control's), the corpus kind that teaches the request and the
build that ships it."""

import random

import pytest

from lmselfplay.models import tiny
from lmselfplay.models.pretrain import Corpus
from lmselfplay.r_zero.config import RZeroConfigs
from lmselfplay.r_zero.steps import heldout_tasks, sum_task, written_text
from lmselfplay.rl.repetition import repetition_penalty
from lmselfplay.tasks.sums import (
    CHAIN_SUM_CONFIG,
    SUM_TASK,
    SUM_WRITE_PROMPT,
    chain_sum_expression,
    sum_expression,
    sum_question,
)
from lmselfplay.tasks.task_sets import TaskSet, is_heldout
from lmselfplay.verifiers.referees import AnswerMatcher, RulesReferee, VoteReferee


def test_a_written_sum_reads_as_reasoning_gyms_chain_sum_question():
    import reasoning_gym

    ds = reasoning_gym.create_dataset("chain_sum", size=50, seed=11, **CHAIN_SUM_CONFIG)
    for entry in ds:
        expression = entry["question"].split(": ", 1)[1].removesuffix(" =")
        assert sum_expression(expression) == expression
        assert sum_question(expression) == entry["question"]


@pytest.mark.parametrize("text", ["4 + 3", "10 + 1 + 2", "4 + 3 - 2 = 5", "4 * 3 + 2", "four + 3 - 2", "x" * 100, "", None])
def test_only_three_one_digit_numbers_joined_by_plus_or_minus_are_a_sum(text):
    assert sum_expression(text) is None


def test_the_generator_writes_sums_the_checker_accepts():
    rng = random.Random(0)
    written = [chain_sum_expression(rng) for _ in range(300)]
    assert all(sum_expression(w) == w for w in written) and len(set(written)) > 200
    assert sum_expression("  4 +  3\n- 2 ") == "4 + 3 - 2"


def test_a_sum_task_is_the_chain_sum_question_answered_between_tags():
    task, reason = sum_task("q", "4 - 7 + 2")
    assert reason is None and task.kind == "sum" and task.expression == "4 - 7 + 2"
    assert task.question == sum_question("4 - 7 + 2") and "<answer>" in task.prompt
    assert sum_task("q", "4 + 3 - 2 answer 7") == (None, "injection")
    assert sum_task("q", "Ann has 3 apples.") == (None, "not_a_question")


def test_the_repetition_penalty_compares_the_sums_not_their_shared_template():
    rng = random.Random(3)
    distinct = [sum_task(f"q{i}", chain_sum_expression(rng))[0] for i in range(32)]
    repeated = [sum_task(f"r{i}", "6 - 6 + 6")[0] for i in range(32)]
    penalty = lambda tasks: repetition_penalty(  # noqa: E731
        [written_text("sum", t.question, t.expression) for t in tasks], threshold=0.5, weight=1.0)
    assert penalty(distinct).mean() < 0.25 and penalty(repeated).min() == 1.0
    # the questions themselves share the chain_sum template: every pair reads as a repeat
    questions = repetition_penalty([t.question for t in distinct], threshold=0.5, weight=1.0)
    assert questions.min() == 1.0
    assert written_text("arithmetic", "Ann has 3 apples.", "3") == "Ann has 3 apples."


def test_the_pool_counts_its_distinct_kept_sums_and_their_diversity():
    from lmselfplay.r_zero.metrics import pool_measures

    def record(expression, kept):
        task, _ = sum_task("q", expression)
        return {"kind": "sum", "question": task.question, "expression": expression, "well_formed": True,
                "truth": "1", "label": "1", "kept": kept, "label_correct": True, "true_solve_rate": 0.5}

    varied = [record(e, True) for e in ("4 - 9 + 2", "5 + 1 + 9", "0 - 6 - 3", "4 + 4 - 1")]
    alike = [record("6 + 6 + 6", True)] * 3 + [record("4 - 9 + 2", False)]
    assert pool_measures(varied)["study/n_kept_distinct"] == 4 and pool_measures(alike)["study/n_kept_distinct"] == 1
    assert pool_measures(varied)["study/diversity"] > 0.5 > pool_measures(alike)["study/diversity"]


def test_the_rules_read_the_answer_between_tags():
    matcher = AnswerMatcher()
    try:
        task, _ = sum_task("q", "4 - 7 + 2")
        verdicts = RulesReferee(matcher=matcher).score(
            [task] * 4, ["<answer>-1</answer>", "#### -1", "<answer>1</answer><answer>-1</answer>", "<answer>3</answer>"])
        assert [v.reward for v in verdicts] == [1.0, 0.0, 1.0, 0.0]
        assert verdicts[0].label == "-1" and verdicts[1].detail["no_answer"]
        assert verdicts[2].detail["multiple_answers"]
        votes = VoteReferee(matcher=matcher).score([task] * 3, ["<answer>5</answer>", "<answer>5</answer>", "<answer>-1</answer>"])
        assert votes[0].label == "5" and [v.reward for v in votes] == [1.0, 1.0, 0.0]
    finally:
        matcher.close()


@pytest.mark.parametrize("seed", [0, 2])
def test_the_heldout_set_is_the_positive_controls(seed):
    cfg = RZeroConfigs.parse(["--task_form", "sum", "--referee", "grounded", "--heldout_size", "40", "--seed", str(seed)])
    assert cfg.rzero.referee == "rules"
    ours = heldout_tasks(cfg)
    control = TaskSet(SUM_TASK, 40, task_config=CHAIN_SUM_CONFIG, heldout_seed=seed).heldout
    assert [t.prompt for t in ours] == [t.prompt for t in control]
    assert [t.answer for t in ours] == [t.answer for t in control] and all(t.kind == "sum" for t in ours)


def test_the_corpus_teaches_the_request_and_never_writes_a_heldout_bucket_question():
    cfg = tiny.TinyConfig(games="nim", task_weights="nim=0,arithmetic=0,programs=0,reading=0,sum_writing=1",
                          exclude_heldout=True)
    corpus = Corpus(cfg, random.Random(0))
    drawn = [corpus.sample() for _ in range(2000)]
    assert {p for p, _, _ in drawn} == {SUM_WRITE_PROMPT}
    assert all(sum_expression(a) == a for _, a, _ in drawn)
    assert not any(is_heldout(sum_question(a)) for _, a, _ in drawn)


def test_the_v8sums_build_continues_v8_with_the_request_in_its_mix():
    cfg = tiny.build_config("v8sums")
    assert cfg.base_config() == tiny.build_config("v8")  # inherits v8's shape and tokenizer
    weights = cfg.weights()
    assert weights["sum_writing"] > 0
    assert {k for k, v in weights.items() if v > 0} - {"sum_writing"} == \
        {k for k, v in tiny.build_config("v8").weights().items() if v > 0}


def test_v8sums_writes_sums_when_asked_and_v8_does_not():
    from lmselfplay.lm.engines import SamplingParams, make_engine
    from lmselfplay.lm.engines.factory import EngineConfig
    from lmselfplay.lm.prompt import encode_prompt
    from lmselfplay.models.policy import PolicyConfig, load_policy

    def written(build):
        model, tok = load_policy(PolicyConfig(model_name_or_path=f"embedded:{build}"), device="cpu")
        engine = make_engine(EngineConfig(), model, tok, answer_budget=16, temperature=1.0, top_p=1.0, seed=0)
        comps = engine.generate([encode_prompt(tok, SUM_WRITE_PROMPT)] * 64, SamplingParams(max_new_tokens=16, seed=4))
        return [sum_expression(c.text) for c in comps]

    ours, before = written("v8sums"), written("v8")
    assert sum(w is not None for w in ours) >= 56 and len(set(ours)) >= 48
    assert sum(w is not None for w in before) <= 4
