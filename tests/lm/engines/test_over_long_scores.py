"""A (prompt, completion) pair longer than the engine takes is scored by no engine call: vLLM scores
it as one prompt of ``len(p) + len(c)`` tokens and raises for the whole batch when that reaches
``max_model_len`` (``_validate_prompt_len`` in vllm/v1/engine/input_processor.py). Each over-long
pair reads as "no answer" (NaN): the judge is undecided, the readout gives that move probability 0."""

from __future__ import annotations

import math

import pytest
from lm_fixtures import tiny_model, tiny_tokenizer

from lmselfplay.debate.judge import LLMJudge, judge_transcripts
from lmselfplay.debate.protocols import new_transcripts
from lmselfplay.debate.tasks import arithmetic_tasks
from lmselfplay.games import make
from lmselfplay.lm.engines import HFEngine
from lmselfplay.lm.engines.base import OverLongPrompt, score_fitting
from lmselfplay.lm.readout import answer_distribution, normalized


def recording(engine):
    """The engine with every score call's sequence lengths recorded in ``engine.seen``."""
    engine.seen, real = [], engine.score
    engine.score = lambda ps, cs, **kw: (engine.seen.append([len(p) + len(c) for p, c in zip(ps, cs)]),
                                         real(ps, cs, **kw))[1]
    return engine


def test_an_over_long_pair_never_reaches_the_engine_and_scores_nan():
    engine = recording(HFEngine(tiny_model(), tiny_tokenizer()))
    engine.max_model_len = 16  # the limit is 15 tokens of prompt + completion
    prompts, completions = [[1, 5, 6], [1] + [7] * 12, [1, 8]], [[9, 10], [11, 12, 13], [14]]
    direct = engine.score([prompts[0], prompts[2]], [completions[0], completions[2]])
    engine.seen.clear()
    with pytest.warns(OverLongPrompt, match="1 of 3 scored sequence"):
        out = score_fitting(engine, prompts, completions)
    assert engine.seen == [[5, 3]]
    assert out[0] == direct[0] and out[2] == direct[1]
    assert len(out[1]) == 3 and all(math.isnan(x) for x in out[1])
    assert engine.over_long_prompts == 1


def test_pairs_that_fit_are_scored_in_one_call_as_before():
    engine = recording(HFEngine(tiny_model(), tiny_tokenizer()))
    engine.max_model_len = 6  # 5 tokens fit
    out = score_fitting(engine, [[1, 2, 3], [1, 2]], [[4, 5], [6]])
    assert engine.seen == [[5, 3]] and len(out) == 2 and getattr(engine, "over_long_prompts", 0) == 0


def test_the_readout_of_a_position_the_engine_cannot_read_is_uniform_not_a_crash():
    tok = tiny_tokenizer()
    engine = recording(HFEngine(tiny_model(), tok))
    ttt = make("tictactoe")
    state = ttt.new_initial_state()
    engine.max_model_len = 8  # no tic-tac-toe prompt fits
    with pytest.warns(OverLongPrompt):
        (dist,) = answer_distribution(engine, tok, ttt, [state])
    assert engine.seen == []
    assert dist == {a: pytest.approx(1 / 9) for a in ttt.legal_actions(state)}


def test_a_move_that_cannot_be_scored_gets_probability_zero():
    assert normalized({0: math.log(0.2), 1: math.nan, 2: math.log(0.6)}) == {
        0: pytest.approx(0.25), 1: 0.0, 2: pytest.approx(0.75)}


def test_an_over_long_judge_prompt_is_an_undecided_judgment_and_the_others_are_judged():
    tok = tiny_tokenizer()
    engine = recording(HFEngine(tiny_model(seed=1), tok))
    judge = LLMJudge(engine, tok, max_prompt_tokens=400)  # the judge's budget is more than the engine takes
    transcripts = new_transcripts(arithmetic_tasks(3, seed=0), "none", seed=0)
    lengths = [len(judge.prompt_ids(tr, False)) for tr in transcripts]
    engine.max_model_len = max(lengths)  # the longest transcript's prompt + label no longer fits
    with pytest.warns(OverLongPrompt):
        js = judge_transcripts(judge, transcripts)
    longest = lengths.index(max(lengths))
    assert js[longest].p_correct == 0.5 and judge.invalid >= 2
    assert all(max(batch) <= max(lengths) - 1 for batch in engine.seen)


def test_lm_eval_rolling_windows_fit_the_engine_so_no_window_is_lost():
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from lmselfplay.eval.lm_eval_bridge import LMSelfPlay

    tok = tiny_tokenizer()
    engine = recording(HFEngine(tiny_model(seed=3), tok, max_batch_size=8))
    engine.max_model_len = 40  # as a vLLM engine declares it: sequences of 39 tokens fit
    lm = LMSelfPlay(engine=engine, tokenizer=tok)
    text = "Tic-tac-toe board:\nX . O\n. X .\n. . O\n" * 6
    assert len(tok(text, add_special_tokens=False)["input_ids"]) > 3 * lm.max_length  # several windows
    (total,) = lm.loglikelihood_rolling([Instance(request_type="loglikelihood_rolling", doc={},
                                                  arguments=(text,), idx=0)])
    assert math.isfinite(total) and max(max(b) for b in engine.seen) == 39
