"""A prompt longer than the engine takes is its sample's problem, never the run's: it is answered
empty without reaching the engine (vLLM would raise for the whole batch:
``_validate_prompt_len`` in vllm/v1/engine/input_processor.py), counted, warned about, and scored
as its recipe scores a failed answer — in a game, an illegal move that forfeits it."""

from __future__ import annotations

import json

import pytest
from lm_fixtures import save_tiny, tiny_model, tiny_tokenizer

import lmselfplay.lm.engines.base as base
from lmselfplay.games import make
from lmselfplay.lm.engines import HFEngine, SamplingParams
from lmselfplay.lm.rollout import Episode, LLMPlayer, RolloutStats, collect_episodes
from lmselfplay.utils.recipe_loader import load_recipe


def test_the_limit_is_the_engines_context_less_one():
    from lmselfplay.lm.engines.base import prompt_limit

    engine = HFEngine(tiny_model(), tiny_tokenizer())
    assert prompt_limit(engine) == engine.model.config.max_position_embeddings - 1
    engine.max_model_len = 64  # vLLM's, when the engine has one
    assert prompt_limit(engine) == 63
    assert prompt_limit(object()) is None


def test_an_over_long_prompt_never_reaches_the_engine_and_is_answered_empty():
    from lmselfplay.lm.engines.base import PROMPT_TOO_LONG, OverLongPrompt, generate_fitting

    engine = HFEngine(tiny_model(), tiny_tokenizer())
    engine.max_model_len = 16
    seen = []
    real = engine.generate
    engine.generate = lambda prompts, sp: (seen.append([len(p) for p in prompts]), real(prompts, sp))[1]
    prompts = [[1, 5, 6], [1] + [7] * 40, [1, 8]]
    with pytest.warns(OverLongPrompt, match="1 of 3 prompt"):
        out = generate_fitting(engine, prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
    assert seen == [[3, 2]]
    assert [o.finish_reason == PROMPT_TOO_LONG for o in out] == [False, True, False]
    assert out[1].token_ids == [] and out[1].text == "" and out[1].prompt_ids == prompts[1]
    assert engine.over_long_prompts == 1


def test_in_a_game_it_is_a_forfeit_of_its_author_and_the_other_games_go_on(monkeypatch):
    tok = tiny_tokenizer()
    engine = HFEngine(tiny_model(), tok)
    me = LLMPlayer(engine, tok)
    nim, ttt = make("nim"), make("tictactoe")
    from lmselfplay.lm.prompt import encode_prompt

    lengths = {g.name: len(encode_prompt(tok, g.observation_text(g.new_initial_state(), 0))) for g in (nim, ttt)}
    assert lengths["tictactoe"] > lengths["nim"]
    engine.max_model_len = lengths["tictactoe"]  # tic-tac-toe's prompts no longer fit, nim's do
    stats = RolloutStats()
    with pytest.warns(UserWarning, match="prompt"):
        done = collect_episodes([Episode(nim, (me, me), seed=0), Episode(ttt, (me, me), seed=1)],
                                SamplingParams(max_new_tokens=4, temperature=1.0, seed=0), stats=stats)
    by_game = {f.episode.game.name: f for f in done}
    assert by_game["tictactoe"].returns == [-1.0, 1.0]  # the first seat could not answer: it forfeits
    assert stats.over_long_prompts >= 1 and stats.forfeits >= 1 and len(done) == 2  # counted


def test_the_main_job_goes_on_and_logs_them(tmp_path, monkeypatch):
    model_dir = save_tiny(tmp_path / "model", seed=2)
    monkeypatch.setattr(base, "prompt_limit", lambda engine: 52, raising=False)  # tic-tac-toe's prompts (55 tokens) do not fit, nim's (50) do
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="longer than the engine"):
        load_recipe("selfplay_games").main([
            "--model_name_or_path", str(model_dir), "--output_dir", str(out), "--max_steps", "2",
            "--games", "nim,tictactoe", "--episodes_per_step", "4", "--eval_every", "0", "--eval_games", "2",
            "--eval_positions", "4", "--checkpoint_every", "0", "--league_add_every", "0", "--max_new_tokens", "6",
            "--readout", "bare"])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["rollout/over_long_prompts"] > 0 for r in train)
    assert train[-1]["train/engine/over_long_prompts"] >= train[0]["rollout/over_long_prompts"]
    assert (out / "final_model").exists()
