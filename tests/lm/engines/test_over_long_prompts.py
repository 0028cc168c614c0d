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
from lmselfplay.utils.recipe_loader import run_recipe


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
        run_recipe("selfplay_games", [
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


# --- the server engine: vLLM's servers list their context in GET /v1/models and refuse longer requests (400)
def _server_engine(sims, **kw):
    from sim_server import SimChannel

    from lmselfplay.lm.engines.vllm_server import VLLMServerEngine

    by_url = {s.url: s for s in sims}
    return VLLMServerEngine(tiny_tokenizer(), [s.url for s in sims], timeout=5.0, retries=0, push_timeout=5.0,
                            channel_factory=lambda url, i: SimChannel(by_url[url]), **kw)


def _sent_prompt_lengths(sims):
    return sorted(len(c[2]["prompt"]) for s in sims for c in s.calls if c[:2] == ("POST", "/v1/completions"))


def test_the_server_engine_fits_prompts_to_its_smallest_servers_context():
    from sim_server import SimServer

    from lmselfplay.lm.engines.base import PROMPT_TOO_LONG, OverLongPrompt, generate_fitting

    vocab = len(tiny_tokenizer())
    with SimServer(vocab=vocab, max_model_len=64) as a, SimServer(vocab=vocab, max_model_len=48) as b:
        engine = _server_engine([a, b])
        assert engine.max_model_len == 48  # the smaller server's: every request must fit either
        prompts = [[1, 5, 6], [1] + [7] * 59, [1] + [8] * 45]  # fits, over the limit, fits with 2 tokens of room
        with pytest.warns(OverLongPrompt, match="1 of 3 prompt"):
            out = generate_fitting(engine, prompts, SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
        assert [o.finish_reason == PROMPT_TOO_LONG for o in out] == [False, True, False]
        assert out[1].token_ids == [] and out[1].prompt_ids == prompts[1]
        assert len(out[0].token_ids) >= 1 and len(out[2].token_ids) <= 2  # the answer stops at the context's end
        assert _sent_prompt_lengths([a, b]) == [3, 46]  # the long prompt never reached a server
        assert engine.over_long_prompts == 1
        engine.close()


def test_a_configured_max_model_len_caps_the_servers():
    from sim_server import SimServer

    with SimServer(vocab=len(tiny_tokenizer()), max_model_len=64) as sim:
        engine = _server_engine([sim], max_model_len=32)
        assert engine.max_model_len == 32
        engine.close()


def test_a_server_without_max_model_len_warns_once_and_its_400_forfeits_only_that_sample():
    from sim_server import SimServer

    from lmselfplay.lm.engines.base import PROMPT_TOO_LONG, OverLongPrompt, generate_fitting

    with SimServer(vocab=len(tiny_tokenizer()), max_model_len=16) as sim:
        sim.faults["no_max_model_len"] = True
        with pytest.warns(UserWarning, match="do not list max_model_len") as seen:
            engine = _server_engine([sim])
        assert len([w for w in seen if "max_model_len" in str(w.message)]) == 1
        assert engine.max_model_len is None
        prompts = [[1, 5, 6], [1] + [7] * 40, [1, 8]]
        with pytest.warns(OverLongPrompt, match="refused by the vLLM server"):
            out = generate_fitting(engine, prompts, SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
        assert [o.finish_reason == PROMPT_TOO_LONG for o in out] == [False, True, False]
        assert [len(o.token_ids) for o in out] == [4, 0, 4]
        assert engine.over_long_prompts == 1 and engine.pool.in_rotation()  # the server stays in rotation
        engine.close()


def test_the_main_job_on_a_server_goes_on_and_logs_them(tmp_path):
    from sim_server import SimServer

    model_dir = save_tiny(tmp_path / "model", seed=2)
    out = tmp_path / "run"
    # 53 tokens: tic-tac-toe's prompts (55 tokens) do not fit, nim's (50) do, with 3 tokens of room
    with SimServer(vocab=len(tiny_tokenizer()), max_model_len=53) as sim, \
            pytest.warns(UserWarning, match="longer than the engine"):
        run_recipe("selfplay_games", [
            "--model_name_or_path", str(model_dir), "--output_dir", str(out), "--max_steps", "2",
            "--games", "nim,tictactoe", "--episodes_per_step", "4", "--eval_every", "0", "--eval_games", "2",
            "--eval_positions", "4", "--checkpoint_every", "0", "--league_add_every", "0", "--max_new_tokens", "6",
            "--readout", "sampled", "--readout_samples", "2", "--engine", "vllm-server",
            "--vllm_server_urls", sim.url])  # sampled: the evaluation generates (its scoring is not fitted)
        sent = _sent_prompt_lengths([sim])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["rollout/over_long_prompts"] > 0 for r in train)
    assert train[-1]["train/engine/over_long_prompts"] >= train[0]["rollout/over_long_prompts"]
    assert sent and max(sent) <= 52  # no request the server would refuse
    assert (out / "final_model").exists()
