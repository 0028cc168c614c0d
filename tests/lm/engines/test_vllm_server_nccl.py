"""The NCCL channel of the server push against the CPU stand-in of vLLM's modules
(``tests/fake_vllm.py``, each piece cited to its vLLM file): the API chosen by the vLLM release,
a rendezvous past its deadline that frees its port, the stream sync before the packed producer."""

from __future__ import annotations

import socket
import threading
import time

import fake_vllm
import pytest
import torch
from lm_fixtures import tiny_model
from sim_server import SimServer

from lmselfplay.lm.engines.server_pool import ServerUnavailable
from lmselfplay.lm.engines.vllm_server import NCCLChannel, VLLMServerEngine

BUCKET = [("model.w", torch.ones(2, 3)), ("model.b", torch.zeros(3))]


def _server_side(version: str, ch: NCCLChannel, world_size: int = 1) -> dict:
    """What the server of ``version`` parses from the channel's init and update infos."""
    init_info, _ = ch.open_fns({"weight_transfer_config": {"backend": "nccl"}, "world_size": world_size})
    init = fake_vllm.parse(fake_vllm.init_info_fields(version), init_info, "init_info")
    update_info = {"names": [n for n, _ in BUCKET], "dtype_names": ["float32"] * 2, "shapes": [[2, 3], [3]],
                   **ch.update_info()}
    update = fake_vllm.parse(fake_vllm.update_info_fields(version), update_info, "update_info")
    return {"init": init, "update": update}


@pytest.mark.parametrize("version, api", [
    ("0.26.1", "NCCLWeightTransferEngine.trainer_send_weights"),
    ("0.27.1+cpu", "NCCLWeightTransferEngine.trainer_send_weights"),
    ("0.28.0", "packed_nccl_broadcast_producer"),
    ("0.32.0", "packed_nccl_broadcast_producer")])
def test_init_and_update_info_follow_the_servers_vllm_release(monkeypatch, version, api):
    """0.26/0.27 take `packed` in the update info only (an init info with it is refused: the
    first push would never land); 0.28+ in the init info only. The send API follows."""
    fake_vllm.install(monkeypatch, version)
    ch = NCCLChannel("http://gen0:8000", 51216)
    seen = _server_side(version, ch, world_size=2)
    assert seen["init"]["world_size"] == 3 and seen["init"]["rank_offset"] == 1
    assert (seen["init"]["packed"] or seen["update"]["packed"]) is True  # the server unpacks what it is sent
    ch.comm = object()
    ch.send(BUCKET)
    assert fake_vllm.sent == [(api, ["model.w", "model.b"])]


def _free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


class _Tok:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


@pytest.fixture
def nccl_world(monkeypatch):
    """A simulated server whose /init_weight_transfer_engine joins the trainer's store, as
    vLLM's worker does (``nccl_common.worker_init_process_group``); NCCL init completes only
    while ``fake_vllm.nccl_joins`` is set."""
    fake_vllm.install(monkeypatch, "0.32.0")
    sim = SimServer()
    peers = []

    def join_store(info):  # a TCPStore client retries until the master listens
        deadline = time.monotonic() + 5
        while True:
            try:
                peers.append(socket.create_connection((info["master_address"], info["master_port"])))
                return
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    sim.on_init = join_store
    port = _unused_port()
    yield sim, port
    fake_vllm.nccl_joins.set()  # the abandoned rendezvous thread ends
    for p in peers:
        p.close()
    sim.close()


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nccl_engine(sim: SimServer, port: int, push_timeout: float) -> VLLMServerEngine:
    def channel(url, i):
        ch = NCCLChannel(url, port)
        ch.store_timeout = push_timeout  # what the engine's own channels get
        ch.needs_cuda = False  # the fake modules stand in for CUDA and NCCL
        return ch

    return VLLMServerEngine(_Tok(), [sim.url], timeout=2.0, retries=0, backoff=0.01, push_timeout=push_timeout,
                            channel_factory=channel)


def test_a_rendezvous_stuck_in_nccl_init_frees_its_port_and_the_next_push_redoes_it(nccl_world):
    """The server's worker joined the store, then never NCCL: past the deadline the server is
    out and the port is free at once; the next push rendezvouses on the same port again."""
    sim, port = nccl_world
    eng = _nccl_engine(sim, port, push_timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(ServerUnavailable, match="NCCL rendezvous did not finish within 1 s"):
        eng.update_weights(tiny_model(seed=1), version=1)
    assert time.monotonic() - t0 < 5
    assert _free(port), "the abandoned rendezvous still holds its port"
    assert not sim.paused  # resumed although it never loaded anything
    stuck = [t for t in threading.enumerate() if t.name.startswith("weight-push")]
    assert stuck and all(t.daemon for t in stuck)  # it cannot hold the process at exit
    fake_vllm.nccl_joins.set()  # the server's workers join NCCL this time
    eng.update_weights(tiny_model(seed=2), version=2)
    assert eng.pool.servers[0].in_rotation and eng.pool.servers[0].version == 2
    assert [c[1] for c in sim.calls if c[0] == "POST"].count("/init_weight_transfer_engine") == 2
    eng.close()
    assert _free(port)


def test_a_rendezvous_no_worker_joins_ends_at_the_deadline_not_at_vllms_300_s(nccl_world):
    """No worker ever reaches the store: the store's own wait is the push deadline."""
    sim, port = nccl_world
    sim.on_init = None
    eng = _nccl_engine(sim, port, push_timeout=1.0)
    with pytest.raises(ServerUnavailable, match="NCCL rendezvous"):
        eng.update_weights(tiny_model(seed=1), version=1)
    deadline = time.monotonic() + 5
    while not _free(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    eng.close()
    assert _free(port)


@pytest.mark.parametrize("version", ["0.27.1", "0.32.0"])
def test_the_current_stream_is_synchronized_before_the_packed_producer(monkeypatch, version):
    """The producer packs on side streams of its own: what the gather / LoRA merge wrote on the
    current stream must be complete first (only on CUDA)."""
    fake_vllm.install(monkeypatch, version)
    order = []

    class Stream:
        def synchronize(self):
            order.append("sync")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    ch = NCCLChannel("http://gen0:8000", 51216)
    ch.open_fns({"weight_transfer_config": {"backend": "nccl"}, "world_size": 1})
    ch.comm = object()
    real = fake_vllm.packed_nccl_broadcast_producer

    def producer(*args, **kwargs):
        order.append("pack")
        return real(*args, **kwargs)

    monkeypatch.setattr(fake_vllm, "packed_nccl_broadcast_producer", producer)
    monkeypatch.setattr(fake_vllm.sys.modules["vllm.distributed.weight_transfer.packed_tensor"],
                        "packed_nccl_broadcast_producer", producer)
    ch.send(BUCKET)
    assert order == ["sync", "pack"]
