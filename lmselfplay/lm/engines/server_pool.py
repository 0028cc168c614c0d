"""Several generation servers behind one client: JSON over HTTP, spreading, failover.

Rules (stdlib only, so everything here is tested on CPU against fake servers):

* **HTTP** (:func:`request_json`): each client thread keeps one connection per server open
  (HTTP/1.1 keep-alive, as ``vllm serve`` speaks); every request has a timeout; connection failures and
  502/503/504 answers are retried on the same server with exponential backoff (a new connection
  after any failure, so a restarted server is picked up). HTTP 500 is the server failing, not the
  request: vLLM's API server answers it, with an empty body, for an engine that died or errored
  (``vllm/entrypoints/launcher.py``: the RuntimeError / EngineDeadError handler, which also
  shuts the server down), so it is :class:`ServerUnavailable` at once (not retried on that server:
  the request fails over). Any other HTTP error is the request's fault (:class:`ServerError`, not
  retried anywhere). A server that stays down, stalls past the timeout, or answers something that
  is not the expected JSON raises :class:`ServerUnavailable` naming its URL.
* **Spreading** (:class:`ServerPool`): each request goes to the server in rotation with the
  fewest outstanding requests (ties: the one picked least recently), so a slow server gets fewer.
* **Failover**: a request whose server fails moves to the next server in rotation, until every
  server was tried once; the failed server leaves the rotation. With none left:
  :class:`ServerUnavailable` naming every URL.
* **Re-admission**: a server out of rotation may have restarted with its checkpoint's weights,
  so it comes back only through :meth:`ServerPool.mark_synced` — after its ``/health`` answers
  and it received the current weights. A server is never used with a weight version other than
  the pool's (:attr:`Server.version` is recorded on every completion it samples).
"""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from lmselfplay.utils.errors import UserError

RETRY_STATUS = (502, 503, 504)
FAILING_STATUS = 500  # the server's engine failed: fail over, do not retry there
T = TypeVar("T")


class ServerUnavailable(UserError, ConnectionError):
    """A generation server cannot be reached, stalls, or answers garbage (the message names its URL)."""


class ServerError(RuntimeError):
    """A server answered with an error for this request (a bad request: not retried)."""


_local = threading.local()  # each client thread keeps one open connection per server
# every thread's connections, so that those of finished threads are closed, not left to the GC
_by_thread: dict[threading.Thread, dict] = {}
_by_thread_lock = threading.Lock()


def _connection(base_url: str, timeout: float) -> tuple[http.client.HTTPConnection, str, bool]:
    """(this thread's kept-alive connection to ``base_url``, the URL's path prefix, whether it
    was used before). A kept connection saves the TCP handshake and a socket per request: the
    client's CPU, which the trainer's step competes for when generation overlaps it."""
    conns = _local.__dict__.get("conns")
    if conns is None:
        conns = _local.conns = {}
        with _by_thread_lock:
            _by_thread[threading.current_thread()] = conns
    parts = urllib.parse.urlsplit(base_url)
    key = (parts.scheme, parts.netloc)
    conn = conns.get(key)
    reused = conn is not None
    if conn is None:
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = conns[key] = cls(parts.netloc, timeout=timeout)
    conn.timeout = timeout
    if conn.sock is not None:
        conn.sock.settimeout(timeout)
    return conn, parts.path.rstrip("/"), reused


def _drop_connection(base_url: str) -> None:
    parts = urllib.parse.urlsplit(base_url)
    conn = _local.__dict__.get("conns", {}).pop((parts.scheme, parts.netloc), None)
    if conn is not None:
        conn.close()


def close_idle_connections() -> None:
    """Close the kept connections of this thread and of every thread that has ended (a
    connection is only ever used by its own thread, so neither can be in use now)."""
    me = threading.current_thread()
    with _by_thread_lock:
        done = [t for t in _by_thread if t is me or not t.is_alive()]
        groups = [_by_thread.pop(t) for t in done]
    for conns in groups:
        for conn in conns.values():
            conn.close()
        conns.clear()
    _local.__dict__.pop("conns", None)


def _exchange(base_url: str, method: str, path: str, data: bytes | None, timeout: float) -> tuple[int, bytes]:
    """One request on this thread's connection: (status, body). A kept connection the server
    closed meanwhile fails before any answer: that is retried once at once on a new one."""
    headers = {"Content-Type": "application/json"} if data is not None else {}
    while True:  # at most twice: the retry's connection is new, so it is not reused
        conn, prefix, reused = _connection(base_url, timeout)
        try:
            conn.request(method, prefix + path, body=data, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        except BaseException as e:
            _drop_connection(base_url)
            if reused and isinstance(e, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)):
                continue
            raise
        if resp.will_close:
            _drop_connection(base_url)
        return resp.status, body


def request_json(base_url: str, method: str, path: str, payload: dict | None = None, timeout: float = 300.0,
                 retries: int = 3, backoff: float = 1.0) -> Any:
    """One JSON request with the module's timeout / retry rules; the decoded answer ({} if empty)."""
    data = json.dumps(payload).encode() if payload is not None else None
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            status, body = _exchange(base_url, method, path, data, timeout)
        except TimeoutError:
            raise ServerUnavailable(f"vLLM server at {base_url} did not answer {method} {path} within "
                                    f"{timeout:g} s") from None
        except (http.client.HTTPException, OSError) as e:
            last = str(e) or type(e).__name__
            continue
        if status >= 400:
            if status in RETRY_STATUS:
                last = f"HTTP {status}"
                continue
            detail = " ".join(body.decode(errors="replace")[:300].split()) or "(no body)"
            if status == FAILING_STATUS:
                raise ServerUnavailable(f"vLLM server at {base_url} is failing: {method} {path} -> HTTP {status}: "
                                        f"{detail}")
            raise ServerError(f"vLLM server at {base_url}: {method} {path} -> HTTP {status}: {detail}")
        try:
            return json.loads(body) if body else {}
        except ValueError:
            raise ServerUnavailable(f"vLLM server at {base_url} answered {method} {path} with something that is "
                                    f"not JSON: {body[:80]!r}") from None
    raise ServerUnavailable(f"vLLM server at {base_url} is unreachable ({method} {path}: {last}, "
                            f"{retries + 1} attempts); is `vllm serve` running there?")


class RequestThreads:
    """Long-lived client threads that run one call's requests concurrently (at most ``size`` at
    once), each keeping its own connections (:func:`_connection`).

    Why not ``ThreadPoolExecutor.map``: with the generation overlapping the trainer, every
    microsecond of client CPU is taken from the training step, and a Future per request (its
    Condition, its lock, its result wait) was a large share of the client's CPU in a py-spy profile.
    Here a call puts its items on one C-implemented queue and waits on one event; the threads
    write the results in order. The first exception (in item order) is raised after all finish.
    Calls from several threads at once share the threads (there are as many as tasks pending,
    up to ``size``). The threads end at :meth:`close`, or when this object is collected."""

    def __init__(self, size: int, name: str = "vllm-client"):
        self.size, self.name = size, name
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.pending = [0]  # tasks queued or running, of every call
        self._stop = weakref.finalize(self, _stop_threads, self.tasks, self.threads)

    def map(self, fn: Callable[[Any], T], items: list) -> list[T]:
        if not items:
            return []
        results: list[Any] = [None] * len(items)
        errors: list[BaseException | None] = [None] * len(items)
        left, done, lock, pending = [len(items)], threading.Event(), self.lock, self.pending

        def run(i: int) -> None:  # refers to no self: queued tasks do not keep this object alive
            try:
                results[i] = fn(items[i])
            except BaseException as e:  # re-raised in the caller
                errors[i] = e
            with lock:
                pending[0] -= 1
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        with lock:
            pending[0] += len(items)
            while len(self.threads) < min(pending[0], self.size):
                t = threading.Thread(target=_work, args=(self.tasks,), name=f"{self.name}-{len(self.threads)}",
                                     daemon=True)
                t.start()
                self.threads.append(t)
        for i in range(len(items)):
            self.tasks.put((run, i))
        done.wait()
        for e in errors:
            if e is not None:
                raise e
        return results

    def close(self) -> None:
        """Stop the threads (after the tasks already queued) and wait for them."""
        with self.lock:
            threads = list(self.threads)
        self._stop()
        for t in threads:
            t.join()


def _work(tasks: queue.SimpleQueue) -> None:
    while True:
        task = tasks.get()
        if task is None:
            return
        task[0](task[1])
        del task  # not held while waiting for the next


def _stop_threads(tasks: queue.SimpleQueue, threads: list[threading.Thread]) -> None:
    for _ in threads:
        tasks.put(None)
    threads.clear()


@dataclass
class Server:
    url: str
    in_rotation: bool = True
    version: int | None = None  # weight version it serves; None: unknown (e.g. its own checkpoint)
    outstanding: int = 0
    last_pick: int = 0
    failures: int = 0
    last_error: str = ""


class ServerPool:
    """The generation servers of one engine (see the module docstring)."""

    def __init__(self, urls: list[str]):
        urls = [u.rstrip("/") for u in urls]
        if not urls:
            raise UserError("vllm_server_urls is empty: give at least one `vllm serve` URL")
        if len(set(urls)) != len(urls):
            raise UserError(f"vllm_server_urls lists a server twice: {urls}")
        self.servers = [Server(u) for u in urls]
        self._lock = threading.Lock()
        self._picks = 0

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def in_rotation(self) -> list[Server]:
        return [s for s in self.servers if s.in_rotation]

    def _acquire(self, exclude: set[str]) -> Server | None:
        with self._lock:
            ready = [s for s in self.servers if s.in_rotation and s.url not in exclude]
            if not ready:
                return None
            s = min(ready, key=lambda s: (s.outstanding, s.last_pick))
            self._picks += 1
            s.outstanding, s.last_pick = s.outstanding + 1, self._picks
            return s

    def _release(self, s: Server) -> None:
        with self._lock:
            s.outstanding -= 1

    def take_out(self, s: Server, why: str) -> None:
        """Out of rotation until re-synced (:meth:`mark_synced`)."""
        with self._lock:
            s.in_rotation, s.failures, s.last_error = False, s.failures + 1, why

    def mark_synced(self, s: Server, version: int) -> None:
        with self._lock:
            s.in_rotation, s.version, s.last_error = True, version, ""

    def call(self, fn: Callable[[Server], T]) -> tuple[Server, T]:
        """``fn(server)`` on the least loaded server in rotation; a server that raises
        :class:`ServerUnavailable` leaves the rotation and the call moves on to the next."""
        tried: set[str] = set()
        errors: list[str] = []
        while True:
            s = self._acquire(tried)
            if s is None:
                raise self.all_down(errors)
            try:
                return s, fn(s)
            except ServerUnavailable as e:
                tried.add(s.url)
                errors.append(str(e))
                self.take_out(s, str(e))
            finally:
                self._release(s)

    def all_down(self, errors: list[str] | None = None) -> ServerUnavailable:
        last = f"; last error: {errors[-1]}" if errors else "".join(
            f"; {s.url}: {s.last_error}" for s in self.servers if s.last_error)[:600]
        return ServerUnavailable(f"no vLLM server is usable (tried {', '.join(self.urls)}){last}")
