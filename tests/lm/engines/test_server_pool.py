"""The server engine on several simulated `vllm serve` processes (127.0.0.1, no model): the push
protocol's order, explicit sampling fields, spreading, failover, re-admission, deadlines."""

from __future__ import annotations

import threading
import time

import pytest
from lm_fixtures import tiny_model
from sim_server import SimChannel, SimServer

from lmselfplay.lm.engines.base import SamplingParams
from lmselfplay.lm.engines.server_pool import ServerError, ServerPool, ServerUnavailable
from lmselfplay.lm.engines.vllm import NEUTRAL_SAMPLING
from lmselfplay.lm.engines.vllm_server import VLLMServerEngine


class _Tok:  # token ids are their own text
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


@pytest.fixture
def servers():
    made = []

    def make(n=2, **kw):
        made.extend(SimServer(**kw) for _ in range(n))
        return made[-n:]

    yield make
    for s in made:
        s.close()


def _engine(sims, **kw):
    by_url = {s.url: s for s in sims}
    kw = {"timeout": 2.0, "backoff": 0.01, "retries": 1, "push_timeout": 2.0, **kw}
    return VLLMServerEngine(_Tok(), [s.url for s in sims], channel_factory=lambda url, i: SimChannel(by_url[url]), **kw)


SP = SamplingParams(max_new_tokens=4, temperature=1.0, seed=11)
PROMPTS = [[1, 2, k] for k in range(16)]


def _posts(sim):
    return [c[1] for c in sim.calls if c[0] == "POST" and c[1] != "/v1/completions"]


def test_a_push_pauses_loads_resets_and_resumes_in_order_with_no_request_in_between(servers):
    (sim,) = servers(1, token_delay=0.002)
    eng = _engine([sim])
    stop, errors = threading.Event(), []

    def keep_generating():  # another thread of the run samples while the trainer pushes
        while not stop.is_set():
            try:
                eng.generate(PROMPTS[:4], SP)
            except Exception as e:  # noqa: BLE001 - the test reports it
                errors.append(e)
                return

    t = threading.Thread(target=keep_generating)
    t.start()
    try:
        for v in range(1, 4):
            eng.update_weights(tiny_model(seed=v), version=v)
    finally:
        stop.set()
        t.join(10)
    assert not errors  # no completion reached the server mid-push (the simulated server refuses them)
    order = _posts(sim)
    assert order[:4] == ["/pause", "/init_weight_transfer_engine", "/start_weight_update", "/update_weights"]
    # each push: pause, start, buckets, finish, reset, resume; the rendezvous on the first only
    pushes = " ".join(order).split("/resume")
    assert len(pushes) == 4 and pushes[-1] == ""
    for k, p in enumerate(pushes[:3]):
        steps = p.split()
        assert steps[0] == "/pause" and steps[-2:] == ["/finish_weight_update", "/reset_prefix_cache"]
        assert set(steps[1:-2]) - {"/init_weight_transfer_engine"} == {"/start_weight_update", "/update_weights"}
        assert ("/init_weight_transfer_engine" in steps) == (k == 0)
    assert eng.version == 3 and all(c.version == 3 for c in eng.generate(PROMPTS[:2], SP))


def test_reset_prefix_cache_failure_is_retried_then_takes_the_server_out(servers):
    a, b = servers(2)
    eng = _engine([a, b])
    a.faults["reset_fails"] = 1  # blocks still held once: the retry succeeds
    eng.update_weights(tiny_model(seed=1), version=1)
    assert [s.in_rotation for s in eng.pool.servers] == [True, True]
    a.faults["reset_fails"] = 99  # never succeeds: out, the run goes on with b
    eng.update_weights(tiny_model(seed=2), version=2)
    assert [s.in_rotation for s in eng.pool.servers] == [False, True]
    assert "reset_prefix_cache did not succeed" in eng.pool.servers[0].last_error
    before = len(a.calls)
    assert {c.version for c in eng.generate(PROMPTS, SP)} == {2}
    assert not any(c[1] == "/v1/completions" for c in a.calls[before:])
    a.faults["reset_fails"] = 0
    eng.update_weights(tiny_model(seed=3), version=3)  # re-synced: back in rotation
    assert [s.in_rotation for s in eng.pool.servers] == [True, True]


def test_every_sampling_field_is_sent_explicitly(servers):
    (sim,) = servers(1)
    eng = _engine([sim])
    eng.generate([[1, 2]], SamplingParams(max_new_tokens=3, temperature=1.0, top_p=0.9, seed=5, stop=["x"]))
    req = next(c[2] for c in sim.calls if c[0] == "POST" and c[1] == "/v1/completions")
    for name, off in NEUTRAL_SAMPLING.items():  # the checkpoint's generation_config cannot fill them in
        assert req[name] == off
    assert (req["temperature"], req["top_p"], req["max_tokens"], req["seed"], req["stop"], req["n"]) == \
        (1.0, 0.9, 3, 5, ["x"], 1)
    assert req["logprobs"] == 0 and req["min_tokens"] == 0 and req["ignore_eos"] is False
    greedy = SamplingParams(max_new_tokens=2, temperature=0.0, top_p=0.5)
    eng.generate([[1]], greedy)
    req = [c[2] for c in sim.calls if c[0] == "POST" and c[1] == "/v1/completions"][-1]
    assert (req["temperature"], req["top_p"], req["top_k"]) == (0.0, 1.0, -1)


def test_requests_spread_and_results_do_not_depend_on_the_server(servers):
    a, b = servers(2, token_delay=0.005)
    eng = _engine([a, b])
    eng.update_weights(tiny_model(seed=1), version=1)
    outs = eng.generate(PROMPTS, SP)
    served = [sum(1 for c in s.calls if c[0] == "POST" and c[1] == "/v1/completions") for s in (a, b)]
    assert min(served) >= 4 and sum(served) == len(PROMPTS)  # both busy
    alone = _engine([b])  # b alone, same weights: the same completions
    alone.update_weights(tiny_model(seed=1), version=1)
    assert [o.token_ids for o in alone.generate(PROMPTS, SP)] == [o.token_ids for o in outs]
    assert all(o.version == 1 for o in outs)


def test_least_outstanding_requests_favours_the_idle_server():
    pool = ServerPool(["http://a", "http://b", "http://c"])
    first = [pool._acquire(set()).url for _ in range(3)]
    assert sorted(first) == ["http://a", "http://b", "http://c"]
    pool._release(pool.servers[1])  # b finished its request: the next one goes there
    assert pool._acquire(set()).url == "http://b"
    with pytest.raises(Exception, match="empty"):
        ServerPool([])
    with pytest.raises(Exception, match="twice"):
        ServerPool(["http://a", "http://a/"])


@pytest.mark.parametrize("fault", [{"down": True}, {"garbage": True}, {"stall": 4.0}, {"dying": True}])
def test_a_failing_server_moves_its_requests_and_comes_back_after_a_push(servers, fault):
    a, b = servers(2)
    eng = _engine([a, b], timeout=1.5)
    eng.update_weights(tiny_model(seed=1), version=1)
    ref = [o.token_ids for o in eng.generate(PROMPTS, SP)]
    a.faults.update(fault)
    t0 = time.monotonic()
    outs = eng.generate(PROMPTS, SP)  # the step completes on b, with the same answers
    assert [o.token_ids for o in outs] == ref and time.monotonic() - t0 < 15
    assert not eng.pool.servers[0].in_rotation and eng.pool.servers[1].in_rotation
    eng.update_weights(tiny_model(seed=2), version=2)  # still broken: stays out
    assert not eng.pool.servers[0].in_rotation
    a.faults.clear()
    eng.update_weights(tiny_model(seed=3), version=3)  # healthy again: re-synced and re-admitted
    assert all(s.in_rotation and s.version == 3 for s in eng.pool.servers)
    eng.generate(PROMPTS, SP)
    assert any(c[1] == "/v1/completions" for c in a.calls[-len(PROMPTS):])


def test_a_failed_push_takes_the_server_out_until_resynced(servers):
    a, b = servers(2)
    eng = _engine([a, b])
    eng.update_weights(tiny_model(seed=1), version=1)
    a.faults["fail_push"] = True
    eng.update_weights(tiny_model(seed=2), version=2)
    assert a.weights != b.weights  # a kept the old weights ...
    before = len(a.calls)
    outs = eng.generate(PROMPTS, SP)
    assert {o.version for o in outs} == {2}  # ... and serves nothing
    assert not any(c[1] == "/v1/completions" for c in a.calls[before:])
    assert "HTTP 500" in eng.pool.servers[0].last_error


def test_a_server_dropped_mid_push_is_finished_and_resumed_and_rejoins_at_the_next_push(servers):
    """vLLM answers 409 to a start while an update is open: a server whose bucket failed still
    gets /finish_weight_update and /resume, so the next push (fault cleared) re-admits it."""
    a, b = servers(2)
    eng = _engine([a, b])
    eng.update_weights(tiny_model(seed=1), version=1)
    a.faults["fail_push"] = True
    eng.update_weights(tiny_model(seed=2), version=2)
    after = _posts(a)[_posts(a).index("/update_weights", len(_posts(a)) - 6):]
    assert after[:1] == ["/update_weights"] and "/finish_weight_update" in after and after[-1] == "/resume"
    assert not a.updating and not a.paused and a.weights != b.weights
    a.faults.clear()
    eng.update_weights(tiny_model(seed=3), version=3)
    assert all(s.in_rotation and s.version == 3 for s in eng.pool.servers)


def test_a_server_left_mid_update_by_an_earlier_trainer_is_finished_then_started(servers):
    (a,) = servers(1)
    a.updating = True  # a trainer died between /start_weight_update and /finish_weight_update
    eng = _engine([a])
    eng.update_weights(tiny_model(seed=1), version=1)
    assert eng.pool.servers[0].version == 1
    posts = _posts(a)
    k = posts.index("/start_weight_update")
    assert posts[k:k + 3] == ["/start_weight_update", "/finish_weight_update", "/start_weight_update"]


class _BlockingChannel(SimChannel):
    """The trainer's side of a rendezvous the server never joins: vLLM's TCPStore master
    waits for the server's workers (``vllm/distributed/utils.py``: StatelessProcessGroup.create)."""

    def __init__(self, server, release):
        super().__init__(server)
        self.release = release

    def open_fns(self, info):
        init_info, _ = super().open_fns(info)
        return init_info, lambda: self.release.wait(30)


def test_a_fast_server_error_in_the_rendezvous_is_reported_at_once_with_its_message(servers):
    a, b = servers(2)
    a.faults["init_fails"] = True  # e.g. vLLM 0.27 refusing an init info with `packed`
    release = threading.Event()
    chans = {a.url: _BlockingChannel(a, release), b.url: SimChannel(b)}
    eng = VLLMServerEngine(_Tok(), [a.url, b.url], timeout=2.0, backoff=0.01, retries=1, push_timeout=20.0,
                           channel_factory=lambda url, i: chans[url])
    t0 = time.monotonic()
    try:
        eng.update_weights(tiny_model(seed=1), version=1)
    finally:
        release.set()
    assert time.monotonic() - t0 < 5  # not the 20 s deadline
    err = eng.pool.servers[0].last_error
    assert "NCCL rendezvous failed" in err and "HTTP 500: Internal Server Error" in err and "within" not in err
    assert not a.paused and [s.in_rotation for s in eng.pool.servers] == [False, True]


def test_a_server_restarted_after_a_failure_gets_a_new_rendezvous(servers):
    """A restarted vLLM has no weight-transfer engine: the channel of a server that left the
    rotation is not trusted, the next push that reaches it joins it again."""
    a, b = servers(2)
    eng = _engine([a, b])
    eng.update_weights(tiny_model(seed=1), version=1)
    a.faults["down"] = True
    eng.update_weights(tiny_model(seed=2), version=2)
    assert not eng.pool.servers[0].in_rotation
    a.faults.clear()
    a.restart()
    eng.update_weights(tiny_model(seed=3), version=3)
    assert all(s.in_rotation and s.version == 3 for s in eng.pool.servers)
    assert _posts(a).count("/init_weight_transfer_engine") == 2 and a.weights == b.weights


def test_a_push_step_past_its_deadline_is_one_line_and_the_run_goes_on(servers):
    a, b = servers(2)
    eng = _engine([a, b], push_timeout=0.5)
    eng.update_weights(tiny_model(seed=1), version=1)
    a.faults["stall"] = 2.0
    t0 = time.monotonic()
    eng.update_weights(tiny_model(seed=2), version=2)
    assert time.monotonic() - t0 < 2.0  # a's first step timed out; b was pushed
    assert "within 0.5 s" in eng.pool.servers[0].last_error and not eng.pool.servers[0].in_rotation
    assert eng.pool.servers[1].version == 2


def test_every_server_down_is_one_line_naming_the_urls(servers):
    a, b = servers(2)
    eng = _engine([a, b])
    a.faults["down"] = b.faults["down"] = True
    with pytest.raises(ServerUnavailable) as e:
        eng.generate(PROMPTS[:2], SP)
    assert a.url in str(e.value) and b.url in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ServerUnavailable) as e:
        eng.update_weights(tiny_model(seed=1), version=1)
    assert "weight push reached no vLLM server" in str(e.value) and a.url in str(e.value) and b.url in str(e.value)
    assert "\n" not in str(e.value)


def test_a_server_down_at_start_is_left_out_and_joins_at_the_first_push(servers):
    a, b = servers(2)
    a.faults["down"] = True
    eng = _engine([a, b])
    assert [s.in_rotation for s in eng.pool.servers] == [False, True]
    a.faults.clear()
    eng.update_weights(tiny_model(seed=1), version=1)
    assert [s.in_rotation for s in eng.pool.servers] == [True, True]


@pytest.mark.multiprocess
@pytest.mark.slow  # ~2 min on 2 shared cores; the protocol's rules run in the quick tests above
def test_multinode_rehearsal_two_gloo_ranks_two_servers(tmp_path):
    """`accelerate launch` (2 gloo ranks) against 2 simulated servers in their own processes:
    every completion is sampled with the weights of its step, no completion reaches a server
    mid-push, a server failing its push leaves the rotation on both ranks."""
    import contextlib
    import json
    import subprocess
    import sys
    import urllib.request

    from mp_helpers import CONFIGS, ROOT, _env
    from sim_server import ServerProcess

    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(ServerProcess("sim_server", "--vocab", "400")).url for _ in range(2)]
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "ddp_cpu.yaml"),
               str(ROOT / "tests" / "mp_scripts" / "scale_rehearsal.py"), "--out", str(tmp_path),
               "--urls", ",".join(urls)]
        r = subprocess.run(cmd, cwd=ROOT, env={**_env(), "ACCELERATE_USE_CPU": "1"}, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-4000:]
        states = [json.loads(urllib.request.urlopen(u + "/sim/state", timeout=10).read()) for u in urls]
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    for rk in ranks:
        assert rk["world"] == 2 and rk["engine_version"] == 2
        assert [s["versions"] for s in rk["steps"]] == [[0], [1], [2]]  # sampled with the step's weights
        assert [s["in_rotation"] for s in rk["steps"]] == [[True, True], [True, True], [False, True]]
    assert [s["refused_mid_update"] for s in states] == [0, 0]  # nobody generated during a push
    assert states[0]["completions"] > 0 and states[1]["completions"] > 0  # both served
    assert states[0]["weights"] != states[1]["weights"]  # the first kept its step-1 weights, unused


def test_token_ids_outside_the_tokenizer_are_one_line_not_an_index_error(servers):
    class SmallTok(_Tok):
        def __len__(self):
            return 10

    (a,) = servers(1)  # answers ids up to 996: another model's
    eng = VLLMServerEngine(SmallTok(), [a.url], timeout=2.0, retries=0, channel_factory=lambda url, i: SimChannel(a))
    with pytest.raises(ServerError, match="outside the tokenizer's 10"):
        eng.generate(PROMPTS[:2], SP)


def test_client_threads_keep_their_connections_across_calls(servers):
    """A burst of requests reuses the engine's worker threads and their kept-alive connections
    (a TCP handshake and a thread per request cost the CPU the trainer steps on)."""
    (a,) = servers(1)
    # a socket timeout reconnects by design; 30 s keeps a loaded machine's slow answer from doing so here
    eng = _engine([a], max_concurrency=4, timeout=30.0)
    eng.generate(PROMPTS, SP)
    opened = a.connections
    for _ in range(3):
        eng.generate(PROMPTS, SP)
    assert a.connections == opened <= 4 + 2  # the workers' and the start-up's, none per request
    a.close()  # a restarted server on the same port: the kept connections are dead, retried fresh
    b = SimServer(port=int(a.url.rsplit(":", 1)[1]))
    try:
        assert len(eng.generate(PROMPTS, SP)) == len(PROMPTS)
    finally:
        b.close()


def test_closing_the_engine_closes_its_kept_connections(servers):
    """Kept connections are closed when the engine closes, not left to the garbage collector
    (an unclosed socket per client thread, and a ResourceWarning for each)."""
    from lmselfplay.lm.engines import server_pool

    with server_pool._by_thread_lock:  # threads of earlier tests may still be ending: not this engine's
        earlier = set(server_pool._by_thread)
    (a,) = servers(1)
    eng = _engine([a], max_concurrency=3)
    eng.generate(PROMPTS, SP)
    with server_pool._by_thread_lock:
        kept = [c for t, conns in server_pool._by_thread.items() if t not in earlier for c in conns.values()]
    assert kept and any(c.sock is not None for c in kept)
    eng.close()
    assert all(c.sock is None for c in kept)
    with server_pool._by_thread_lock:
        assert all(t.is_alive() for t in server_pool._by_thread)  # the ended workers' entries are gone


def test_request_threads_run_a_call_concurrently_in_order_and_raise_the_first_error():
    from lmselfplay.lm.engines.server_pool import RequestThreads

    threads = RequestThreads(8)
    together = threading.Barrier(8, timeout=10)  # passes only if all 8 items run at once

    def item(i):
        together.wait()
        return i * i

    assert threads.map(item, list(range(8))) == [i * i for i in range(8)]
    other = []  # a second caller at the same time gets threads of its own (no call waits on another's)
    t = threading.Thread(target=lambda: other.append(threads.map(lambda i: (together.wait(), i)[1], list(range(4)))))
    t.start()
    assert threads.map(lambda i: (together.wait(), -i)[1], list(range(4))) == [0, -1, -2, -3]
    t.join(10)
    assert other == [[0, 1, 2, 3]]

    def bad(i):
        if i in (3, 5):
            raise ValueError(f"item {i}")
        return i

    with pytest.raises(ValueError, match="item 3"):
        threads.map(bad, list(range(8)))
    assert threads.map(str, [1, 2]) == ["1", "2"]  # still usable after an error
    started = list(threads.threads)
    threads.close()
    for t in started:
        t.join(timeout=5)
    assert started and not any(t.is_alive() for t in started) and not threads.threads
