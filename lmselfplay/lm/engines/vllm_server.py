"""Rollouts served by ``vllm serve`` on other GPUs or nodes: generation over HTTP, weights over NCCL.

Start the server the way TRL's client expects (weight transfer and dev endpoints on, the
log-prob mode of :mod:`lmselfplay.lm.engines.vllm` for the run's temperature)::

    VLLM_SERVER_DEV_MODE=1 vllm serve PATH --weight-transfer-config '{"backend": "nccl"}' \\
        --logprobs-mode raw_logprobs        # temperature 1; processed_logprobs for T != 1 (top_p 1)

HTTP (stdlib only, so it is tested on CPU against a fake server): ``GET /health``,
``GET /v1/models``, ``POST /v1/completions`` with token-id prompts (one request per prompt, so
each gets its own seed ``seed + i``; the server batches concurrent requests), log-probs of the
sampled tokens (``logprobs: 0``) and, for :meth:`score`, ``prompt_logprobs: 0``. Every request
has a timeout; connection failures and 502/503/504 answers are retried with backoff (a new
connection each time, so a restarted server is picked up); a server that stays down raises
:class:`ServerUnavailable` whose one-line message names the URL.

Weights: :meth:`VLLMServerEngine.update_weights` reuses TRL's ``VLLMClient`` for the NCCL part
(``init_communicator`` once, then ``update_named_params`` streaming our buckets — ZeRO-3
gathered one bucket at a time, LoRA merged — then ``reset_prefix_cache``). Only the main process
sends; the other ranks walk the same buckets because gathering is a collective. NCCL needs CUDA
and vLLM on the trainer side; generation alone needs neither.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lmselfplay.lm.engines.base import (
    Completion,
    SamplingParams,
    end_token_ids,
    native_stops,
    to_completion,
)
from lmselfplay.lm.engines.vllm import check_logprobs_mode, request_seeds
from lmselfplay.lm.engines.weight_sync import SyncStats, iter_weight_buckets, weight_metadata

RETRY_STATUS = (502, 503, 504)


class ServerUnavailable(ConnectionError):
    """The vLLM server cannot be reached or keeps failing (the message names its URL)."""


class ServerError(RuntimeError):
    """The server answered, with an error (a bad request: not retried)."""


class VLLMServerEngine:
    def __init__(self, tokenizer: Any, base_url: str = "http://127.0.0.1:8000", timeout: float = 300.0,
                 retries: int = 3, backoff: float = 1.0, wait_for_server: float = 0.0,
                 max_concurrency: int = 64, group_port: int = 51216, bucket_bytes: int = 256 << 20,
                 version: int = 0):
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.end_ids = end_token_ids(tokenizer)
        self.base_url = base_url.rstrip("/")
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.max_concurrency, self.group_port, self.bucket_bytes = max_concurrency, group_port, bucket_bytes
        self.version = version
        self.last_sync = SyncStats()
        self._client: Any = None  # TRL's VLLMClient, created on the first weight push
        self._metadata: list[tuple[str, str, list[int]]] | None = None
        self.wait_until_healthy(wait_for_server)
        self.model = self._request("GET", "/v1/models")["data"][0]["id"]
        self.logprobs_mode = self._server_logprobs_mode()

    # --- HTTP -----------------------------------------------------------------------
    def _request(self, method: str, path: str, payload: dict | None = None, timeout: float | None = None,
                 retries: int | None = None) -> Any:
        url = self.base_url + path
        data = json.dumps(payload).encode() if payload is not None else None
        retries = self.retries if retries is None else retries
        last = ""
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            req = urllib.request.Request(url, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
            try:
                with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                    body = resp.read()
                return json.loads(body) if body else {}
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:300]
                if e.code not in RETRY_STATUS:
                    raise ServerError(f"vLLM server at {self.base_url}: {method} {path} -> HTTP {e.code}: {detail}") \
                        from None
                last = f"HTTP {e.code}"
            except TimeoutError:
                raise ServerUnavailable(f"vLLM server at {self.base_url} did not answer {method} {path} within "
                                        f"{timeout or self.timeout:g} s") from None
            except (urllib.error.URLError, ConnectionError, OSError) as e:
                reason = getattr(e, "reason", e)
                if isinstance(reason, TimeoutError):
                    raise ServerUnavailable(f"vLLM server at {self.base_url} did not answer {method} {path} "
                                            f"within {timeout or self.timeout:g} s") from None
                last = str(reason)
        raise ServerUnavailable(f"vLLM server at {self.base_url} is unreachable ({method} {path}: {last}, "
                                f"{retries + 1} attempts); is `vllm serve` running there?")

    def healthy(self) -> bool:
        """One quick ``GET /health`` (no retries)."""
        try:
            self._request("GET", "/health", timeout=min(5.0, self.timeout), retries=0)
            return True
        except (ServerUnavailable, ServerError):
            return False

    def wait_until_healthy(self, total_timeout: float = 0.0, interval: float = 1.0) -> None:
        """Poll ``/health`` until it answers 200, at most ``total_timeout`` seconds."""
        deadline = time.monotonic() + total_timeout
        while not self.healthy():
            if time.monotonic() >= deadline:
                raise ServerUnavailable(f"vLLM server at {self.base_url} is not up (GET /health failed for "
                                        f"{total_timeout:g} s); start it with `vllm serve` or fix the URL")
            time.sleep(interval)

    def _server_logprobs_mode(self) -> str:
        """The server's ``--logprobs-mode`` (dev endpoint ``/server_info``); vLLM's default if hidden."""
        try:
            info = self._request("GET", "/server_info?config_format=json", retries=0)
            return info["vllm_config"]["model_config"]["logprobs_mode"]
        except (ServerError, KeyError, TypeError):
            warnings.warn(f"vLLM server at {self.base_url} does not report its logprobs mode (start it with "
                          "VLLM_SERVER_DEV_MODE=1); assuming vLLM's default raw_logprobs", stacklevel=2)
            return "raw_logprobs"

    # --- generation -----------------------------------------------------------------
    def _complete(self, payload: dict) -> dict:
        return self._request("POST", "/v1/completions", {"model": self.model, **payload})["choices"][0]

    def _pool_map(self, fn, items: list) -> list:
        if len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(items))) as pool:
            return list(pool.map(fn, items))

    def generate(self, prompts_token_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        check_logprobs_mode(self.logprobs_mode, sampling)
        greedy = sampling.temperature <= 0
        base = {"max_tokens": sampling.max_new_tokens, "temperature": 0.0 if greedy else sampling.temperature,
                "top_p": 1.0 if greedy else sampling.top_p, "logprobs": 0, "return_token_ids": True,
                "return_tokens_as_token_ids": True, "skip_special_tokens": True,
                "include_stop_str_in_output": True,
                # the server would fill these from the model's generation_config (Qwen: 1.05, 20)
                "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
        if native_stops(self.tokenizer, sampling):
            base["stop"] = native_stops(self.tokenizer, sampling)
        if self.end_ids:
            base["stop_token_ids"] = list(self.end_ids)

        def one(item):
            prompt, seed = item
            payload = {**base, "prompt": list(prompt)}
            if seed is not None:
                payload["seed"] = seed
            choice = self._complete(payload)
            toks = [int(t) for t in choice["token_ids"]]
            lps = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
            if len(lps) != len(toks):
                raise ServerError(f"vLLM server at {self.base_url} returned {len(lps)} log-probs for {len(toks)} "
                                  "tokens")
            return to_completion(self.tokenizer, prompt, toks, lps, self.end_ids, sampling.stop)

        return self._pool_map(one, list(zip(prompts_token_ids, request_seeds(sampling.seed, len(prompts_token_ids)))))

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
            choice = self._complete({"prompt": list(p) + list(c), "max_tokens": 1, "temperature": 0.0,
                                     "prompt_logprobs": 0})
            pl = choice["prompt_logprobs"]
            return [float(pl[len(p) + k][str(t)]["logprob"]) for k, t in enumerate(c)]

        return self._pool_map(one, list(zip(prompt_ids, completion_ids)))

    # --- weights over NCCL (GPU) ----------------------------------------------------
    def _nccl_client(self) -> Any:
        if self._client is None:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError(f"pushing weights to the vLLM server at {self.base_url} goes over NCCL and "
                                   "needs a CUDA device on the trainer; generation works without one")
            from lmselfplay.lm.engines.vllm import require_vllm

            require_vllm()  # TRL's client and NCCL transfer live in vLLM
            from trl.generation.vllm_client import VLLMClient

            client = VLLMClient(base_url=self.base_url, group_port=self.group_port)
            client.init_communicator(device=torch.cuda.current_device())
            self._client = client
        return self._client

    def update_weights(self, model: Any, version: int | None = None) -> None:
        """Stream ``model``'s weights to the server (main process) while every rank walks the
        buckets (ZeRO-3 gathers are collectives), then reset the server's prefix cache."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        stats = SyncStats()
        main = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
        if self._metadata is None:
            self._metadata = weight_metadata(model)

        def stream():
            for bucket in iter_weight_buckets(model, self.bucket_bytes):
                stats.add(bucket)
                yield from bucket

        if main:
            client = self._nccl_client()
            try:
                with client.weight_update():
                    client.update_named_params(self._metadata, stream())
                client.reset_prefix_cache()
            except Exception:
                self._client = None  # a restarted server needs a new NCCL group: re-init next time
                raise
        else:
            for _ in stream():
                pass
        stats.seconds = time.perf_counter() - t0
        self.last_sync = stats
        self.version = self.version + 1 if version is None else version

    def close(self) -> None:
        if self._client is not None:
            self._client.close_communicator()
            self._client = None
