"""A generation server with its own copy of a real model, on CPU: ``sim_server``'s protocol,
answers from a Hugging Face model (a module or a folder; the lm layer loads no model of its own).

Why it exists: overlapping generation with training (``max_staleness >= 1``) changes what is
learnt only through the weights the rollouts were sampled with, and a simulated server's
answers do not depend on weights. This server holds its own model, samples from it, and
follows the trainer's weight push, so a learning comparison of ``max_staleness`` 1 vs 0 runs
on a laptop (``benchmarks/bench_staleness_learning.py``). It is a test and benchmark
instrument for small models, not a serving engine (no KV-cache paging, no streaming).

Rules:

* ``/v1/completions`` samples from the server's model with the request's temperature, top_p,
  token budget, end tokens and stop strings, by the HF engine's rules
  (:class:`~lmselfplay.lm.engines.hf.HFEngine`: its generation config, log-prob recorder and stop
  criterion); the log-probs are ``log_softmax(logits / T)`` of each sampled token before top-p,
  so the server reports ``processed_logprobs`` (the client then accepts any T with top_p 1).
* Requests that arrive together are decoded as one batch, as vLLM batches them (one at a time,
  a 1M-parameter model spends most of its time in ``generate``'s per-call overhead); each row
  samples with its own generator seeded by its request's ``seed``, so a completion does not
  depend on which requests shared its batch (up to float rounding of the padded batch).
* ``prompt_logprobs`` (the client's ``score``) is one teacher-forced forward at temperature 1.
* The weight push: the server announces the ``http-tensors`` transfer in ``/server_info``;
  the client's :class:`TensorHTTPChannel` posts each bucket as a ``torch.save`` of its tensors to
  ``/sim/load`` (read with ``weights_only``: no code runs from a body), the server stages them
  and loads them at ``/finish_weight_update``. A bucket naming a tensor the model lacks, or of
  another shape, fails that step (HTTP 400: the client takes the server out of rotation).
* The context is the model's ``max_position_embeddings``, listed in ``/v1/models`` as vLLM lists
  its ``max_model_len``; a longer request is refused as :class:`SimServer` refuses it (HTTP 400).
"""

from __future__ import annotations

import io
import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

from sim_server import MAX_MODEL_LEN, SimHTTPChannel, SimServer

from lmselfplay.lm.engines.vllm_server import WEIGHT_CHANNELS

BATCH_WAIT_S = 0.003  # how long the batch waits for the requests sent together with its first


class RowSeededSampler:
    """A logits processor: the HF engine's recorder (``log_softmax(logits / T)``, top-p), then
    one token per row drawn with that row's own generator (seeded by its request, else from
    fresh entropy: never torch's global generator); only that token is left allowed."""

    def __init__(self, recorder: Any, seeds: list[int | None]):
        import torch

        self.recorder = recorder
        self.gens = []
        for s in seeds:
            g = torch.Generator()
            if s is None:
                g.seed()
            else:
                g.manual_seed(int(s))
            self.gens.append(g)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        probs = torch.softmax(self.recorder(input_ids, scores), dim=-1)
        picks = torch.cat([torch.multinomial(probs[r], 1, generator=g) for r, g in enumerate(self.gens)])
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(1, picks[:, None], 0.0)


class _Request:
    def __init__(self, req: dict):
        self.req, self.done, self.result, self.error = req, threading.Event(), None, None


class HFServer(SimServer):
    """:class:`SimServer`'s endpoints and faults, answers from ``model`` (a module or a folder)."""

    transfer_backend = "http-tensors"

    def __init__(self, model: Any, tokenizer: Any = None, port: int = 0):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lmselfplay.lm.engines.hf import HFEngine

        if isinstance(model, (str, Path)):
            path = model
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(path))
        self.engine = HFEngine(model.eval(), tokenizer)
        self.shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        self.pending: dict[str, Any] = {}
        self.pushes = 0
        self.model_lock = threading.Lock()
        self.queue: queue.Queue[_Request | None] = queue.Queue()
        self.batches: list[int] = []  # the size of each batch decoded
        threading.Thread(target=self._batcher, daemon=True, name="hf-server-batcher").start()
        name = str(getattr(model.config, "_name_or_path", "") or "hf")
        # vLLM's default max_model_len is the model's own context (its max_position_embeddings)
        context = getattr(model.config, "max_position_embeddings", None) or MAX_MODEL_LEN
        super().__init__(model=name, logprobs_mode="processed_logprobs", port=port, vocab=len(tokenizer),
                         max_model_len=int(context))

    def close(self) -> None:
        super().close()
        self.queue.put(None)

    def complete(self, req: dict) -> tuple[list[int], list[float]]:
        item = _Request(req)
        self.queue.put(item)
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item.result

    def _batcher(self) -> None:
        """Take the waiting requests, decode each group of equal sampling settings as one batch."""
        while True:
            first = self.queue.get()
            if first is None:
                return
            time.sleep(BATCH_WAIT_S)
            items = [first]
            while not self.queue.empty():
                item = self.queue.get()
                if item is None:  # closed: the requests taken with it fail, none waits forever
                    for waiting in items:
                        waiting.error = RuntimeError("the server closed")
                        waiting.done.set()
                    return
                items.append(item)
            groups: dict[str, list[_Request]] = {}
            for item in items:
                key = json.dumps({k: v for k, v in item.req.items() if k not in ("prompt", "seed")}, sort_keys=True)
                groups.setdefault(key, []).append(item)
            for group in groups.values():
                try:
                    results = self._generate([g.req for g in group])
                except Exception as e:  # the requests fail (HTTP 500), the server goes on
                    results = [None] * len(group)
                    for g in group:
                        g.error = e
                for g, r in zip(group, results):
                    g.result = r
                    g.done.set()

    def _generate(self, reqs: list[dict]) -> list[tuple[list[int], list[float]]]:
        """One batch of requests with the same sampling settings, decoded as the HF engine
        decodes (:meth:`HFEngine._generate_batch`); sampled rows draw with their own seeds."""
        from lmselfplay.lm.engines.base import SamplingParams

        r0 = reqs[0]
        sp = SamplingParams(max_new_tokens=int(r0["max_tokens"]), temperature=float(r0.get("temperature", 1.0)),
                            top_p=float(r0.get("top_p", 1.0)), stop=list(r0.get("stop") or []))
        seeds = [r.get("seed") for r in reqs]
        draw = (lambda recorder: RowSeededSampler(recorder, seeds)) if sp.temperature > 0 else None
        with self.model_lock:
            done = self.engine._generate_batch([list(r["prompt"]) for r in reqs], sp, draw=draw)
        self.batches.append(len(reqs))
        return [(c.token_ids, c.logprobs) for c in done]

    def prompt_logprobs(self, prompt: list[int]) -> list[float | None]:
        with self.model_lock:
            return [None] + self.engine.score([prompt[:1]], [prompt[1:]])[0]

    def load(self, body: bytes) -> None:
        import torch

        bucket = torch.load(io.BytesIO(body), weights_only=True)
        for name, t in bucket.items():
            if name not in self.shapes:
                raise ValueError(f"the model has no tensor {name!r}")
            if tuple(t.shape) != self.shapes[name]:
                raise ValueError(f"{name}: shape {tuple(t.shape)}, the model's is {self.shapes[name]}")
        self.pending.update(bucket)

    def start_update(self) -> None:
        super().start_update()
        self.pending = {}

    def finish_update(self) -> None:
        if not self.pending or self.push_failed:  # a push that failed a bucket is not served
            self.pending = {}
            return
        with self.model_lock:
            self.engine.model.load_state_dict(self.pending, strict=False)
        self.pending = {}
        self.pushes += 1
        self.weights = f"push-{self.pushes}"


class TensorHTTPChannel(SimHTTPChannel):
    """The weight transfer to an :class:`HFServer` (any process): each bucket's tensors,
    ``torch.save``-d, in the body of ``POST /sim/load``."""

    def send(self, bucket: list[tuple[str, Any]]) -> None:
        import torch

        buf = io.BytesIO()
        torch.save({name: t.detach().cpu().contiguous() for name, t in bucket}, buf)
        self._post(buf.getvalue(), "application/octet-stream", timeout=300)


WEIGHT_CHANNELS["http-tensors"] = TensorHTTPChannel  # the server engine pushes to an HFServer this way


def main(argv: list[str] | None = None) -> None:
    """``python -m hf_server --model PATH`` (tests/ on the path): one server in its own
    process, one torch thread; prints its URL, stops when stdin closes."""
    import argparse
    import sys

    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a Hugging Face model folder")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    with HFServer(args.model) as server:
        print(server.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
