"""Rollouts served by one or more ``vllm serve`` processes: generation over HTTP, weights over NCCL.

Start each server the way the weight push expects (dev endpoints and weight transfer on, the
log-prob mode of :mod:`lmselfplay.lm.engines.vllm` for the run's temperature)::

    VLLM_SERVER_DEV_MODE=1 vllm serve PATH --weight-transfer-config '{"backend": "nccl"}' \\
        --logprobs-mode raw_logprobs        # temperature 1; processed_logprobs for T != 1 (top_p 1)

Generation (stdlib HTTP, tested on CPU against fake servers): one ``POST /v1/completions`` per
prompt with token ids, every sampling field explicit (:func:`~lmselfplay.lm.engines.vllm.sampling_fields`)
and its own seed ``seed + i``, so a result does not depend on which server answered. Requests
are spread over the servers by :class:`~lmselfplay.lm.engines.server_pool.ServerPool` (fewest
outstanding requests; a failing server's requests move to the others; every server down: one line
naming the URLs). Each :class:`Completion` records the weight version it was sampled with.

Context (:meth:`VLLMServerEngine._context_limit`): the engine's ``max_model_len`` is the smallest of
``vllm_max_model_len`` (when set) and each server's, read at connect from ``GET /v1/models``, so
:func:`~lmselfplay.lm.engines.base.generate_fitting` answers a prompt too long for it empty, as it
does for the colocated engine. Each request asks for at most the room its prompt leaves (vLLM's
server refuses more, the colocated engine stops there). A prompt a server still refuses as too long
(HTTP 400: a server that does not list its context, one that joined after the start) is answered
empty the same way: a forfeited sample, never a failed run.

Weights (:meth:`VLLMServerEngine.update_weights`), every rank calls it at the same point:

1. all ranks synchronize (rank 0's status is broadcast: a failure there is the same one-line
   error on every rank, never a rank left waiting in a collective);
2. rank 0, with its own requests drained (new ones wait), per server: ``/health``, ``POST /pause``
   (the server finishes in-flight requests and holds new ones from any client), the NCCL group on
   the first push (a rendezvous with the server's workers, before any rank gathers a bucket) and
   ``/start_weight_update``; all ranks synchronize again;
3. every rank walks the buckets (ZeRO-3 gathers are collectives); rank 0 sends each bucket to
   every server (``POST /update_weights`` with the bucket's names beside the NCCL broadcast);
4. rank 0 per server: ``/finish_weight_update``, ``/reset_prefix_cache`` (its ``success`` must be
   true: cached KV of the old weights would otherwise be reused), ``/resume``; the servers that
   took every step are in rotation at the new version, the others are out until a later push
   succeeds; rank 0 broadcasts that list, and all ranks leave together.

Every step has a deadline (``push_timeout``): a step past it, or failing, takes that server out of
rotation (its error is kept); with no server left the push is :class:`ServerUnavailable` naming
every URL and reason. The fault rules (docs/scale.md, "The weight push"):

* a step's first failing side ends it at once with its own message (the server's answer), so a
  fast error is not reported as the deadline;
* a server dropped after ``/pause`` gets ``/resume``, after ``/start_weight_update`` first
  ``/finish_weight_update``; a start answered 409 (an update left open) finishes it and retries;
* the NCCL rendezvous is bounded by the deadline and, past it, releases its port
  (:class:`NCCLChannel`);
* a server out of rotation, whatever took it out, may have restarted without a weight-transfer
  engine: its channel is closed and the next push that reaches it redoes the rendezvous.

NCCL needs CUDA and vLLM on the trainer side; generation alone needs neither.
"""

from __future__ import annotations

import math
import re
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from lmselfplay.lm.engines.base import (
    PROMPT_TOO_LONG,
    Completion,
    OverLongPrompt,
    SamplingParams,
    end_token_ids,
    native_stops,
    to_completion,
)
from lmselfplay.lm.engines.server_pool import (
    RequestThreads,
    Server,
    ServerError,
    ServerPool,
    ServerUnavailable,
    close_idle_connections,
    request_json,
)
from lmselfplay.lm.engines.vllm import check_logprobs_mode, request_seeds, sampling_fields
from lmselfplay.lm.engines.weight_sync import SyncStats, iter_weight_buckets, weight_metadata

__all__ = ["ServerError", "ServerUnavailable", "VLLMServerEngine", "WeightPushError"]


class WeightPushError(ServerUnavailable):
    """One step of a weight push failed or passed its deadline on a server."""


class RequestGate:
    """In-process pause: requests enter and leave; :meth:`paused` waits until none is in
    flight and holds new ones until it exits."""

    def __init__(self):
        self._cond = threading.Condition()
        self._inflight, self._paused = 0, False

    @contextmanager
    def request(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._paused)
            self._inflight += 1
        try:
            yield
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    @contextmanager
    def paused(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._paused)
            self._paused = True
            self._cond.wait_for(lambda: self._inflight == 0)
        try:
            yield
        finally:
            with self._cond:
                self._paused = False
                self._cond.notify_all()


def run_with_deadline(what: str, url: str, timeout: float, *fns: Callable[[], Any]) -> list[Any]:
    """Run ``fns`` concurrently (an HTTP post beside the NCCL side it pairs with). The first to
    fail ends the step at once with its own message (the server's answer, not a deadline: the
    other side, e.g. a rendezvous the server will never join, is abandoned); any still running
    at ``timeout`` is a :class:`WeightPushError` naming the step. Each side runs on a daemon
    thread: one stuck in NCCL (which nothing interrupts) must not hold the process at exit, as
    a ``ThreadPoolExecutor`` worker would (they are joined at interpreter exit)."""
    cond = threading.Condition()
    outcome: list[tuple[bool, Any] | None] = [None] * len(fns)  # (ok, result or exception)

    def run(i: int) -> None:
        try:
            got = (True, fns[i]())
        except BaseException as e:  # reported by the caller
            got = (False, e)
        with cond:
            outcome[i] = got
            cond.notify_all()

    for i in range(len(fns)):
        threading.Thread(target=run, args=(i,), name=f"weight-push-{i}", daemon=True).start()
    with cond:
        cond.wait_for(lambda: all(outcome) or any(o is not None and not o[0] for o in outcome), timeout)
        seen = list(outcome)
    for o in seen:
        if o is not None and not o[0]:
            _push_result(what, url, lambda e=o[1]: _reraise(e))
    if not all(seen):
        raise WeightPushError(f"weight push to {url}: {what} did not finish within {timeout:g} s")
    return [o[1] for o in seen]


def _reraise(e: BaseException) -> Any:
    raise e


def _push_result(what: str, url: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (ServerUnavailable, ServerError) as e:
        raise WeightPushError(f"weight push to {url}: {what} failed: {e}") from None
    except Exception as e:  # NCCL / torch errors: one line, the server leaves the rotation
        raise WeightPushError(f"weight push to {url}: {what} failed: {type(e).__name__}: {e}") from None


PACKED_IN_INIT_INFO = (0, 28)  # vLLM release from which `packed` is an init-info field


def vllm_release(version: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string (``0.27.1+cpu`` -> (0, 27); a 0.28 pre-release
    is 0.28: the API change came before the release)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise ImportError(f"cannot read the vLLM version {version!r}")
    return int(m[1]), int(m[2])


class NCCLChannel:
    """vLLM's NCCL weight transfer to one server: the trainer is rank 0 of a group with the
    server's workers (one group per server, so one failing server does not break the others).

    Which API, by the server-side vLLM's release (the trainer's ``vllm`` must match it), as TRL
    gates it (``trl/generation/vllm_client.py``, huggingface/trl#7001):

    * vLLM >= 0.28 (vllm-project/vllm#50902): ``packed`` is a field of the init info
      (``vllm/distributed/weight_transfer/nccl_common.py``: ``NCCLWeightTransferInitInfo``) and not
      of the update info; the trainer calls ``packed_tensor.packed_nccl_broadcast_producer``.
    * vLLM 0.26 / 0.27: the init info holds only the rendezvous fields (an unknown key fails the
      server's ``WeightTransferEngine.parse_init_info``, ``weight_transfer/base.py``), so ``packed``
      goes in every update info and ``NCCLWeightTransferEngine.trainer_send_weights`` packs
      (``weight_transfer/nccl_engine.py``). ``nccl_common.trainer_init`` exists there too, so an
      import does not tell the two apart.

    The rendezvous is what ``nccl_common.trainer_init`` runs (``stateless_init_process_group``:
    ``StatelessProcessGroup.create`` then ``PyNcclCommunicator``), done here so that it is bounded
    and can be cleaned up: the store (the TCP listener on ``group_port``) waits for the server's
    workers at most ``store_timeout`` s, and :meth:`close` drops the group's store, so a
    rendezvous abandoned at its deadline (e.g. stuck in ``ncclCommInitRank``, which no timeout
    reaches) frees the port for the next push's rendezvous. The stuck thread itself cannot be
    interrupted; it is a daemon thread holding no port.
    """

    needs_cuda = True

    def __init__(self, url: str, group_port: int, store_timeout: float = 300.0):
        self.url, self.group_port, self.store_timeout = url, group_port, store_timeout
        self.comm: Any = None
        self.group: Any = None  # the StatelessProcessGroup while the rendezvous runs and after
        self.stateful = True
        self._attempt: object | None = None  # the rendezvous whose result counts

    def check(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError(f"pushing weights to the vLLM server at {self.url} goes over NCCL and "
                               "needs a CUDA device on the trainer; generation works without one")
        from lmselfplay.lm.engines.vllm import require_vllm

        require_vllm()

    def open_fns(self, info: dict) -> tuple[dict, Callable[[], Any]]:
        """(init_info for ``/init_weight_transfer_engine``, the trainer side of the rendezvous)."""
        import vllm
        from vllm.utils.network_utils import get_ip

        if info.get("weight_transfer_config") is None:
            raise WeightPushError(f"vLLM server at {self.url} has no weight-transfer engine: restart it with "
                                  """--weight-transfer-config '{"backend": "nccl"}'""")
        self.stateful = vllm_release(getattr(vllm, "__version__", "unknown")) >= PACKED_IN_INIT_INFO
        init_info = {"master_address": get_ip(), "master_port": self.group_port, "rank_offset": 1,
                     "world_size": int(info["world_size"]) + 1}
        if self.stateful:
            init_info["packed"] = True
        attempt = self._attempt = object()
        return init_info, lambda: self._rendezvous(init_info, attempt)

    def _rendezvous(self, init_info: dict, attempt: object) -> None:
        """The trainer's side; an attempt abandoned meanwhile (closed) keeps nothing it made."""
        import torch
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        group = StatelessProcessGroup.create(host=init_info["master_address"], port=init_info["master_port"],
                                             rank=0, world_size=init_info["world_size"],
                                             store_timeout=max(1, math.ceil(self.store_timeout)))
        if self._attempt is not attempt:
            return _release(group)
        self.group = group
        device = torch.accelerator.current_device_index() if torch.cuda.is_available() else None
        comm = PyNcclCommunicator(group, device=device)
        if self._attempt is not attempt:
            return _release(group)
        self.comm = comm

    def update_info(self) -> dict:
        return {} if self.stateful else {"packed": True}

    def send(self, bucket: list[tuple[str, Any]]) -> None:
        _settle_streams()
        if self.stateful:
            from vllm.distributed.weight_transfer.packed_tensor import (
                packed_nccl_broadcast_producer,
            )

            packed_nccl_broadcast_producer(iterator=iter(bucket), group=self.comm, src=0,
                                           post_iter_func=lambda item: item[1])
        else:
            from vllm.distributed.weight_transfer.nccl_engine import (
                NCCLTrainerSendWeightsArgs,
                NCCLWeightTransferEngine,
            )

            NCCLWeightTransferEngine.trainer_send_weights(
                iterator=iter(bucket), trainer_args=NCCLTrainerSendWeightsArgs(group=self.comm, packed=True))

    def close(self) -> None:
        """Drop the group's store (its listener on ``group_port``; the server would wait on it),
        whether the rendezvous finished or was abandoned."""
        for group in (self.group, getattr(self.comm, "group", None)):
            _release(group)
        self.comm = self.group = self._attempt = None


def _release(group: Any) -> None:
    """Drop a StatelessProcessGroup's store: the TCPStore master closes its listener."""
    if group is not None:
        group.store = None
        if hasattr(group, "socket"):
            group.socket = None


def _settle_streams() -> None:
    """The bucket's tensors (gathered by ZeRO-3, merged from LoRA) are written on the current
    CUDA stream; vLLM's packed producer reads them on side streams of its own
    (``vllm/distributed/weight_transfer/packed_tensor.py``: ``pack_tensors`` under
    ``torch.cuda.stream(streams[i])``) with no wait on the current one, so that stream is
    synchronized first (huggingface/trl#6798 fixed the same ordering for FSDP2). Nothing to wait for without CUDA."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()


# vLLM's 400 messages for a request longer than the context: vllm/renderers/params.py ("the model's
# context length is only"), older servers' serving_engine._validate_input ("maximum context length"),
# vllm/v1/engine/input_processor.py ("longer than the maximum model length")
TOO_LONG = re.compile(r"context length is only|maximum context length|maximum model length")


def refused_as_too_long(e: ServerError) -> bool:
    """Whether a server's error is its refusal of a request longer than its context (the
    request's problem); any other 400 is a request every sample would send alike (raised)."""
    return "HTTP 400" in str(e) and TOO_LONG.search(str(e)) is not None


def _dist() -> tuple[bool, int]:
    import torch.distributed as dist

    on = dist.is_available() and dist.is_initialized()
    return on, (dist.get_rank() if on else 0)


def broadcast_from_main(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a synchronization point that carries rank 0's status)."""
    import torch.distributed as dist

    on, _ = _dist()
    if not on:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class VLLMServerEngine:
    def __init__(self, tokenizer: Any, base_urls: list[str] | str = "http://127.0.0.1:8000",
                 timeout: float = 300.0, retries: int = 3, backoff: float = 1.0, wait_for_server: float = 0.0,
                 max_concurrency: int = 64, group_port: int = 51216, bucket_bytes: int = 256 << 20,
                 version: int = 0, push_timeout: float = 300.0,
                 channel_factory: Callable[[str, int], Any] | None = None, max_model_len: int | None = None):
        self.tokenizer = tokenizer
        self.configured_max_model_len = max_model_len  # a cap on the servers' context (vllm_max_model_len)
        self.over_long_prompts = 0  # answered empty as too long (here and by generate_fitting); logged per step
        # the ids a completion may hold (0: unknown); len() of a slow tokenizer walks its vocabulary
        self.vocab_size = len(tokenizer) if hasattr(tokenizer, "__len__") else 0
        self.eos_id = tokenizer.eos_token_id
        self.end_ids = end_token_ids(tokenizer)
        self.pool = ServerPool([base_urls] if isinstance(base_urls, str) else list(base_urls))
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.max_concurrency, self.bucket_bytes, self.push_timeout = max_concurrency, bucket_bytes, push_timeout
        self.version = version
        self.last_sync = SyncStats()
        self.open_channels: set[str] = set()
        self.gate = RequestGate()
        self._metadata: list[tuple[str, str, list[int]]] | None = None
        self._warned_pause = False
        self._workers: RequestThreads | None = None
        self._workers_lock = threading.Lock()
        self._start(wait_for_server)
        factory = channel_factory or (lambda url, i: self._channel_for(url, group_port + i))
        self.channels = {s.url: factory(s.url, i) for i, s in enumerate(self.pool.servers)}

    @property
    def base_url(self) -> str:
        return self.pool.servers[0].url

    # --- start-up -------------------------------------------------------------------
    def _start(self, wait_for_server: float) -> None:
        """Wait for every server's /health (together, at most ``wait_for_server`` s); a server
        still down leaves the rotation (a later push re-admits it); all must agree on the model
        and log-prob mode."""
        with ThreadPoolExecutor(max_workers=len(self.pool.servers)) as ex:
            up = list(ex.map(lambda s: self._wait_healthy(s, wait_for_server), self.pool.servers))
        for s, ok in zip(self.pool.servers, up):
            if ok is not True:
                self.pool.take_out(s, ok)
        live = self.pool.in_rotation()
        if not live:
            raise self.pool.all_down()
        cards = {s.url: self._request(s, "GET", "/v1/models")["data"][0] for s in live}
        models = {u: card["id"] for u, card in cards.items()}
        modes = {s.url: self._server_logprobs_mode(s) for s in live}
        if len(set(models.values())) > 1 or len(set(modes.values())) > 1:
            raise ServerUnavailable(f"the vLLM servers do not serve the same model / logprobs mode: "
                                    f"{ {u: (models[u], modes[u]) for u in models} }")
        self.model, self.logprobs_mode = next(iter(models.values())), next(iter(modes.values()))
        self.max_model_len = self._context_limit(cards)  # prompt_limit (generate_fitting) reads it

    def _context_limit(self, cards: dict[str, dict]) -> int | None:
        """The smallest of the configured ``max_model_len`` and each server's, as vLLM lists it in
        ``GET /v1/models``: ``ModelCard.max_model_len`` (vllm/entrypoints/openai/engine/protocol.py),
        the server's ``model_config.max_model_len`` (``show_available_models``,
        vllm/entrypoints/openai/models/serving.py). Servers that do not list it get one warning;
        with no value known there is no check before the request (None)."""
        listed = {u: card.get("max_model_len") for u, card in cards.items()}
        silent = [u for u, v in listed.items() if not (type(v) is int and v > 0)]
        limits = [v for u, v in listed.items() if u not in silent]
        if self.configured_max_model_len:
            limits.append(int(self.configured_max_model_len))
        if silent:
            checked = f"prompts are checked against {min(limits)} tokens" if limits else "prompts are not checked"
            warnings.warn(f"vLLM server(s) at {', '.join(silent)} do not list max_model_len in GET /v1/models: "
                          f"{checked} before the request; one a server refuses as too long (HTTP 400) is "
                          "answered empty, as an over-long prompt", stacklevel=3)
        return min(limits, default=None)

    def _request(self, s: Server, method: str, path: str, payload: dict | None = None,
                 timeout: float | None = None, retries: int | None = None) -> Any:
        return request_json(s.url, method, path, payload, timeout or self.timeout,
                            self.retries if retries is None else retries, self.backoff)

    def healthy(self, s: Server | None = None) -> bool:
        """One quick ``GET /health`` (no retries) of ``s`` (default: the first server)."""
        s = s or self.pool.servers[0]
        try:
            self._request(s, "GET", "/health", timeout=min(5.0, self.timeout), retries=0)
            return True
        except (ServerUnavailable, ServerError):
            return False

    def _wait_healthy(self, s: Server, total: float, interval: float = 1.0) -> bool | str:
        import time

        deadline = time.monotonic() + total
        while not self.healthy(s):
            if time.monotonic() >= deadline:
                return (f"vLLM server at {s.url} is not up (GET /health failed for {total:g} s); start it with "
                        "`vllm serve` or fix the URL")
            time.sleep(interval)
        return True

    def _channel_for(self, url: str, group_port: int) -> Any:
        """The weight transfer the server announces: vLLM's NCCL, the simulated server's
        checksum over HTTP (:mod:`~lmselfplay.lm.engines.sim_server`: CPU rehearsals), or the
        tensors over HTTP (:mod:`~lmselfplay.lm.engines.hf_server`: a real model on CPU)."""
        s = next(s for s in self.pool.servers if s.url == url)
        try:
            info = self._request(s, "GET", "/server_info?config_format=json", retries=0) if s.in_rotation else {}
            backend = ((info.get("vllm_config") or {}).get("weight_transfer_config") or {}).get("backend")
        except (ServerError, ServerUnavailable, AttributeError):
            backend = None
        if backend == "sim":
            from lmselfplay.lm.engines.sim_server import SimHTTPChannel

            return SimHTTPChannel(url)
        if backend == "http-tensors":
            from lmselfplay.lm.engines.hf_server import TensorHTTPChannel

            return TensorHTTPChannel(url)
        return NCCLChannel(url, group_port, store_timeout=self.push_timeout)

    def _server_logprobs_mode(self, s: Server) -> str:
        """The server's ``--logprobs-mode`` (dev endpoint ``/server_info``); vLLM's default if hidden."""
        try:
            info = self._request(s, "GET", "/server_info?config_format=json", retries=0)
            return info["vllm_config"]["model_config"]["logprobs_mode"]
        except (ServerError, KeyError, TypeError):
            warnings.warn(f"vLLM server at {s.url} does not report its logprobs mode (start it with "
                          "VLLM_SERVER_DEV_MODE=1); assuming vLLM's default raw_logprobs", stacklevel=2)
            return "raw_logprobs"

    # --- generation -----------------------------------------------------------------
    def _complete(self, payload: dict) -> tuple[Server, dict]:
        """One completion request on the pool; an answer without a first choice is garbage
        (the server leaves the rotation and the request moves on)."""
        def one(s: Server) -> dict:
            answer = self._request(s, "POST", "/v1/completions", {"model": self.model, **payload})
            try:
                return answer["choices"][0]
            except (KeyError, IndexError, TypeError):
                raise ServerUnavailable(f"vLLM server at {s.url} answered /v1/completions without a choice: "
                                        f"{str(answer)[:120]}") from None

        with self.gate.request():
            return self.pool.call(one)

    def _pool_map(self, fn, items: list) -> list:
        """``fn`` over ``items``, at most ``max_concurrency`` at once, on the engine's own worker
        threads (:class:`~lmselfplay.lm.engines.server_pool.RequestThreads`): they live as long as
        the engine, and so do their kept-alive connections."""
        if len(items) <= 1:
            return [fn(x) for x in items]
        with self._workers_lock:
            if self._workers is None:
                self._workers = RequestThreads(self.max_concurrency)
        return self._workers.map(fn, items)

    def generate(self, prompts_token_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        check_logprobs_mode(self.logprobs_mode, sampling)
        base = {**sampling_fields(sampling, self.end_ids, native_stops(self.tokenizer, sampling)), "return_token_ids": True, "return_tokens_as_token_ids": True}

        vocab = self.vocab_size

        def one(item):
            prompt, seed = item
            try:
                s, choice = self._complete({**base, "prompt": list(prompt), "seed": seed,
                                            "max_tokens": self._room(prompt, base["max_tokens"])})
            except ServerError as e:
                if not refused_as_too_long(e):
                    raise
                return Completion(list(prompt), [], "", [], PROMPT_TOO_LONG)
            try:
                toks = [int(t) for t in choice["token_ids"]]
                lps = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
            except (KeyError, TypeError, ValueError, AttributeError):
                raise ServerError(f"vLLM server at {s.url} returned a completion without token ids / log-probs "
                                  "(is it vLLM with return_token_ids support?)") from None
            if len(lps) != len(toks):
                raise ServerError(f"vLLM server at {s.url} returned {len(lps)} log-probs for {len(toks)} tokens")
            if vocab and any(not 0 <= t < vocab for t in toks):
                raise ServerError(f"vLLM server at {s.url} returned token ids outside the tokenizer's {vocab} "
                                  f"(max {max(toks)}): does it serve this model?")
            c = to_completion(self.tokenizer, prompt, toks, lps, self.end_ids, sampling.stop)
            c.version = s.version
            return c

        out = self._pool_map(one, list(zip(prompts_token_ids, request_seeds(sampling.seed, len(prompts_token_ids)))))
        self._count_refused(out)
        return out

    def _room(self, prompt: list[int], max_tokens: int) -> int:
        """``max_tokens`` cut to the context left after ``prompt``: vLLM's server refuses a request
        whose prompt and ``max_tokens`` exceed ``max_model_len`` (``TokenizeParams._token_len_check``,
        vllm/renderers/params.py) where the colocated engine ends the answer there ("length"), so
        both give the same answer. At least 1: a prompt with no room is the server's to refuse."""
        if self.max_model_len is None:
            return max_tokens
        return max(1, min(max_tokens, self.max_model_len - len(prompt)))

    def _count_refused(self, out: list[Completion]) -> None:
        """Prompts a server refused as too long were answered empty: counted and warned, as
        :func:`~lmselfplay.lm.engines.base.generate_fitting` does for those it catches first."""
        refused = sum(c.finish_reason == PROMPT_TOO_LONG for c in out)
        if refused:
            self.over_long_prompts += refused
            warnings.warn(f"{refused} of {len(out)} prompt(s) refused by the vLLM server as longer than its context "
                          "(HTTP 400): answered empty, each scored as its recipe scores a failed answer",
                          OverLongPrompt, stacklevel=3)

    def score(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
              temperature: float = 1.0, batch_size: int | None = None) -> list[list[float]]:
        """Per-token log-probs by ``prompt_logprobs`` (computed before temperature: T = 1 only)."""
        if temperature != 1.0:
            raise ValueError(f"vLLM prompt log-probs are at temperature 1; score(temperature={temperature}) "
                             "is not available from the server")

        def one(pc):
            p, c = pc
            if not p:
                raise ValueError("score() needs a non-empty prompt (the first token has no log-prob)")
            s, choice = self._complete({"prompt": list(p) + list(c), "max_tokens": 1, "temperature": 0.0,
                                        "prompt_logprobs": 0})
            try:
                pl = choice["prompt_logprobs"]
                return [float(pl[len(p) + k][str(t)]["logprob"]) for k, t in enumerate(c)]
            except (KeyError, IndexError, TypeError, ValueError):
                raise ServerError(f"vLLM server at {s.url} returned prompt log-probs that do not cover the "
                                  "completion") from None

        return self._pool_map(one, list(zip(prompt_ids, completion_ids)))

    # --- weights --------------------------------------------------------------------
    def update_weights(self, model: Any, version: int | None = None) -> None:
        """Push ``model``'s weights to every reachable server (the module docstring's steps)."""
        import time

        for ch in self.channels.values():  # the same answer on every rank, before any collective
            if getattr(ch, "needs_cuda", False):
                ch.check()
        t0 = time.perf_counter()
        version = self.version + 1 if version is None else version
        on, rank = _dist()
        main = rank == 0
        if self._metadata is None:
            self._metadata = weight_metadata(model)
        stats = SyncStats()
        with self.gate.paused() if main else _nothing():
            errors: dict[str, str] = {}
            targets = self._prepare(errors) if main else []
            status = broadcast_from_main(None if not main or targets else self._push_failed(errors))
            if status is not None:
                raise ServerUnavailable(status)
            for bucket in iter_weight_buckets(model, self.bucket_bytes):
                stats.add(bucket)
                if main:
                    targets = [s for s in targets if self._send(s, bucket, errors)]
            synced = [s.url for s in targets if self._finish(s, errors)] if main else []
            synced = broadcast_from_main(synced)
            status = broadcast_from_main(None if not main or synced else self._push_failed(errors))
        for s in self.pool.servers:
            if s.url in synced:
                self.pool.mark_synced(s, version)
            else:
                self.pool.take_out(s, errors.get(s.url, "missed the weight push"))
        if status is not None:
            raise ServerUnavailable(status)
        stats.seconds = time.perf_counter() - t0
        self.last_sync, self.version = stats, version

    def _push_failed(self, errors: dict[str, str]) -> str:
        why = "; ".join(f"{u}: {e}" for u, e in errors.items())[:800]
        return f"weight push reached no vLLM server (tried {', '.join(self.pool.urls)}): {why}"

    def _step(self, s: Server, what: str, errors: dict[str, str], *fns: Callable[[], Any]) -> list[Any] | None:
        try:  # one HTTP request runs in this thread: its socket timeout (push_timeout) is the deadline
            return ([_push_result(what, s.url, fns[0])] if len(fns) == 1
                    else run_with_deadline(what, s.url, self.push_timeout, *fns))
        except WeightPushError as e:
            errors[s.url] = str(e)
            self.pool.take_out(s, str(e))
            return None

    def _post(self, s: Server, path: str, payload: dict | None = None) -> Callable[[], Any]:
        return lambda: self._request(s, "POST", path, payload if payload is not None else {},
                                     timeout=self.push_timeout, retries=0)

    def _prepare(self, errors: dict[str, str]) -> list[Server]:
        """Rank 0, before any bucket: the servers that are up, paused, joined and ready to load.

        A server out of rotation (it failed a request or a push, so it may have restarted with
        no weight-transfer engine) gets a new rendezvous; one dropped after ``/pause`` is resumed
        (:meth:`_leave`)."""
        ready = []
        for s in self.pool.servers:
            if self._step(s, "GET /health", errors,
                          lambda s=s: self._request(s, "GET", "/health", timeout=self.push_timeout, retries=0)) is None:
                continue
            if not s.in_rotation:
                self._drop_channel(s)
            self._pause(s)
            if s.url not in self.open_channels and not self._open(s, errors):
                self._leave(s, started=False)
            elif self._start_update(s, errors):
                ready.append(s)
            else:
                self._leave(s, started=False)
        return ready

    def _start_update(self, s: Server, errors: dict[str, str]) -> bool:
        """``/start_weight_update``. vLLM answers 409 while an earlier update was never finished
        (``vllm/entrypoints/serve/rlhf/api_router.py``: ``rl_state.is_updating``), e.g. after a
        trainer that died mid-push: that update is finished, then the start retried once."""
        try:
            self._request(s, "POST", "/start_weight_update", {}, timeout=self.push_timeout, retries=0)
            return True
        except ServerError as e:
            if "HTTP 409" not in str(e):
                return self._fail(s, errors, f"weight push to {s.url}: POST /start_weight_update failed: {e}")
        except ServerUnavailable as e:
            return self._fail(s, errors, f"weight push to {s.url}: POST /start_weight_update failed: {e}")
        self._quietly(s, "/finish_weight_update")
        return self._step(s, "POST /start_weight_update", errors, self._post(s, "/start_weight_update")) is not None

    def _fail(self, s: Server, errors: dict[str, str], why: str) -> bool:
        errors[s.url] = why
        self.pool.take_out(s, why)
        return False

    def _pause(self, s: Server) -> None:
        """The server finishes its in-flight requests and holds new ones (from every rank and
        client) until ``/resume``. Servers without the endpoint are covered by the ranks'
        synchronization alone (warned once)."""
        try:
            self._request(s, "POST", "/pause?mode=wait&wait_for_inflight_requests=true&clear_cache=false", {},
                          timeout=self.push_timeout, retries=0)
        except (ServerError, ServerUnavailable) as e:
            if not self._warned_pause:
                warnings.warn(f"vLLM server at {s.url} could not pause generation for the weight push ({e}); "
                              "relying on the trainer ranks' synchronization", stacklevel=3)
                self._warned_pause = True

    def _open(self, s: Server, errors: dict[str, str]) -> bool:
        """The channel's rendezvous: the server's POST and the trainer's side run together; a
        failed or late one releases what the trainer's side holds (:meth:`_drop_channel`)."""
        ch = self.channels[s.url]
        try:
            info = self._request(s, "GET", "/server_info?config_format=json", timeout=self.push_timeout, retries=0)
            world = self._request(s, "GET", "/get_world_size", timeout=self.push_timeout, retries=0)["world_size"]
            init_info, open_group = ch.open_fns({"weight_transfer_config":
                                                 (info.get("vllm_config") or {}).get("weight_transfer_config"),
                                                 "world_size": world})
        except (ServerError, ServerUnavailable, KeyError, TypeError, ImportError) as e:
            return self._fail(s, errors, f"weight push to {s.url}: cannot set up the weight transfer: {e}")
        done = self._step(s, "the NCCL rendezvous", errors,
                          self._post(s, "/init_weight_transfer_engine", {"init_info": init_info}), open_group)
        if done is None:
            self._drop_channel(s)
            return False
        self.open_channels.add(s.url)
        return True

    def _send(self, s: Server, bucket: list[tuple[str, Any]], errors: dict[str, str]) -> bool:
        ch = self.channels[s.url]
        info = {"names": [n for n, _ in bucket], "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket], **ch.update_info()}
        ok = self._step(s, f"a bucket of {len(bucket)} tensors", errors,
                        self._post(s, "/update_weights", {"update_info": info}), lambda: ch.send(bucket))
        if ok is None:
            self._drop_channel(s)
            self._leave(s, started=True)
        return ok is not None

    def _finish(self, s: Server, errors: dict[str, str]) -> bool:
        ok = self._step(s, "POST /finish_weight_update", errors, self._post(s, "/finish_weight_update")) is not None
        ok = ok and self._reset_prefix_cache(s, errors)
        self._resume(s)
        if not ok:
            self._drop_channel(s)
        return ok

    def _reset_prefix_cache(self, s: Server, errors: dict[str, str], attempts: int = 3) -> bool:
        """``success: false`` means blocks are still held (a request in flight): retried briefly,
        then the server is out (its cache would serve the old weights' KV)."""
        import time

        for k in range(attempts):
            answer = self._step(s, "POST /reset_prefix_cache", errors, self._post(s, "/reset_prefix_cache"))
            if answer is None:
                return False
            if isinstance(answer[0], dict) and answer[0].get("success") is True:
                return True
            time.sleep(0.1 * (k + 1))
        return self._fail(s, errors, f"weight push to {s.url}: /reset_prefix_cache did not succeed "
                          f"({str(answer[0])[:80]}) after {attempts} attempts; its prefix cache would serve the old weights")

    def _leave(self, s: Server, started: bool) -> None:
        """A server dropped mid-push is not left mid-update or paused: vLLM would answer the next
        ``/start_weight_update`` with 409 and hold every request until ``/resume``
        (``vllm/entrypoints/serve/rlhf/api_router.py``). Best effort: it is out of rotation, and
        a server that is gone answers nothing."""
        if started:
            self._quietly(s, "/finish_weight_update")
        self._resume(s)

    def _quietly(self, s: Server, path: str) -> None:
        try:
            self._request(s, "POST", path, {}, timeout=self.push_timeout, retries=0)
        except (ServerError, ServerUnavailable):
            pass  # cleanup of a server that is out of rotation already

    def _resume(self, s: Server) -> None:
        self._quietly(s, "/resume")  # a server that could not pause (warned) answers an error here

    def _drop_channel(self, s: Server) -> None:
        """The next push to this server redoes the rendezvous (it may have restarted); what the
        trainer's side holds (a group, its port) is released now."""
        self.open_channels.discard(s.url)
        close = getattr(self.channels[s.url], "close", None)
        if close is not None:
            close()

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        close_idle_connections()  # the workers have ended: their kept connections close here
        for url in list(self.open_channels):
            close = getattr(self.channels[url], "close", None)
            if close is not None:
                close()
        self.open_channels.clear()


@contextmanager
def _nothing():
    yield
