"""A scripted engine: answers come from a Python function of the prompt text."""

from __future__ import annotations

from collections.abc import Callable

from lmselfplay.lm.engines.base import Completion, SamplingParams


class ScriptedEngine:
    def __init__(self, tokenizer, answer: Callable[[str], str], logprob: float = -0.5,
                 score_fn: Callable[[str, str], float] | None = None):
        self.tok, self.answer, self.logprob, self.score_fn = tokenizer, answer, logprob, score_fn
        self.version = 0
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts_token_ids, sampling: SamplingParams):
        self.calls.append(prompts_token_ids)
        out = []
        for p in prompts_token_ids:
            text = self.answer(self.tok.decode(p, skip_special_tokens=True))
            ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append(Completion(list(p), ids, text, [self.logprob] * len(ids), "eos"))
        return out

    def score(self, prompt_ids, completion_ids, temperature=1.0):
        out = []
        for p, c in zip(prompt_ids, completion_ids):
            total = self.score_fn(self.tok.decode(p, skip_special_tokens=True),
                                  self.tok.decode(c, skip_special_tokens=True)) if self.score_fn else 0.0
            out.append([total] + [0.0] * (len(c) - 1))
        return out

    def update_weights(self, model, version=None):
        self.version += 1
