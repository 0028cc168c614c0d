"""The engine-independent parts of the vLLM path, on CPU without vLLM: weight names, buckets,
the weight-sync check, the server client (against a fake server on 127.0.0.1), the factory.
The real colocated engine runs in the ``slow`` test at the end (skipped unless vLLM imports)."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import socket
import subprocess
import sys
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import torch
from lm_fixtures import tiny_model, tiny_tokenizer

from lmselfplay.lm.engines import (
    EngineConfig,
    HFEngine,
    SamplingParams,
    make_engine,
)
from lmselfplay.lm.engines.base import to_completion
from lmselfplay.lm.engines.vllm import (
    check_logprobs_mode,
    logprobs_mode_for,
    request_seeds,
)
from lmselfplay.lm.engines.vllm_server import ServerError, ServerUnavailable, VLLMServerEngine
from lmselfplay.lm.engines.weight_sync import (
    bucket_units,
    iter_state_buckets,
    iter_weight_buckets,
    vllm_name,
    weight_metadata,
    weight_units,
)
from lmselfplay.lm.engines.weight_sync_check import (
    StaleWeightsError,
    StaleWeightsWarning,
    WeightSyncCheck,
)
from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig


def _lora(model, **kw):
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", **kw))
    torch.manual_seed(1)
    for n, p in peft.named_parameters():
        if "lora_B" in n:  # PEFT initializes B = 0 (delta 0): make the merge visible
            p.data.normal_(0, 0.1)
    return peft


# --- weight names -----------------------------------------------------------------------

@pytest.mark.parametrize("trainer_name, engine_name", [
    ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("module.model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"),  # DDP / DeepSpeed
    ("_orig_mod.module.lm_head.weight", "lm_head.weight"),  # torch.compile around DDP
    ("model.layers.0._checkpoint_wrapped_module.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.weight"),
    ("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("module.base_model.model.model.norm.weight", "model.norm.weight"),  # PEFT under ZeRO-3
    ("base_model.model.lm_head.modules_to_save.default.weight", "lm_head.weight"),
    ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", None),
    ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight", None),
    ("base_model.model.model.embed_tokens.lora_embedding_A.default", None),
    ("base_model.model.lm_head.original_module.weight", None),
])
def test_vllm_name(trainer_name, engine_name):
    assert vllm_name(trainer_name) == engine_name


def test_plain_model_units_are_its_parameters_in_order():
    model = tiny_model()
    units = weight_units(model)
    assert [u.name for u in units] == [n for n, _ in model.named_parameters()]
    for u, (_, p) in zip(units, model.named_parameters()):
        assert u.build().data_ptr() == p.data_ptr() and u.nbytes == p.numel() * 4 and u.shape == tuple(p.shape)


def test_lora_units_push_the_merged_weights_without_touching_the_trainer():
    peft = _lora(tiny_model())
    before = {n: p.detach().clone() for n, p in peft.named_parameters()}
    pushed = {n: t.clone() for bucket in iter_weight_buckets(peft, max_bytes=1 << 14) for n, t in bucket}
    merged = copy.deepcopy(peft).merge_and_unload()  # PEFT's own merge: the independent reference
    assert set(pushed) == {n for n, _ in merged.named_parameters()}
    for n, p in merged.named_parameters():
        torch.testing.assert_close(pushed[n], p.data, rtol=0, atol=1e-6)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(pushed[q], before[f"base_model.model.{q}".replace(".weight", ".base_layer.weight")])
    for n, p in peft.named_parameters():  # out of place: nothing merged into the trainer's tensors
        assert torch.equal(p, before[n]), n
    assert [m[0] for m in weight_metadata(peft)] == list(pushed)


def test_modules_to_save_push_the_trained_copy():
    peft = _lora(tiny_model(), modules_to_save=["lm_head"])
    trained = peft.base_model.model.lm_head.modules_to_save["default"].weight
    trained.data.add_(1.0)  # the copy that trains differs from original_module
    pushed = dict(t for b in iter_weight_buckets(peft) for t in b)
    torch.testing.assert_close(pushed["lm_head.weight"], trained.data)
    assert not any("original_module" in n or "lora" in n for n in pushed)


# --- buckets ------------------------------------------------------------------------------

@pytest.mark.parametrize("budget", [1, 3000, 20_000, 1 << 30])
def test_buckets_keep_order_cover_every_parameter_once_and_respect_the_budget(budget):
    model = tiny_model()
    units = weight_units(model)
    buckets = bucket_units(units, budget)
    flat = [u for b in buckets for u in b]
    assert [u.name for u in flat] == [u.name for u in units]  # order, each once
    params = [id(p) for u in flat for p in u.params]
    assert sorted(params) == sorted(id(p) for p in model.parameters())
    for b in buckets:
        size = sum(u.nbytes for u in b)
        assert size <= budget or len(b) == 1  # only a single tensor over budget travels alone
    for a, b in zip(buckets, buckets[1:]):  # greedy: the next unit did not fit
        assert sum(u.nbytes for u in a) + b[0].nbytes > budget
    if budget >= sum(u.nbytes for u in units):
        assert len(buckets) == 1


def test_each_bucket_is_gathered_alone_and_released_before_the_next():
    model = tiny_model()
    gathered, live = [], []

    @contextlib.contextmanager
    def gather(params):
        assert not live, "a bucket was requested while another was still gathered"
        live.append(params)
        gathered.append([id(p) for p in params])
        yield
        live.pop()

    out = []
    for bucket in iter_weight_buckets(model, max_bytes=4096, gather=gather):
        assert len(live) == 1 and [id(p) for p in live[0]] == gathered[-1]
        out += [n for n, _ in bucket]
    assert len(gathered) > 3
    assert sum(len(g) for g in gathered) == len(list(model.parameters()))
    assert out == [n for n, _ in model.named_parameters()]
    with pytest.raises(ValueError, match="max_bytes"):
        bucket_units(weight_units(model), 0)


def test_state_dict_buckets_use_engine_names():
    peft = _lora(tiny_model())
    state = {n: t.clone() for n, t in peft.state_dict().items()}
    names = [n for b in iter_state_buckets(state, 1 << 12) for n, _ in b]
    assert "model.layers.0.self_attn.q_proj.weight" in names and not any("lora" in n for n in names)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_zero3_buckets_are_gathered_one_at_a_time_on_every_rank(tmp_path):
    pytest.importorskip("deepspeed")
    from mp_helpers import CONFIGS, ROOT, _env

    script = ROOT / "tests" / "mp_scripts" / "weight_sync_zero3.py"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "zero3_cpu.yaml"),
           str(script), "--out", str(tmp_path), "--max_bytes", "20000"]
    r = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    plain = [n for n, _ in tiny_model().named_parameters()]
    for rk in ranks:
        assert rk["world"] == 2 and rk["names"] == plain  # every tensor once, in order, plain names
        assert rk["max_abs_err"] == 0.0  # the full weights, gathered from the shards
        assert rk["gathered"] == rk["bucket_numel"]  # only the bucket's parameters are materialized
        assert max(rk["gathered"]) < rk["full_numel"] / 3 and len(rk["gathered"]) > 3
        assert rk["released_after"] and rk["meta_shapes"] == rk["full_shapes"]


# --- the weight-sync check ---------------------------------------------------------------

def test_detector_threshold_warns_or_raises():
    d = WeightSyncCheck(threshold=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert d.check(0.02, step=1) == {"sync/logprob_diff": 0.02, "sync/stale": 0.0}
        d.check(math.nan, step=2)  # no sampled token: nothing to judge
    with pytest.warns(StaleWeightsWarning, match="step 3.*0.2500"):
        assert d.check(0.25, step=3)["sync/stale"] == 1.0
    with pytest.raises(StaleWeightsError, match="strict_sync"):
        WeightSyncCheck(0.1, strict=True).check(0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        WeightSyncCheck(0.0).check(5.0)  # threshold 0: measured and logged, never judged
    with pytest.raises(ValueError):
        WeightSyncCheck(-1)


def _rollout(engine, tok, n=12, seed=0):
    prompts = [tok(f"Nim: {k} stones left. Your move")["input_ids"] for k in range(n)]
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, seed=seed))
    return [Sample(o.prompt_ids, o.token_ids, o.logprobs, advantage=1.0 if i % 2 else -1.0)
            for i, o in enumerate(outs) if o.token_ids]


def test_an_engine_left_a_step_behind_trips_the_detector():
    tok = tiny_tokenizer()
    cfg = TrainerConfig(learning_rate=3e-2, beta=0.0, num_iterations=2, max_grad_norm=0.0, merge_identical=False)
    trainer = PolicyTrainer(tiny_model(seed=0), tok, cfg)
    engine = HFEngine(copy.deepcopy(trainer.unwrapped), tok)  # its own copy: must be pushed to
    detector = WeightSyncCheck(threshold=0.05, strict=True)

    m = trainer.step(_rollout(engine, tok, seed=1))  # same weights: only float noise
    assert m["logprob_diff"] < 1e-4
    detector.check(m["logprob_diff"])
    # the push is skipped (the bug the detector exists for): the next rollout is a step stale
    m = trainer.step(_rollout(engine, tok, seed=2))
    assert m["logprob_diff"] > 0.05
    with pytest.raises(StaleWeightsError):
        detector.check(m["logprob_diff"], step=2)
    engine.update_weights(trainer.unwrapped)  # pushed: back in sync
    m = trainer.step(_rollout(engine, tok, seed=3))
    assert m["logprob_diff"] < 1e-4


# --- completions are cut like the HF engine's --------------------------------------------

def test_to_completion_cuts_like_the_hf_engine():
    tok, model = tiny_tokenizer(), tiny_model(seed=3)
    hf = HFEngine(model, tok)
    prompts = [tok(f"Tic-tac-toe board {k}")["input_ids"] for k in range(16)]
    sp = SamplingParams(max_new_tokens=10, temperature=1.5, seed=0, stop=["e", "o"])
    outs = hf.generate(prompts, sp)
    assert {o.finish_reason for o in outs} >= {"stop"}
    junk = tok("xyz", add_special_tokens=False)["input_ids"]
    for o in outs:  # an engine that ran on past the stop string is cut back to the same tokens
        tail = junk if o.finish_reason == "stop" else []
        c = to_completion(tok, o.prompt_ids, o.token_ids + tail, o.logprobs + [0.0] * len(tail), tok.eos_token_id,
                          sp.stop)
        assert (c.token_ids, c.text, c.finish_reason, c.logprobs) == (o.token_ids, o.text, o.finish_reason,
                                                                       o.logprobs)
    eos = to_completion(tok, [1], [5, tok.eos_token_id, 7], [-1.0, -2.0, -3.0], tok.eos_token_id, [])
    assert eos.token_ids == [5, tok.eos_token_id] and eos.finish_reason == "eos" and eos.logprobs == [-1.0, -2.0]


@pytest.mark.parametrize("mode, t, top_p, ok", [
    ("raw_logprobs", 1.0, 0.9, True), ("raw_logprobs", 0.0, 0.9, True), ("raw_logprobs", 0.7, 1.0, False),
    ("processed_logprobs", 0.7, 1.0, True), ("processed_logprobs", 0.7, 0.9, False),
    ("processed_logprobs", 0.0, 0.5, True), ("processed_logprobs", 1.0, 0.9, False)])
def test_logprobs_mode_gives_pre_top_p_temperature_scaled_logprobs_or_refuses(mode, t, top_p, ok):
    sp = SamplingParams(temperature=t, top_p=top_p)
    if ok:
        check_logprobs_mode(mode, sp)
    else:
        with pytest.raises(ValueError, match="top_p"):
            check_logprobs_mode(mode, sp)
    assert logprobs_mode_for(1.0) == "raw_logprobs" and logprobs_mode_for(0.7) == "processed_logprobs"


def test_one_call_seed_gives_distinct_per_prompt_seeds():
    assert request_seeds(None, 3) == [None] * 3
    s = request_seeds(2**31 - 1, 3)
    assert len(set(s)) == 3 and all(0 <= x < 2**31 for x in s)


# --- the server client against a fake `vllm serve` ----------------------------------------

class FakeVLLM(BaseHTTPRequestHandler):
    """The endpoints the client uses; log-probs are -0.1 * position, tokens are prompt[-1] + k."""
    state: dict = {}

    def log_message(self, *args):
        pass

    def _send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        st = self.state
        st["calls"].append(("GET", self.path))
        if st.get("fail_next", 0) > 0:
            st["fail_next"] -= 1
            return self._send(503, {"error": "warming up"})
        if self.path == "/health":
            return self._send(200, {})
        if self.path == "/v1/models":
            return self._send(200, {"data": [{"id": "tiny"}]})
        if self.path.startswith("/server_info"):
            return self._send(200, {"vllm_config": {"model_config": {"logprobs_mode": st["mode"]}}})
        if self.path == "/get_world_size":
            return self._send(200, {"world_size": 1})
        self._send(404, {"error": "no such endpoint"})

    def do_POST(self):
        st = self.state
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        st["calls"].append(("POST", self.path, req))
        if st.get("sleep"):
            threading.Event().wait(st["sleep"])
        if st.get("fail_next", 0) > 0:
            st["fail_next"] -= 1
            return self._send(503, {"error": "overloaded"})
        if "prompt_logprobs" in req:
            p = req["prompt"]
            pl = [None] + [{str(t): {"logprob": -0.01 * t, "rank": 1}} for t in p[1:]]
            return self._send(200, {"choices": [{"prompt_logprobs": pl, "token_ids": [0]}]})
        if req["max_tokens"] < 0:
            return self._send(400, {"error": "max_tokens must be >= 0"})
        toks = [req["prompt"][-1] + k + 1 for k in range(req["max_tokens"])]
        st.setdefault("seeds", []).append(req.get("seed"))
        return self._send(200, {"choices": [{"token_ids": toks, "logprobs": {
            "token_logprobs": [-0.1 * k for k in range(len(toks))],
            "tokens": [f"token_id:{t}" for t in toks]}}]})


@pytest.fixture
def fake_server():
    FakeVLLM.state = {"calls": [], "mode": "raw_logprobs"}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLM)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", FakeVLLM.state
    finally:
        server.shutdown()
        server.server_close()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Tok:  # token ids are their own text: enough for the client's cutting rules
    eos_token_id = 999

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i == self.eos_token_id))


def test_server_generate_score_and_health(fake_server):
    url, st = fake_server
    eng = VLLMServerEngine(_Tok(), base_urls=url + "/", timeout=5)
    assert eng.healthy() and eng.model == "tiny" and eng.logprobs_mode == "raw_logprobs"
    outs = eng.generate([[1, 2], [10], [10]], SamplingParams(max_new_tokens=3, temperature=1.0, seed=7))
    assert [o.token_ids for o in outs] == [[3, 4, 5], [11, 12, 13], [11, 12, 13]]
    assert outs[0].logprobs == pytest.approx([0.0, -0.1, -0.2]) and outs[0].finish_reason == "length"
    assert sorted(st["seeds"]) == [7, 8, 9]  # identical prompts get their own seeds
    req = [c[2] for c in st["calls"] if c[0] == "POST"][0]
    assert req["logprobs"] == 0 and req["include_stop_str_in_output"] and req["stop_token_ids"] == [999]
    assert req["top_k"] == -1 and req["repetition_penalty"] == 1.0 and req["min_p"] == 0.0
    stop = eng.generate([[1, 2]], SamplingParams(max_new_tokens=3, temperature=1.0, stop=["4"]))
    assert stop[0].token_ids == [3, 4] and stop[0].finish_reason == "stop"
    assert eng.score([[5, 6], [1]], [[7, 8], [2]]) == [pytest.approx([-0.07, -0.08]), pytest.approx([-0.02])]
    with pytest.raises(ValueError, match="temperature"):
        eng.score([[5]], [[6]], temperature=0.5)
    with pytest.raises(ValueError, match="top_p"):  # raw mode cannot give T=0.7 log-probs
        eng.generate([[1]], SamplingParams(temperature=0.7))
    with pytest.raises(ServerError, match=r"HTTP 400.*max_tokens"):  # a bad request is not retried
        eng.generate([[1]], SamplingParams(max_new_tokens=-1))
    assert eng.pool.servers[0].in_rotation  # the request's fault, not the server's


def test_server_down_is_one_clear_error_naming_the_url():
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(ServerUnavailable) as e:
        VLLMServerEngine(_Tok(), base_urls=url, retries=1, backoff=0.01)
    assert url in str(e.value) and "\n" not in str(e.value)


def test_server_timeout_names_the_url(fake_server):
    url, st = fake_server
    eng = VLLMServerEngine(_Tok(), base_urls=url, timeout=0.3)
    st["sleep"] = 1.0
    with pytest.raises(ServerUnavailable, match=rf"{url} did not answer POST /v1/completions within 0.3 s"):
        eng.generate([[1]], SamplingParams(max_new_tokens=1))


def test_server_busy_or_restarting_is_retried_and_reconnects(fake_server):
    url, st = fake_server
    eng = VLLMServerEngine(_Tok(), base_urls=url, backoff=0.01, retries=3)
    st["fail_next"] = 2  # two 503s, then the answer: a new connection each attempt
    assert eng.generate([[1]], SamplingParams(max_new_tokens=2))[0].token_ids == [2, 3]
    st["fail_next"] = 10
    with pytest.raises(ServerUnavailable, match=f"no vLLM server is usable.*{url}.*HTTP 503"):
        eng.generate([[1]], SamplingParams(max_new_tokens=2))
    st["fail_next"] = 0  # it may have restarted with other weights: out until a push re-syncs it
    with pytest.raises(ServerUnavailable, match="no vLLM server is usable"):
        eng.generate([[1]], SamplingParams(max_new_tokens=1))


def test_server_waits_for_health(fake_server):
    url, st = fake_server
    st["fail_next"] = 2  # /health answers 503 twice while the server loads
    VLLMServerEngine(_Tok(), base_urls=url, wait_for_server=10, backoff=0.01)
    assert [c[1] for c in st["calls"][:3]] == ["/health"] * 3


def test_server_weight_push_needs_cuda(fake_server):
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU error")
    url, _ = fake_server
    eng = VLLMServerEngine(tiny_tokenizer(), base_urls=url)
    with pytest.raises(RuntimeError, match=rf"{url} goes over NCCL and needs a CUDA device"):
        eng.update_weights(tiny_model())


# --- the factory ------------------------------------------------------------------------

def _cfg(**kw):
    """EngineConfig's fields, unchecked (the factory's own checks are under test)."""
    return SimpleNamespace(**{**vars(EngineConfig()), **kw})


RUN = {"answer_budget": 256, "temperature": 1.0, "top_p": 1.0, "seed": 0}  # what a recipe passes


def test_factory_picks_engines_by_config(fake_server):
    tok, model = tiny_tokenizer(), tiny_model()
    assert isinstance(make_engine(_cfg(), model, tok, **RUN), HFEngine)
    with pytest.raises(ValueError, match="hf, vllm, vllm-server.*'sglang'"):
        make_engine(_cfg(engine="sglang"), model, tok, **RUN)
    with pytest.raises(ValueError, match="top_p"):  # refused before any GPU work
        make_engine(_cfg(engine="vllm"), model, tok, **{**RUN, "temperature": 0.7, "top_p": 0.9})
    down = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(ServerUnavailable, match=down):
        make_engine(_cfg(engine="vllm-server", vllm_server_urls=[down]), model, tok, **RUN)
    url, _ = fake_server
    if not torch.cuda.is_available():  # the server engine pushes the learner's weights first
        with pytest.raises(RuntimeError, match="CUDA"):
            make_engine(_cfg(engine="vllm-server", vllm_server_urls=[url]), model, tok, **RUN)


def test_factory_names_the_extra_when_vllm_is_missing():
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    with pytest.raises(ImportError, match=r"pip install lmselfplay\[vllm\]"):
        make_engine(_cfg(engine="vllm"), tiny_model(), tiny_tokenizer(), **RUN)


# --- the real engine (vLLM installed; CPU build works) ------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_real_vllm_engine_matches_hf_and_follows_the_trainer(tied):
    pytest.importorskip("vllm")
    from lmselfplay.lm.engines.vllm import VLLMEngine

    tok = tiny_tokenizer()
    # head_dim 64: vLLM's CPU attention kernels do not take the fixture's default head_dim 8
    model = tiny_model(seed=0, width=256)
    if tied:  # the LM head shares the embedding (vLLM loads only embed_tokens)
        model.config.tie_word_embeddings = True
        model = type(model)(model.config)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    cfg = TrainerConfig(learning_rate=3e-2, beta=0.0, num_iterations=1, max_grad_norm=0.0, merge_identical=False)
    trainer = PolicyTrainer(model, tok, cfg)
    engine = VLLMEngine(trainer.unwrapped, tok, max_model_len=256, enforce_eager=True)
    hf = HFEngine(trainer.unwrapped, tok)
    prompts = [tok(f"Nim: {k} stones left. Your move")["input_ids"] for k in range(8)]
    sp = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5, stop=["1"])
    outs = engine.generate(prompts, sp)
    assert [o.token_ids for o in engine.generate(prompts, sp)] == [o.token_ids for o in outs]  # seeded
    ref = hf.score([o.prompt_ids for o in outs], [o.token_ids for o in outs])
    for o, r in zip(outs, ref):  # the protocol's invariant, float32: 1e-4
        assert o.logprobs == pytest.approx(r, abs=1e-4)
        c = to_completion(tok, o.prompt_ids, o.token_ids, o.logprobs, tok.eos_token_id, sp.stop)
        assert c.token_ids == o.token_ids
    assert engine.score([o.prompt_ids for o in outs], [o.token_ids for o in outs]) == \
        [pytest.approx(r, abs=1e-4) for r in ref]
    detector = WeightSyncCheck(threshold=0.01, strict=True)
    for step in range(3):  # push after every step: the detector stays low
        samples = [Sample(o.prompt_ids, o.token_ids, o.logprobs, advantage=(-1.0) ** i)
                   for i, o in enumerate(engine.generate(prompts, SamplingParams(8, 1.0, seed=step)))]
        m = trainer.step(samples, engine=engine)
        detector.check(m["logprob_diff"], step)
        engine.update_weights(trainer.unwrapped, version=trainer.step_count)
        assert engine.version == step + 1 and engine.last_sync.tensors == len(list(trainer.unwrapped.parameters()))
    stale_free = engine.score(prompts[:2], [[5, 6], [7, 8]])
    assert stale_free == [pytest.approx(r, abs=1e-4) for r in hf.score(prompts[:2], [[5, 6], [7, 8]])]
    samples = [Sample(o.prompt_ids, o.token_ids, o.logprobs, advantage=(-1.0) ** i)
               for i, o in enumerate(engine.generate(prompts, SamplingParams(8, 1.0, seed=9)))]
    trainer.step(samples, engine=engine)  # no push after this step: the next rollout is stale and the detector says so
    samples = [Sample(o.prompt_ids, o.token_ids, o.logprobs, advantage=1.0)
               for o in engine.generate(prompts, SamplingParams(8, 1.0, seed=10))]
    with pytest.raises(StaleWeightsError):
        detector.check(trainer.step(samples, engine=engine)["logprob_diff"])
    engine.close()


@pytest.mark.slow
def test_real_vllm_server_generates_and_scores_like_hf(tmp_path):
    """``vllm serve`` (its CPU build here) started as a subprocess: the client's requests and
    parsing match the real API, log-probs equal teacher forcing, seeds are per prompt."""
    pytest.importorskip("vllm")
    import os
    import signal

    tok, model = tiny_tokenizer(), tiny_model(seed=0, width=256)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path / "model"),
           "--host", "127.0.0.1", "--port", str(port), "--logprobs-mode", "raw_logprobs", "--max-model-len", "256",
           "--enforce-eager", "--dtype", "float32", "--gpu-memory-utilization", "0.15"]
    if not torch.cuda.is_available():  # see VLLMEngine: seeded requests need whole-prompt prefill on CPU
        cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"]
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"})
    try:
        eng = VLLMServerEngine(tok, base_urls=f"http://127.0.0.1:{port}", timeout=120, wait_for_server=300)
        assert eng.logprobs_mode == "raw_logprobs"
        hf = HFEngine(model, tok)
        prompts = [tok(f"Nim: {k} stones left")["input_ids"] for k in range(6)] * 2
        sp = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
        outs = eng.generate(prompts, sp)
        assert [o.token_ids for o in eng.generate(prompts, sp)] == [o.token_ids for o in outs]
        assert any(a.token_ids != b.token_ids for a, b in zip(outs[:6], outs[6:]))  # per-prompt seeds
        ref = hf.score([o.prompt_ids for o in outs], [o.token_ids for o in outs])
        for o, r in zip(outs, ref):
            assert o.logprobs == pytest.approx(r, abs=1e-4)
        scored = eng.score([o.prompt_ids for o in outs], [o.token_ids for o in outs])
        assert all(s == pytest.approx(r, abs=1e-4) for s, r in zip(scored, ref))
    finally:
        with contextlib.suppress(ProcessLookupError):  # the server and the engine process it started
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


# --- start-up, sleep mode and versions (no vLLM needed) ------------------------------------

def test_colocated_max_model_len_is_the_runs_prompt_and_answer_budget():
    from lmselfplay.lm.engines.factory import colocated_max_model_len

    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=131072))  # a 128k-context checkpoint
    cfg = _cfg(max_new_tokens=12, foo_max_new_tokens=9000)  # a field's name adds nothing to the budget
    assert colocated_max_model_len(cfg, model, answer_budget=300) == 2048 + 300
    assert colocated_max_model_len(_cfg(vllm_max_model_len=4096), model, answer_budget=300) == 4096
    short = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=1024))
    assert colocated_max_model_len(cfg, short, answer_budget=300) == 1024  # never past the model's context
    from lmselfplay.utils.config import ConfigError

    with pytest.raises(ConfigError, match="vllm_max_model_len"):
        colocated_max_model_len(_cfg(vllm_max_model_len=-1), model, answer_budget=300)


def test_colocated_sampling_fields_turn_every_other_processor_off():
    from lmselfplay.lm.engines.vllm import NEUTRAL_SAMPLING, sampling_fields

    f = sampling_fields(SamplingParams(max_new_tokens=5, temperature=0.7, top_p=1.0), [7, 8], ["</move>"])
    assert {k: f[k] for k in NEUTRAL_SAMPLING} == NEUTRAL_SAMPLING
    assert (f["temperature"], f["max_tokens"], f["stop"], f["stop_token_ids"]) == (0.7, 5, ["</move>"], [7, 8])
    with pytest.raises(ValueError, match="repetition_penalty"):
        check_logprobs_mode("raw_logprobs", SimpleNamespace(temperature=1.0, top_p=1.0, repetition_penalty=1.05))


class _FakeLLM:
    def __init__(self, log):
        self.log = log

    def sleep(self, level):
        self.log.append("sleep")

    def wake_up(self, tags=None):
        self.log.append(f"wake:{','.join(tags) if tags else 'all'}")

    def generate(self, prompts, params, use_tqdm=False):
        self.log.append("generate")
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[3], logprobs=[{3: SimpleNamespace(logprob=-1.0)}])])
                for _ in prompts]


def test_sleep_mode_sleeps_once_per_step_and_empties_the_cache_before_waking(monkeypatch):
    import lmselfplay.lm.engines.vllm as vllm_mod

    log: list[str] = []
    monkeypatch.setattr(vllm_mod, "empty_cuda_cache", lambda: log.append("empty_cache"))
    monkeypatch.setattr(vllm_mod, "require_vllm", lambda: SimpleNamespace(SamplingParams=lambda **kw: kw))
    eng = object.__new__(vllm_mod.VLLMEngine)  # the engine's own logic around a fake vllm.LLM
    eng.llm, eng.enable_sleep_mode, eng.logprobs_mode, eng.eos_id = _FakeLLM(log), True, "raw_logprobs", None
    eng.end_ids = []
    eng.tokenizer, eng._asleep, eng._weights_awake, eng.version = tiny_tokenizer(), False, False, 0
    sleep_at_step_start = eng.sleep  # PolicyTrainer.step(samples, engine=eng)'s hook
    for _ in range(2):  # a step: several rollouts (game turns), then the trainer steps
        for _ in range(3):
            eng.generate([[1, 2]], SamplingParams(max_new_tokens=1))
        sleep_at_step_start()
    assert log.count("sleep") == 2 and log.count("generate") == 6
    wake = log.index("wake:all")
    assert log[wake - 1] == "empty_cache" and log.count("wake:all") == 1  # the second step's first rollout


def test_the_trainer_puts_the_engine_it_is_given_to_sleep_when_a_step_starts():
    tok = tiny_tokenizer()
    trainer = PolicyTrainer(tiny_model(), tok, TrainerConfig(num_iterations=1, beta=0.0))
    calls = []
    engine = SimpleNamespace(version=0, sleep=lambda: calls.append("sleep"), update_weights=lambda *a, **k: None)
    with trainer.serving(engine):
        pass
    trainer.step([Sample([1, 2, 3], [4, 5], [-1.0, -1.0], advantage=1.0)])
    assert calls == []  # serving alone hands the trainer no engine
    trainer.step([Sample([1, 2, 3], [4, 5], [-1.0, -1.0], advantage=1.0)], engine=engine)
    assert calls == ["sleep"]


@pytest.mark.parametrize("version, ok", [("0.32.0", True), ("0.26.1", True), ("0.33.0", False),
                                         ("0.25.2", False), ("0.32.0+cpu", True), ("1.0.0", False)])
def test_vllm_version_outside_the_tested_matrix_is_refused(version, ok):
    from lmselfplay.lm.engines.vllm import check_vllm_version

    if ok:
        check_vllm_version(version)
    else:
        with pytest.raises(ImportError, match=r">=0\.26,<0\.33"):
            check_vllm_version(version)


@pytest.mark.slow  # ~30 s of CPU (over a minute on 2 shared cores)
def test_gpu_benchmark_dry_run_runs_on_cpu(tmp_path):
    """benchmarks/bench_vllm_gpu.py --dry_run: the GPU script's whole flow on CPU (no vLLM)."""
    import sys as _sys
    from pathlib import Path

    _sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    try:
        import bench_vllm_gpu
    finally:
        _sys.path.pop(0)
    out = tmp_path / "dry.json"
    assert bench_vllm_gpu.main(["--dry_run", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["dry_run"] and res["throughput"]["vllm_tokens_per_s"] > 0 and res["sync"]["max_synced"] < 1e-4
    assert res["selfplay"][0]["tis_weight"] == pytest.approx(1.0, abs=1e-4)  # the engine has the trainer's weights
    assert res["peak_memory_bytes"] > 0 and res["sleeps"] == 0
