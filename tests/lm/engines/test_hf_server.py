"""The weight-following CPU server (tests/hf_server.py) behind the server engine:
it samples from its own copy of a real model and follows the trainer's weight push."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_server import HFServer, TensorHTTPChannel
from lm_fixtures import tiny_model, tiny_tokenizer

from lmselfplay.lm.engines.base import SamplingParams
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.engines.server_pool import ServerUnavailable
from lmselfplay.lm.engines.vllm_server import VLLMServerEngine

PROMPTS = [[5, 6, 7, k] for k in range(10, 14)]


@pytest.fixture
def setup():
    tok = tiny_tokenizer()
    trainer_model = tiny_model(seed=0)
    with HFServer(copy.deepcopy(trainer_model), tok) as server:
        eng = VLLMServerEngine(tok, [server.url], timeout=30, push_timeout=30, backoff=0.01)
        yield tok, trainer_model, server, eng
        eng.close()


def _perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))


def test_the_server_samples_and_scores_with_the_weights_pushed_to_it(setup):
    tok, model, server, eng = setup
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    assert isinstance(eng.channels[server.url], TensorHTTPChannel) and eng.logprobs_mode == "processed_logprobs"
    _perturb(model)
    before = eng.generate(PROMPTS, sp)
    eng.update_weights(model, version=1)
    after = eng.generate(PROMPTS, sp)
    trainer_lps = HFEngine(model, tok).score(PROMPTS, [c.token_ids for c in after])
    for c, want in zip(after, trainer_lps):  # sampled from the pushed weights, not its old copy
        assert c.version == 1 and c.logprobs == pytest.approx(want, abs=1e-4)
    old_lps = HFEngine(model, tok).score(PROMPTS, [c.token_ids for c in before])
    assert any(c.logprobs != pytest.approx(w, abs=1e-2) for c, w in zip(before, old_lps))
    scored = eng.score(PROMPTS, [c.token_ids for c in after])
    for s, w in zip(scored, trainer_lps):
        assert s == pytest.approx(w, abs=1e-5)


def test_requests_sent_together_are_one_batch_and_a_completion_does_not_depend_on_it(setup):
    tok, model, server, eng = setup
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)
    together = eng.generate(PROMPTS, sp)
    alone = VLLMServerEngine(tok, [server.url], max_concurrency=1, timeout=30)
    one_by_one = alone.generate(PROMPTS, sp)
    alone.close()
    assert max(server.batches) > 1 and server.batches[-len(PROMPTS):] == [1] * len(PROMPTS)
    assert [c.token_ids for c in together] == [c.token_ids for c in one_by_one]
    assert len({tuple(c.token_ids) for c in together}) > 1  # each request its own seed


def test_a_bucket_the_model_cannot_hold_fails_the_push_with_one_line(setup):
    tok, model, server, eng = setup
    other = tiny_model(seed=0, width=64)  # other shapes under the same names
    with pytest.raises(ServerUnavailable, match="shape") as e:
        eng.update_weights(other, version=1)
    assert "\n" not in str(e.value)
    assert not eng.pool.in_rotation()  # never serves a half-loaded model
    eng.update_weights(model, version=2)  # the right weights re-admit it
    assert eng.pool.in_rotation() and eng.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))[0].version == 2


@pytest.mark.slow
def test_selfplay_recipe_overlapped_on_a_weight_following_server_trains_on_its_samples(model_dir, tmp_path):
    """The learning benchmark's path (benchmarks/bench_staleness_learning.py), 3 short steps:
    the server's samples carry the version they were drawn with and the trainer's own log-probs
    of them match the server's (it serves the pushed weights, one version behind at k = 1)."""
    import json

    from lmselfplay.utils.recipe_loader import run_recipe

    with HFServer(str(model_dir)) as server:
        args = {"model_name_or_path": str(model_dir), "output_dir": str(tmp_path / "run"), "max_steps": 3,
                "games": "nim", "episodes_per_step": 4, "eval_every": 0, "checkpoint_every": 0,
                "league_add_every": 0, "max_new_tokens": 4, "engine": "vllm-server", "max_staleness": 1,
                "vllm_server_timeout": 60, "vllm_push_timeout": 60, "weight_sync_threshold": 0}
        run_recipe("selfplay_games", [x for k, v in args.items() for x in (f"--{k}", str(v))]
                   + ["--vllm_server_urls", server.url])
        pushes = server.pushes
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["staleness/age"] for r in train] == [0.0, 1.0, 1.0] and pushes >= 3
    # step 1's games were sampled with exactly the trainer's weights, the later ones one update behind
    diffs = [r["train/logprob_diff"] for r in train]
    assert diffs[0] < 1e-4 < min(diffs[1:])


def test_serving_in_the_callers_process_leaves_its_global_generator_alone(setup):
    """A server in the trainer's own process (as here) must not move the trainer's RNG: rows
    draw with their own generators, unseeded ones from fresh entropy, greedy ones not at all."""
    tok, model, server, eng = setup
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    eng.generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=1.0))  # no seed
    eng.generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=0.0))
    assert torch.equal(torch.rand(3), want)
