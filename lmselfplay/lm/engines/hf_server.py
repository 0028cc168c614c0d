"""A generation server with its own copy of a real model, on CPU: ``sim_server``'s protocol,
answers from a Hugging Face model (the embedded tiny model by default).

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
"""

from __future__ import annotations

import io
import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

from lmselfplay.lm.engines.sim_server import SimHTTPChannel, SimServer

BATCH_WAIT_S = 0.003  # how long the batch waits for the requests sent together with its first


class RowSeededSampler:
    """A logits processor: the HF engine's recorder (``log_softmax(logits / T)``, top-p), then
    one token per row drawn with that row's own generator; HF is handed scores that allow only
    that token, so its own sampling picks it."""

    def __init__(self, recorder: Any, seeds: list[int | None], greedy: bool):
        import torch

        self.recorder, self.greedy = recorder, greedy
        self.gens = [torch.Generator().manual_seed(int(s) if s is not None else torch.seed()) for s in seeds]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        scores = self.recorder(input_ids, scores)
        if self.greedy:
            picks = scores.argmax(-1)
        else:
            probs = torch.softmax(scores, dim=-1)
            picks = torch.cat([torch.multinomial(probs[r], 1, generator=g) for r, g in enumerate(self.gens)])
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(1, picks[:, None], 0.0)


class _Request:
    def __init__(self, req: dict):
        self.req, self.done, self.result, self.error = req, threading.Event(), None, None


class HFServer(SimServer):
    """:class:`SimServer`'s endpoints and faults, answers from ``model`` (a module or a folder)."""

    transfer_backend = "http-tensors"

    def __init__(self, model: Any = None, tokenizer: Any = None, port: int = 0):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lmselfplay.lm.engines.hf import HFEngine

        if model is None or isinstance(model, (str, Path)):
            path = model
            if path is None:
                from lmselfplay.models.tiny import ensure_tiny_model

                path = ensure_tiny_model(progress=False)
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
        super().__init__(model=name, logprobs_mode="processed_logprobs", port=port, vocab=len(tokenizer))

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
                if item is None:
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
        """One batch of requests with the same sampling settings (left padded, as the HF engine)."""
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        from lmselfplay.lm.batching import pad_batch
        from lmselfplay.lm.engines.base import SamplingParams, completion_length
        from lmselfplay.lm.engines.hf import (
            SampledLogprobs,
            StopAfterThink,
            neutral_generation_defaults,
        )

        r0, eng = reqs[0], self.engine
        sp = SamplingParams(max_new_tokens=int(r0["max_tokens"]), temperature=float(r0.get("temperature", 1.0)),
                            top_p=float(r0.get("top_p", 1.0)), stop=list(r0.get("stop") or []))
        prompts = [list(r["prompt"]) for r in reqs]
        ids, mask = pad_batch(prompts, eng.pad_id, side="left")
        recorder = SampledLogprobs(sp.temperature, sp.top_p)
        sampler = RowSeededSampler(recorder, [r.get("seed") for r in reqs], greedy=sp.temperature <= 0)
        stopping = StoppingCriteriaList([StopAfterThink(eng.tokenizer, sp.stop)] if sp.stop else [])
        with self.model_lock, torch.no_grad(), neutral_generation_defaults(eng.model):
            seqs = eng.model.generate(input_ids=ids, attention_mask=mask, generation_config=eng.generation_config(sp),
                                      logits_processor=LogitsProcessorList([sampler]), stopping_criteria=stopping)
        self.batches.append(len(reqs))
        new = seqs[:, ids.shape[1]:]
        lps = recorder.finish(new[:, -1]) if new.shape[1] else torch.zeros(len(reqs), 0)
        out = []
        for row, lp in zip(new.tolist(), lps.tolist()):
            n, _ = completion_length(eng.tokenizer, row, eng.end_ids, sp.stop)
            out.append((row[:n], lp[:n]))
        return out

    def prompt_logprobs(self, prompt: list[int]) -> list[float | None]:
        import torch

        with self.model_lock, torch.no_grad():
            logits = self.engine.model(torch.tensor([prompt])).logits[0].float()
            lps = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
        return [None] + lps.tolist()

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
        if not self.pending:
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
        import urllib.error
        import urllib.request

        import torch

        buf = io.BytesIO()
        torch.save({name: t.detach().cpu().contiguous() for name, t in bucket}, buf)
        req = urllib.request.Request(self.url + "/sim/load", data=buf.getvalue(), method="POST",
                                     headers={"Content-Type": "application/octet-stream"})
        try:
            urllib.request.urlopen(req, timeout=300).read()
        except urllib.error.HTTPError as e:  # the server's one-line reason, not urllib's traceback
            detail = e.read().decode(errors="replace")[:300]
            try:
                detail = json.loads(detail)["error"]
            except (ValueError, KeyError, TypeError):
                pass
            raise RuntimeError(f"{self.url} refused the bucket: {detail}") from None


def main(argv: list[str] | None = None) -> None:
    """``python -m lmselfplay.lm.engines.hf_server [--model PATH]``: one server in its own
    process, one torch thread; prints its URL, stops when stdin closes."""
    import argparse
    import sys

    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a Hugging Face model folder (default: the embedded tiny model)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    with HFServer(args.model) as server:
        print(server.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
