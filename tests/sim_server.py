"""A simulated ``vllm serve`` on 127.0.0.1: the endpoints the server engine uses, no model.

For CPU tests, benchmarks and the multi-node rehearsal. Answers are a pure function of the
request and the server's weights tag, so two servers holding the same weights give the same
completion for the same (prompt, seed): token ``k`` is ``hash(weights, prompt, seed, k) % vocab``,
its log-prob ``-0.1 * (k + 1)``. A completion takes ``token_delay * max_tokens`` seconds of
sleeping (no CPU burnt), with up to ``max_batch`` requests decoded together as vLLM batches them.

Faults, set on :attr:`SimServer.faults` while it runs: ``down`` (connection refused: the socket
is closed), ``garbage`` (200 with a body that is not JSON), ``stall`` (seconds before answering),
``dying`` (an engine that died: every endpoint answers 500 with an empty body, ``/health`` 503 —
``vllm/entrypoints/launcher.py``'s RuntimeError / EngineDeadError handler and
``vllm/entrypoints/serve/instrumentator/health.py``), ``fail_push`` (``/update_weights`` answers
500; the push's weights are not served), ``no_max_model_len`` (``/v1/models`` without the
``max_model_len`` field, as a server other than vLLM's answers; the limit still holds), ``init_fails`` (``/init_weight_transfer_engine`` answers
500 "Internal Server Error" at once: the route lets the ``ValueError`` of
``WeightTransferEngine.parse_init_info`` escape, e.g. an init info with a field this vLLM does
not have), ``reset_fails`` (``/reset_prefix_cache`` answers ``success: false`` this many times).
:meth:`SimServer.restart` is a restarted ``vllm serve``: its checkpoint's weights, no
weight-transfer engine (``/update_weights`` answers 500 until ``/init_weight_transfer_engine``:
``NCCLWeightTransferEngine.receive_weights`` raises "not initialized"), not paused, no update open.

The context limit is vLLM's: ``GET /v1/models`` lists the model with its ``max_model_len``
(``ModelCard``, vllm/entrypoints/openai/engine/protocol.py, filled by ``show_available_models`` in
vllm/entrypoints/openai/models/serving.py), and a ``/v1/completions`` whose prompt plus
``max_tokens`` exceeds it is refused with HTTP 400 and the message of ``TokenizeParams._token_len_check``
(vllm/renderers/params.py), the server going on.

The weight-update order is vLLM's (``vllm/entrypoints/serve/rlhf/api_router.py`` with
``rl_state_machine.py``): ``/start_weight_update`` while an update is open, ``/update_weights`` or
``/finish_weight_update`` while none is, answer 409. Every request is recorded in order in
:attr:`SimServer.calls`, the TCP connections accepted are counted in :attr:`SimServer.connections`
(answers keep them alive). The weight transfer is simulated by :class:`SimChannel`: it hands the
pushed tensors' checksum to the server, which serves it from ``/finish_weight_update`` on; between
``start_weight_update`` and ``finish_weight_update`` a completion is an error (the real server's
layers are on the meta device). :attr:`SimServer.on_init` (a test's hook) runs with the init info
of each ``/init_weight_transfer_engine``: the server side of a rendezvous.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from lmselfplay.lm.engines.vllm_server import WEIGHT_CHANNELS

TESTS = Path(__file__).resolve().parent

VOCAB = 997
MAX_MODEL_LEN = 32768  # Qwen2.5's context: what vLLM derives from such a model's config


class _Listener(ThreadingHTTPServer):
    # uvicorn's backlog: the default 5 drops the SYNs of a burst of requests (a 1 s retransmit)
    request_queue_size = 2048


class SimServer:
    """One simulated server (a thread; :meth:`close` or the context manager stops it)."""

    def __init__(self, token_delay: float = 0.0, max_batch: int = 256, model: str = "sim",
                 logprobs_mode: str = "raw_logprobs", eos_id: int | None = None, port: int = 0, vocab: int = VOCAB,
                 max_model_len: int = MAX_MODEL_LEN):
        self.vocab, self.max_model_len = vocab, max_model_len
        self.token_delay, self.model, self.logprobs_mode, self.eos_id = token_delay, model, logprobs_mode, eos_id
        self.calls: list[tuple] = []
        self.faults: dict[str, Any] = {}
        self.weights, self.pending_weights, self.push_digest = "checkpoint", None, hashlib.blake2b(digest_size=8)
        self.updating = self.paused = self.closed = self.push_failed = False
        self.transfer_ready = False  # /init_weight_transfer_engine has run
        self.on_init: Any = None
        self.completions = self.refused = self.connections = 0
        self.slots = threading.BoundedSemaphore(max_batch)
        self.lock = threading.Lock()
        self.httpd = _Listener(("127.0.0.1", port), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def restart(self) -> None:
        """What a restarted ``vllm serve`` on the same URL holds (the module docstring)."""
        with self.lock:
            self.weights, self.pending_weights = "checkpoint", None
            self.updating = self.paused = self.push_failed = self.transfer_ready = False

    def close(self) -> None:
        self.closed = True
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> SimServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def model_card(self) -> dict:
        """The served model's entry in ``GET /v1/models``, with vLLM's ``max_model_len``."""
        card = {"id": self.model, "object": "model", "owned_by": "vllm", "root": self.model}
        if not self.faults.get("no_max_model_len"):
            card["max_model_len"] = self.max_model_len
        return card

    def too_long(self, prompt: list[int], max_tokens: int) -> str | None:
        """vLLM's refusal of a prompt that leaves less than ``max_tokens`` of the context (None: it fits)."""
        room = self.max_model_len - max_tokens
        if len(prompt) <= room:
            return None
        return (f"You passed {len(prompt)} input tokens and requested {max_tokens} output tokens. However, the "
                f"model's context length is only {self.max_model_len} tokens, resulting in a maximum input length "
                f"of {room} tokens. Please reduce the length of the input prompt.")

    def tokens(self, prompt: list[int], seed: Any, n: int) -> list[int]:
        key = json.dumps([self.weights, prompt, seed]).encode()
        return [int.from_bytes(hashlib.blake2b(key + bytes([k % 256, k // 256]), digest_size=4).digest(), "big")
                % self.vocab for k in range(n)]

    # --- what a subclass with a real model replaces (``tests/hf_server.py``) ---
    transfer_backend = "sim"  # announced in /server_info: the client picks its weight channel by it

    def complete(self, req: dict) -> tuple[list[int], list[float]]:
        """(token ids, their log-probs) of one ``/v1/completions`` request."""
        with self.slots:  # decoded with the other requests of the batch
            time.sleep(self.token_delay * int(req["max_tokens"]))
        toks = self.tokens(req["prompt"], req.get("seed"), int(req["max_tokens"]))
        return toks, [-0.1 * (k + 1) for k in range(len(toks))]

    def prompt_logprobs(self, prompt: list[int]) -> list[float | None]:
        """Each prompt token's log-prob given the tokens before it (None for the first)."""
        return [None] + [-0.01 * t for t in prompt[1:]]

    def load(self, body: bytes) -> None:
        """``POST /sim/load``: one bucket of the push (here its checksum, chained into the push's)."""
        self.push_digest.update(json.loads(body)["part"].encode())
        self.pending_weights = self.push_digest.hexdigest()

    def start_update(self) -> None:
        """``/start_weight_update``: a new push begins (what an earlier, failed one sent is discarded)."""
        self.push_digest, self.pending_weights = hashlib.blake2b(digest_size=8), None
        self.push_failed = False

    def finish_update(self) -> None:
        """``/finish_weight_update``: serve the pushed weights from now on (not those of a push
        whose ``/update_weights`` failed: they are not the trainer's)."""
        if self.pending_weights is not None and not self.push_failed:
            self.weights = self.pending_weights
        self.pending_weights = None


def _handler(sim: SimServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn
        # headers and body go out in two writes: with Nagle on, a kept connection waits for the
        # client's delayed ACK (40 ms) per answer; asyncio (uvicorn) sets TCP_NODELAY too
        disable_nagle_algorithm = True

        def setup(self):
            super().setup()
            with sim.lock:  # handler threads run concurrently
                sim.connections += 1

        def handle_one_request(self):
            if sim.closed:  # a kept connection outlives shutdown(): refuse like a stopped server
                self.close_connection = True
                return
            super().handle_one_request()

        def log_message(self, *args):
            pass

        def _send(self, code: int, obj: Any = None, raw: bytes | None = None):
            body = raw if raw is not None else json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _fault(self) -> bool:
            if sim.faults.get("dying"):
                code = 503 if self.path.split("?")[0] == "/health" else 500
                self._send(code, raw=b"")
                return True
            if sim.faults.get("down"):
                self.close_connection = True
                self.connection.close()  # the client sees a reset connection
                return True
            if sim.faults.get("stall"):
                time.sleep(float(sim.faults["stall"]))
            if sim.faults.get("garbage"):
                self._send(200, raw=b"<html>bad gateway</html>")
                return True
            return False

        def do_GET(self):
            sim.calls.append(("GET", self.path))
            if self._fault():
                return
            path = self.path.split("?")[0]
            if path == "/health":
                return self._send(200, {})
            if path == "/v1/models":
                return self._send(200, {"object": "list", "data": [sim.model_card()]})
            if path == "/server_info":
                return self._send(200, {"vllm_config": {"model_config": {"logprobs_mode": sim.logprobs_mode},
                                                        "weight_transfer_config": {"backend": sim.transfer_backend}}})
            if path == "/get_world_size":
                return self._send(200, {"world_size": 1})
            if path == "/sim/state":
                return self._send(200, {"weights": sim.weights, "completions": sim.completions,
                                        "refused_mid_update": sim.refused})
            self._send(404, {"error": "no such endpoint"})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            path = self.path.split("?")[0]
            if path == "/sim/load":  # a bucket: its body is the server's to read (JSON or tensors)
                sim.calls.append(("POST", path, len(raw)))
                return self._fault() or self._load(raw)
            req = json.loads(raw) if raw else {}
            sim.calls.append(("POST", path, req))
            if path == "/sim/faults":  # test control, never faulty itself
                sim.faults.update(req)
                return self._send(200, sim.faults)
            if self._fault():
                return
            handler = {"/v1/completions": self._complete, "/pause": self._pause, "/resume": self._resume,
                       "/start_weight_update": self._start, "/update_weights": self._update,
                       "/finish_weight_update": self._finish, "/reset_prefix_cache": self._reset,
                       "/init_weight_transfer_engine": self._init}.get(path)
            if handler is None:
                return self._send(404, {"error": "no such endpoint"})
            handler(req)

        def _load(self, raw: bytes):
            try:
                sim.load(raw)
            except Exception as e:  # a bucket this server cannot load: the push step fails, the server stays up
                return self._send(400, {"error": f"cannot load the bucket: {type(e).__name__}: {e}"})
            self._send(200, {})

        def _complete(self, req):
            if sim.updating:
                sim.refused += 1
                return self._send(500, {"error": "generation during a weight update (layers on the meta device)"})
            while sim.paused:
                time.sleep(0.001)
            refusal = sim.too_long(list(req.get("prompt") or []), int(req.get("max_tokens", 16)))
            if refusal is not None:  # vLLM's ErrorResponse body (create_error_response)
                return self._send(400, {"error": {"message": refusal, "type": "BadRequestError",
                                                  "param": "input_tokens", "code": 400}})
            if "prompt_logprobs" in req:
                p = req["prompt"]
                lps = sim.prompt_logprobs(p)
                return self._send(200, {"choices": [{"prompt_logprobs": [None] + [
                    {str(t): {"logprob": lp}} for t, lp in zip(p[1:], lps[1:])], "token_ids": [0]}]})
            if int(req.get("max_tokens", 0)) < 0:
                return self._send(400, {"error": "max_tokens must be >= 0"})
            try:
                toks, lps = sim.complete(req)
            except Exception as e:  # the model failed on this request: an error answer, the server goes on
                return self._send(500, {"error": f"generation failed: {type(e).__name__}: {e}"})
            with sim.lock:
                sim.completions += 1
            self._send(200, {"choices": [{"token_ids": toks, "logprobs": {"token_logprobs": lps}}]})

        def _pause(self, req):
            sim.paused = True
            self._send(200, {"status": "paused"})

        def _resume(self, req):
            sim.paused = False
            self._send(200, {"status": "resumed"})

        def _init(self, req):
            if sim.faults.get("init_fails"):
                return self._send(500, raw=b"Internal Server Error")
            if sim.on_init is not None:
                sim.on_init(req.get("init_info") or {})
            sim.transfer_ready = True
            self._send(200, {"message": "Weight transfer initialized"})

        def _start(self, req):
            if sim.updating:
                return self._send(409, {"detail": "start_weight_update called while a weight update is already "
                                                  "in progress. Call finish_weight_update first."})
            sim.updating = True
            sim.start_update()
            self._send(200, {})

        def _update(self, req):
            if not sim.updating:
                return self._send(409, {"detail": "update_weights called without a preceding start_weight_update."})
            if sim.faults.get("fail_push") or not sim.transfer_ready:
                sim.push_failed = True
                return self._send(500, raw=b"")
            self._send(200, {})

        def _finish(self, req):
            if not sim.updating:
                return self._send(409, {"detail": "finish_weight_update called without a preceding "
                                                  "start_weight_update."})
            with sim.lock:
                sim.finish_update()
                sim.updating = False
            self._send(200, {})

        def _reset(self, req):
            if sim.faults.get("reset_fails", 0) > 0:
                sim.faults["reset_fails"] -= 1
                return self._send(200, {"success": False})
            self._send(200, {"success": True})

    return Handler


class SimChannel:
    """The weight transfer to a :class:`SimServer` in this process: the pushed tensors'
    checksum becomes the weights the server serves after ``/finish_weight_update``."""

    needs_cuda = False

    def __init__(self, server: SimServer):
        self.server, self.opened = server, 0

    def open_fns(self, info: dict) -> tuple[dict, Any]:
        def open_group():
            self.opened += 1
        return {"world_size": int(info["world_size"]) + 1}, open_group

    def update_info(self) -> dict:
        return {}

    def send(self, bucket: list[tuple[str, Any]]) -> None:
        digest = self.server.push_digest
        for name, t in bucket:
            digest.update(name.encode())
            digest.update(t.detach().float().cpu().numpy().tobytes())
        self.server.pending_weights = digest.hexdigest()

    def close(self) -> None:
        pass


class SimHTTPChannel(SimChannel):
    """:class:`SimChannel` for a server in another process: the checksum travels by ``POST /sim/load``."""

    def __init__(self, url: str):
        self.url, self.opened = url, 0

    def send(self, bucket: list[tuple[str, Any]]) -> None:
        digest = hashlib.blake2b(digest_size=8)
        for name, t in bucket:
            digest.update(name.encode())
            digest.update(t.detach().float().cpu().numpy().tobytes())
        self._post(json.dumps({"part": digest.hexdigest()}).encode(), "application/json", timeout=30)

    def _post(self, body: bytes, content_type: str, timeout: float) -> None:
        """``POST /sim/load``; a refusal is one line with the server's reason, not urllib's traceback."""
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.url + "/sim/load", data=body, method="POST",
                                     headers={"Content-Type": content_type})
        try:
            urllib.request.urlopen(req, timeout=timeout).read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300]
            try:
                detail = json.loads(detail)["error"]
            except (ValueError, KeyError, TypeError):
                pass
            raise RuntimeError(f"{self.url} refused the bucket: {detail}") from None


WEIGHT_CHANNELS["sim"] = SimHTTPChannel  # the server engine pushes to a SimServer this way


class ServerProcess:
    """``python -m MODULE ARGS`` of a server (``sim_server``'s or ``hf_server``'s ``main``, tests/ on the path) in
    its own process, so its HTTP threads are off the caller's GIL: the URL is its first line of
    output; closing stdin stops it (killed if it does not end within 60 s). The module is imported
    here too, so that its weight channel is registered in the process that pushes."""

    def __init__(self, module: str, *args: str):
        importlib.import_module(module)  # the server's module registers its weight channel here, where pushes start
        path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": path})
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            self.proc.kill()
            raise RuntimeError(f"the {module} process did not start (no URL printed)")

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m sim_server --token_delay S`` (tests/ on the path): one server in its own
    process (benchmarks: its threads do not share the client's interpreter); prints its URL,
    stops when stdin closes."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--token_delay", type=float, default=0.0)
    ap.add_argument("--max_batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    args = ap.parse_args(argv)
    with SimServer(token_delay=args.token_delay, max_batch=args.max_batch, vocab=args.vocab) as sim:
        print(sim.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
