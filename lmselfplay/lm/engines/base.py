"""The Engine protocol: what rollouts need from a model server, free of HF specifics.

``generate`` returns, per prompt, the sampled token ids, their text, the behaviour
log-probabilities and a finish reason. Log-probabilities are those of the distribution
the tokens were sampled from *before* top-p truncation: ``log_softmax(logits / T)``
(T = 1 -> the model's own). ``score`` gives the same quantity by teacher forcing, so
``generate(...).logprobs == score(prompt, completion)`` up to float noise — the trainer
relies on that for its importance ratios.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0  # 0 -> greedy
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)  # stop strings (kept in the output)
    seed: int | None = None


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: str  # "eos" | "stop" | "length"
    version: int | None = None  # weight version it was sampled with, where the engine knows it (servers)


@runtime_checkable
class Engine(Protocol):
    version: int  # policy version of the weights it serves (to measure staleness)

    def generate(self, prompts_token_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]: ...

    def score(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
              temperature: float = 1.0) -> list[list[float]]: ...

    def update_weights(self, model: Any, version: int | None = None) -> None: ...


def completion_length(tokenizer: Any, toks: list[int], eos_id: int | None, stops: list[str]) -> tuple[int, str]:
    """(tokens kept, finish reason) of a sample: up to the first EOS (kept), or the shortest
    prefix whose text holds a stop string (kept), else all of it ("length"). Every engine
    cuts with this rule, so all return the same tokens for the same sample."""
    n, reason = len(toks), "length"
    if eos_id is not None and eos_id in toks:
        n, reason = toks.index(eos_id) + 1, "eos"
    if stops and any(s in tokenizer.decode(toks[:n], skip_special_tokens=True) for s in stops):
        for k in range(1, n + 1):
            if any(s in tokenizer.decode(toks[:k], skip_special_tokens=True) for s in stops):
                return k, "stop"
    return n, reason


def to_completion(tokenizer: Any, prompt: list[int], toks: list[int], lps: list[float], eos_id: int | None,
                  stops: list[str]) -> Completion:
    """A Completion of ``toks`` (and their log-probs) cut by :func:`completion_length`."""
    n, reason = completion_length(tokenizer, toks, eos_id, stops)
    toks = list(toks[:n])
    return Completion(list(prompt), toks, tokenizer.decode(toks, skip_special_tokens=True),
                      [float(x) for x in lps[:n]], reason)
