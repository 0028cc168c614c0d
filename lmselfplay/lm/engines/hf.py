"""The default engine: batched ``transformers`` generate (left padding) on CPU or GPU.

One ``generate`` call per batch of prompts (chunks of ``max_batch_size``). Rules:

* The run's :class:`SamplingParams` alone decide the sampling distribution. A model's own
  generation_config defaults (Qwen2.5: ``repetition_penalty`` 1.05, ``top_k`` 20, ...) are
  blanked for the call, so the sampled tokens come from ``softmax(logits / T)`` (top-p
  truncated when asked) — the distribution whose log-probs are recorded.
* Behaviour log-probs are ``log_softmax(logits / T)`` of each sampled token, computed step
  by step by a logits processor that keeps one step's row (never every step's logits), so
  they match :meth:`HFEngine.score` (teacher forcing) and memory stays O(batch x vocab).
* Generation stops at every end token the model declares (:func:`end_token_ids`), and at a
  stop string only once it appears after any think block (:func:`holds_stop`; a
  StoppingCriteria, because HF's ``stop_strings`` would also fire inside ``<think>``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lmselfplay.lm.batching import pad_batch, sequence_logprobs
from lmselfplay.lm.engines.base import (
    Completion,
    SamplingParams,
    completion_length,
    end_token_ids,
    holds_stop,
)


def unwrap(model: Any) -> Any:
    """The bare module under DDP / DeepSpeed / accelerate wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model


def _generating_model(model: Any) -> Any:
    """The transformers model whose ``generate`` runs (under a PEFT wrapper, its base)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def neutral_generation_defaults(model: Any) -> Iterator[None]:
    """``generate`` fills every unset value from ``model.generation_config``: blank it for
    the call so that only the values passed explicitly apply."""
    from transformers import GenerationConfig

    inner = _generating_model(model)
    saved = inner.generation_config
    inner.generation_config = GenerationConfig()
    try:
        yield
    finally:
        inner.generation_config = saved


class SampledLogprobs:
    """A logits processor (first and only one) that records ``log_softmax(logits / T)`` of
    each sampled token and returns the scores HF samples from: ``logits / T``, top-p truncated.

    HF calls it once per step with the tokens so far; the token sampled at the previous step
    is their last column, so one step's log-probs are kept until then, and :meth:`finish`
    gathers the last step's once generation is over."""

    def __init__(self, temperature: float, top_p: float):
        from transformers import TopPLogitsWarper

        self.temperature = temperature if temperature > 0 else 1.0
        self.top_p = TopPLogitsWarper(top_p) if temperature > 0 and top_p < 1.0 else None
        self.previous: torch.Tensor | None = None
        self.picked: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.picked.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        scaled = scores.float() / self.temperature
        self.previous = torch.log_softmax(scaled, dim=-1)
        return self.top_p(input_ids, scaled) if self.top_p is not None else scaled

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """(batch, steps) log-probs of the sampled tokens; ``last_tokens`` = the final step's."""
        if self.previous is not None:
            self.picked.append(self.previous.gather(1, last_tokens[:, None]).squeeze(1))
            self.previous = None
        return torch.stack(self.picked, dim=1) if self.picked else torch.zeros(len(last_tokens), 0)


class StopAfterThink:
    """A stopping criterion: a row is done once a stop string appears in its text after any
    think block (:func:`holds_stop`). Text is accumulated one decoded token at a time; the
    exact cut is :func:`completion_length`'s, on the full decode."""

    def __init__(self, tokenizer: Any, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, list(stops)
        self.texts: list[str] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        pieces = self.tokenizer.batch_decode(input_ids[:, -1:].tolist(), skip_special_tokens=True)
        if not self.texts:
            self.texts = [""] * len(pieces)
        done = []
        for r, piece in enumerate(pieces):
            self.texts[r] += piece
            done.append(holds_stop(self.texts[r], self.stops))
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class HFEngine:
    shares_module = True  # serves the module it is given (the learner's, or a frozen copy)

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 256, version: int = 0):
        self.model = unwrap(model)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.version = version
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_id = tokenizer.pad_token_id
        self.eos_id = tokenizer.eos_token_id
        self.end_ids = end_token_ids(tokenizer, _generating_model(self.model))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # --- generation -----------------------------------------------------------------
    def generate(self, prompts_token_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        out: list[Completion] = []
        seed_ctx = torch.random.fork_rng(devices=[]) if sampling.seed is not None else contextlib.nullcontext()
        with seed_ctx:
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for i in range(0, len(prompts_token_ids), self.max_batch_size):
                out += self._generate_batch(prompts_token_ids[i : i + self.max_batch_size], sampling)
        return out

    def generation_config(self, sp: SamplingParams) -> Any:
        """The whole configuration of a ``generate`` call, from ``sp`` alone: no penalty, no
        top-k (the recorded distribution is the model's, scaled by T; top-p is applied by
        :class:`SampledLogprobs`)."""
        from transformers import GenerationConfig

        return GenerationConfig(
            max_new_tokens=sp.max_new_tokens, do_sample=sp.temperature > 0, temperature=1.0,
            top_k=0 if sp.temperature > 0 else None, top_p=1.0, typical_p=1.0, repetition_penalty=1.0,
            no_repeat_ngram_size=0, num_beams=1,
            eos_token_id=self.end_ids, pad_token_id=self.pad_id, bos_token_id=self.tokenizer.bos_token_id,
            return_dict_in_generate=False, output_logits=False, output_scores=False)

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], sp: SamplingParams,
                        draw: Callable[[SampledLogprobs], Any] | None = None) -> list[Completion]:
        """One left-padded batch. ``draw(recorder)``, when given, is a logits processor that picks
        every row's token itself (after the recorder) and leaves only that token allowed; the
        decoding is then greedy over its choice, so nothing is drawn from torch's global generator."""
        from transformers import LogitsProcessorList, StoppingCriteriaList

        if not prompts:
            return []
        ids, mask = pad_batch(prompts, self.pad_id, side="left")
        width = ids.shape[1]
        recorder = SampledLogprobs(sp.temperature, sp.top_p)
        processor = draw(recorder) if draw is not None else recorder
        decoding = dataclasses.replace(sp, temperature=0.0) if draw is not None else sp
        stopping = StoppingCriteriaList([StopAfterThink(self.tokenizer, sp.stop)] if sp.stop else [])
        was_training = self.model.training
        self.model.eval()
        try:
            with neutral_generation_defaults(self.model):
                seqs = self.model.generate(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                    generation_config=self.generation_config(decoding), logits_processor=LogitsProcessorList([processor]),
                    stopping_criteria=stopping,
                    # Each rank generates for its own games (different numbers of calls and lengths):
                    # under ZeRO-3 transformers would otherwise sync every token across ranks
                    # (synced_gpus) and hang. Engines serve whole (gathered or frozen) weights.
                    synced_gpus=False)
        finally:
            self.model.train(was_training)
        new = seqs[:, width:]
        lps = recorder.finish(new[:, -1]).cpu() if new.shape[1] else torch.zeros(len(prompts), 0)
        new = new.cpu()
        completions = []
        for r, p in enumerate(prompts):
            # HF pads a row after its end token or stop string: cut there (kept), as every engine does
            n, reason = completion_length(self.tokenizer, new[r].tolist(), self.end_ids, sp.stop)
            toks = new[r, :n].tolist()
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            completions.append(Completion(list(p), toks, text, lps[r, :n].tolist(), reason))
        return completions

    # --- teacher forcing ------------------------------------------------------------
    def score(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
              temperature: float = 1.0, batch_size: int | None = None) -> list[list[float]]:
        """Per-token log-probs of each completion given its prompt (right padding)."""
        was_training = self.model.training
        self.model.eval()
        try:
            out: list[list[float]] = []
            bs = batch_size or self.max_batch_size
            for i in range(0, len(prompt_ids), bs):
                out += sequence_logprobs(self.model, prompt_ids[i : i + bs], completion_ids[i : i + bs],
                                         self.pad_id, temperature)
            return out
        finally:
            self.model.train(was_training)

    def update_weights(self, model: Any, version: int | None = None) -> None:
        """Serve ``model``'s weights. Shared module -> nothing to copy, only the version."""
        model = unwrap(model)
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())
        self.version = self.version + 1 if version is None else version
