"""A CPU stand-in for the vLLM modules the server push imports (``install(monkeypatch, version)``).

Each piece does what the cited file of vllm-project/vllm does, minus CUDA and NCCL:

* ``vllm/distributed/utils.py`` ``StatelessProcessGroup.create(host, port, rank, world_size,
  store_timeout=300)``: rank 0 is the TCPStore master: it listens on ``port`` (SO_REUSEADDR) and
  waits until ``world_size - 1`` ranks connect, at most ``store_timeout`` s, else it raises; the
  port is free again when the store is destroyed (here: when the last reference to it goes).
* ``vllm/distributed/device_communicators/pynccl.py`` ``PyNcclCommunicator(group, device)``: rank 0
  publishes its unique id on the group's store, then ``ncclCommInitRank`` blocks until every rank
  joins; no timeout reaches it. Here it returns once :data:`nccl_joins` is set, never when the
  server's worker died between the store and NCCL (the test leaves it clear).
* ``vllm/distributed/weight_transfer/nccl_common.py`` ``trainer_init``: ``StatelessProcessGroup.create``
  (default store timeout) then ``PyNcclCommunicator`` (vLLM 0.26 on).
* ``vllm/distributed/weight_transfer/nccl_engine.py`` before 0.28: the static
  ``NCCLWeightTransferEngine.trainer_init`` / ``trainer_send_weights`` with ``NCCLTrainerSendWeightsArgs``
  (packing through ``packed_nccl_broadcast_producer`` when ``packed``); gone from 0.28
  (vllm-project/vllm#50902).
* ``vllm/distributed/weight_transfer/packed_tensor.py`` ``packed_nccl_broadcast_producer``: records
  the bucket it broadcasts in :data:`sent`.
* The server's init / update info (:func:`init_info_fields`, :func:`update_info_fields`): the fields
  of ``NCCLWeightTransferInitInfo`` (``nccl_common.py``) and ``NCCLWeightTransferUpdateInfo``
  (``nccl_engine.py``) of that release; :func:`parse` refuses an unknown key as
  ``weight_transfer/base.py``'s ``parse_init_info`` / ``parse_update_info`` do (``cls(**d)``).
"""

from __future__ import annotations

import socket
import sys
import threading
import types

nccl_joins = threading.Event()
sent: list[tuple[str, list[str]]] = []  # (which API, tensor names) per broadcast

RENDEZVOUS = {"master_address", "master_port", "rank_offset", "world_size"}
PACKING = {"packed", "packed_buffer_size_bytes", "packed_num_buffers"}
UPDATE = {"names", "dtype_names", "shapes", "is_checkpoint_format"}


def release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def init_info_fields(version: str) -> set[str]:
    return RENDEZVOUS | (PACKING if release(version) >= (0, 28) else set())


def update_info_fields(version: str) -> set[str]:
    return UPDATE | (set() if release(version) >= (0, 28) else PACKING)


def parse(fields: set[str], info: dict, what: str) -> dict:
    unknown = set(info) - fields
    if unknown:
        raise ValueError(f"Invalid {what} for NCCLWeightTransferEngine: unexpected keyword argument "
                         f"{sorted(unknown)[0]!r}")
    return {"packed": False, **info}


class FakeStore:
    """TCPStore master: the listener, and the connections of the ranks that joined."""

    def __init__(self, host: str, port: int, world_size: int, timeout: float):
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen()
        self.listener.settimeout(timeout)
        self.peers: list[socket.socket] = []
        try:
            while len(self.peers) < world_size - 1:
                self.peers.append(self.listener.accept()[0])
        except TimeoutError:
            self.close()
            raise RuntimeError(f"timed out after {timeout} s waiting for clients: "
                               f"{len(self.peers) + 1}/{world_size} joined") from None
        self.unique_id = None

    def set(self, key, value):
        self.unique_id = value

    def close(self):
        for s in [self.listener, *self.peers]:
            s.close()

    def __del__(self):
        self.close()


class StatelessProcessGroup:
    def __init__(self, rank, world_size, store):
        self.rank, self.world_size, self.store = rank, world_size, store

    @staticmethod
    def create(host, port, rank, world_size, data_expiration_seconds=3600, store_timeout=300):
        assert rank == 0, "the trainer is rank 0"
        return StatelessProcessGroup(rank, world_size, FakeStore(host, port, world_size, store_timeout))


class PyNcclCommunicator:
    def __init__(self, group, device=None):
        group.store.set("broadcast_from/0/0", b"unique-id")
        self.group, self.device = group, device
        nccl_joins.wait()


def trainer_init(init_info):
    group = StatelessProcessGroup.create(host=init_info["master_address"], port=init_info["master_port"],
                                         rank=0, world_size=init_info["world_size"])
    return PyNcclCommunicator(group, device=None)


def packed_nccl_broadcast_producer(iterator, group, src, post_iter_func, buffer_size_bytes=1 << 30,
                                   num_buffers=2):
    items = list(iterator)
    for item in items:
        post_iter_func(item)
    sent.append(("packed_nccl_broadcast_producer", [n for n, _ in items]))


class NCCLTrainerSendWeightsArgs:
    def __init__(self, group, src=0, post_iter_func=None, packed=False, stream=None):
        self.group, self.src, self.packed = group, src, packed
        self.post_iter_func = post_iter_func or (lambda item: item[1])


class NCCLWeightTransferEngine:
    trainer_init = staticmethod(trainer_init)

    @staticmethod
    def trainer_send_weights(iterator, trainer_args):
        assert trainer_args.packed, "unpacked broadcasts would not match the server's packed consumer"
        items = list(iterator)
        packed_nccl_broadcast_producer(iter(items), trainer_args.group, trainer_args.src, trainer_args.post_iter_func)
        sent[-1] = ("NCCLWeightTransferEngine.trainer_send_weights", sent[-1][1])


def _module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


def install(monkeypatch, version: str) -> None:
    """Put the fake modules of vLLM ``version`` in ``sys.modules`` (undone by ``monkeypatch``)."""
    nccl_joins.clear()
    sent.clear()
    engine_attrs = {} if release(version) >= (0, 28) else {
        "NCCLWeightTransferEngine": NCCLWeightTransferEngine, "NCCLTrainerSendWeightsArgs": NCCLTrainerSendWeightsArgs}
    mods = {
        "vllm": _module("vllm", __version__=version),
        "vllm.utils": _module("vllm.utils"),
        "vllm.utils.network_utils": _module("vllm.utils.network_utils", get_ip=lambda: "127.0.0.1"),
        "vllm.distributed": _module("vllm.distributed"),
        "vllm.distributed.utils": _module("vllm.distributed.utils", StatelessProcessGroup=StatelessProcessGroup),
        "vllm.distributed.device_communicators": _module("vllm.distributed.device_communicators"),
        "vllm.distributed.device_communicators.pynccl": _module(
            "vllm.distributed.device_communicators.pynccl", PyNcclCommunicator=PyNcclCommunicator),
        "vllm.distributed.weight_transfer": _module("vllm.distributed.weight_transfer"),
        "vllm.distributed.weight_transfer.nccl_common": _module(
            "vllm.distributed.weight_transfer.nccl_common", trainer_init=trainer_init),
        "vllm.distributed.weight_transfer.nccl_engine": _module(
            "vllm.distributed.weight_transfer.nccl_engine", **engine_attrs),
        "vllm.distributed.weight_transfer.packed_tensor": _module(
            "vllm.distributed.weight_transfer.packed_tensor",
            packed_nccl_broadcast_producer=packed_nccl_broadcast_producer),
    }
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
