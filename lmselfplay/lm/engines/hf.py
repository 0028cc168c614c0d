"""The default engine: batched ``transformers`` generate (left padding) on CPU or GPU.

One ``generate`` call per batch of prompts (chunks of ``max_batch_size``). Behaviour
log-probs come from the raw logits HF returns (``output_logits=True``), scaled by the
temperature, so they match :meth:`HFEngine.score` (teacher forcing).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from lmselfplay.lm.batching import pad_batch, sequence_logprobs
from lmselfplay.lm.engines.base import Completion, SamplingParams, completion_length


def unwrap(model: Any) -> Any:
    """The bare module under DDP / DeepSpeed / accelerate wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model


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

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], sp: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        ids, mask = pad_batch(prompts, self.pad_id, side="left")
        width = ids.shape[1]
        greedy = sp.temperature <= 0
        kwargs: dict[str, Any] = dict(
            max_new_tokens=sp.max_new_tokens, do_sample=not greedy, pad_token_id=self.pad_id,
            eos_token_id=self.eos_id, return_dict_in_generate=True, output_logits=True,
            # Each rank generates for its own games (different numbers of calls and lengths):
            # under ZeRO-3 transformers would otherwise sync every token across ranks
            # (synced_gpus) and hang. Engines serve whole (gathered or frozen) weights.
            synced_gpus=False)
        if not greedy:
            kwargs.update(temperature=sp.temperature, top_p=sp.top_p, top_k=0)
        if sp.stop:
            kwargs.update(stop_strings=list(sp.stop), tokenizer=self.tokenizer)
        was_training = self.model.training
        self.model.eval()
        try:
            res = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device), **kwargs)
        finally:
            self.model.train(was_training)
        new = res.sequences[:, width:].cpu()
        logits = torch.stack(res.logits, dim=1).float().cpu() if res.logits else None
        t = 1.0 if greedy else sp.temperature
        completions = []
        for r, p in enumerate(prompts):
            # HF pads a row after its EOS or stop string: cut there (kept), as every engine does
            n, reason = completion_length(self.tokenizer, new[r].tolist(), self.eos_id, sp.stop)
            toks = new[r, :n].tolist()
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            if logits is not None and n:
                lp = torch.log_softmax(logits[r, :n] / t, dim=-1)
                lps = lp.gather(1, torch.tensor(toks).unsqueeze(1)).squeeze(1).tolist()
            else:
                lps = []
            completions.append(Completion(list(p), toks, text, lps, reason))
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
