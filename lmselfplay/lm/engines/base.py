"""The Engine protocol: what rollouts need from a model server, free of HF specifics.

``generate`` returns, per prompt, the sampled token ids, their text, the behaviour
log-probabilities and a finish reason. Log-probabilities are those of the distribution
the tokens were sampled from *before* top-p truncation: ``log_softmax(logits / T)``
(T = 1 -> the model's own). ``score`` gives the same quantity by teacher forcing, so
``generate(...).logprobs == score(prompt, completion)`` up to float noise — the trainer
relies on that for its importance ratios.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from lmselfplay.games.text import visible_answer_text
from lmselfplay.lm.prompt import end_of_turn, thinks


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
    finish_reason: str  # "eos" | "stop" | "length" | "prompt_too_long" (answered empty: generate_fitting)
    version: int | None = None  # weight version it was sampled with, where the engine knows it (servers)


@runtime_checkable
class Engine(Protocol):
    version: int  # policy version of the weights it serves (to measure staleness)

    def generate(self, prompts_token_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]: ...

    def score(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
              temperature: float = 1.0) -> list[list[float]]: ...

    def update_weights(self, model: Any, version: int | None = None) -> None: ...


def declared_eos_ids(path: Any) -> list[int]:
    """The eos ids a model folder declares (generation_config.json, config.json), unloaded;
    [] for anything that is not a local model folder."""
    from pathlib import Path

    from transformers import AutoConfig, GenerationConfig

    if not path or not (Path(str(path)) / "config.json").is_file():
        return []
    found: list[Any] = [getattr(AutoConfig.from_pretrained(path), "eos_token_id", None)]
    if (Path(str(path)) / "generation_config.json").is_file():
        found.append(GenerationConfig.from_pretrained(path).eos_token_id)
    return [int(i) for v in found if v is not None for i in (v if isinstance(v, list | tuple) else [v])]


def end_token_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """Every token that ends a turn for this model: the tokenizer's eos, the eos LIST of the
    model's generation_config and config (Qwen: <|im_end|> and <|endoftext|>; Llama-3.1:
    <|end_of_text|>, <|eom_id|>, <|eot_id|>) and the chat template's end of turn. Without
    ``model`` (engines that load it themselves: vLLM) they are read from the tokenizer's folder."""
    found: list[Any] = [tokenizer.eos_token_id]
    if model is None:
        found.append(declared_eos_ids(getattr(tokenizer, "name_or_path", None)))
    for holder in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        found.append(getattr(holder, "eos_token_id", None))
    eot = end_of_turn(tokenizer)
    found.append(None if eot is None else tokenizer.convert_tokens_to_ids(eot))
    ids: list[int] = []
    for v in found:
        for i in (v if isinstance(v, list | tuple) else [v]):
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def holds_stop(text: str, stops: list[str]) -> bool:
    """Whether a stop string occurs in the visible part of ``text``: stop strings apply only
    after a think block closes (a ``</answer>`` inside ``<think>`` is thinking, not an answer)."""
    visible = visible_answer_text(text)
    return visible is not None and any(s in visible for s in stops)


def native_stops(tokenizer: Any, sampling: SamplingParams) -> list[str] | None:
    """The stop strings to hand an engine's own stop mechanism (vLLM's ``stop``), which cannot
    skip a think block: none when the policy thinks (the cut is then made afterwards by
    :func:`completion_length`, at the first stop after ``</think>``), else ``sampling.stop``."""
    return None if not sampling.stop or thinks(tokenizer) else list(sampling.stop)


def completion_length(tokenizer: Any, toks: list[int], eos_id: int | Collection[int] | None,
                      stops: list[str]) -> tuple[int, str]:
    """(tokens kept, finish reason) of a sample: up to the first end token (``eos_id``: one id
    or all of :func:`end_token_ids`; kept), or the shortest prefix whose text holds a stop
    string after any think block (:func:`holds_stop`; kept), else all of it ("length"). Every
    engine cuts with this rule, so all return the same tokens for the same sample."""
    ends = set() if eos_id is None else {eos_id} if isinstance(eos_id, int) else set(eos_id)
    n, reason = len(toks), "length"
    first_end = next((i for i, t in enumerate(toks) if t in ends), None)
    if first_end is not None:
        n, reason = first_end + 1, "eos"
    if stops and holds_stop(tokenizer.decode(toks[:n], skip_special_tokens=True), stops):
        for k in range(1, n + 1):
            if holds_stop(tokenizer.decode(toks[:k], skip_special_tokens=True), stops):
                return k, "stop"
    return n, reason


def to_completion(tokenizer: Any, prompt: list[int], toks: list[int], lps: list[float],
                  eos_id: int | Collection[int] | None, stops: list[str]) -> Completion:
    """A Completion of ``toks`` (and their log-probs) cut by :func:`completion_length`."""
    n, reason = completion_length(tokenizer, toks, eos_id, stops)
    toks = list(toks[:n])
    return Completion(list(prompt), toks, tokenizer.decode(toks, skip_special_tokens=True),
                      [float(x) for x in lps[:n]], reason)


PROMPT_TOO_LONG = "prompt_too_long"  # the finish reason of a prompt no engine call was made for


class OverLongPrompt(UserWarning):
    """A prompt longer than the engine takes was answered empty (:func:`generate_fitting`)."""


def prompt_limit(engine: Any) -> int | None:
    """The longest prompt ``engine`` takes, in tokens: its ``max_model_len`` (vLLM) or the served
    model's ``max_position_embeddings`` (HF), less one — vLLM refuses a prompt that leaves no room
    for one output token (``_validate_prompt_len`` in vllm/v1/engine/input_processor.py raises for
    ``len(prompt) >= max_model_len``). None when the engine declares neither (no check)."""
    length = getattr(engine, "max_model_len", None)
    if length is None:
        config = getattr(getattr(engine, "model", None), "config", None)
        length = getattr(config, "max_position_embeddings", None)
    return int(length) - 1 if isinstance(length, int) and length > 1 else None


def _fitting(engine: Any, lengths: list[int], noun: str, outcome: str, call: Any, refused: Any) -> list[Any]:
    """The one rule of :func:`generate_fitting` and :func:`score_fitting`: the items whose length
    (``lengths``) passes :func:`prompt_limit` are counted on ``engine.over_long_prompts`` and
    warned about (``noun``, ``outcome``) and get ``refused(i)``; ``call(indices)`` answers the
    others in one engine call (all of them, in order, when none is too long)."""
    limit = prompt_limit(engine)
    long = {i for i, n in enumerate(lengths) if limit is not None and n > limit}
    if not long:
        return call(range(len(lengths)))
    engine.over_long_prompts = getattr(engine, "over_long_prompts", 0) + len(long)
    warnings.warn(f"{len(long)} of {len(lengths)} {noun} longer than the engine's {limit} tokens (longest "
                  f"{max(lengths[i] for i in long)}): {outcome}", OverLongPrompt, stacklevel=3)
    keep = [i for i in range(len(lengths)) if i not in long]
    answers = iter(call(keep) if keep else [])
    return [refused(i) if i in long else next(answers) for i in range(len(lengths))]


def generate_fitting(engine: Any, prompts: list[list[int]], sampling: SamplingParams) -> list[Completion]:
    """``engine.generate`` of the prompts that fit :func:`prompt_limit`; each longer one is answered,
    without any engine call, by an empty Completion (``finish_reason`` ``prompt_too_long``). An
    over-long prompt is its sample's problem, never the run's: an empty answer is what every recipe
    already scores as a failed answer (an illegal move forfeits the game, a malformed proposal or
    question earns the malformed reward, no answer is no vote). The engine counts them
    (``engine.over_long_prompts``, logged by the trainer's step as ``engine/over_long_prompts``)
    and each call that had one warns. Every caller of an engine generates through here."""
    return _fitting(engine, [len(p) for p in prompts], "prompt(s)",
                    "answered empty, each scored as its recipe scores a failed answer",
                    lambda ii: engine.generate([prompts[i] for i in ii], sampling),
                    lambda i: Completion(list(prompts[i]), [], "", [], PROMPT_TOO_LONG))


def score_fitting(engine: Any, prompts: list[list[int]], completions: list[list[int]],
                  **kwargs: Any) -> list[list[float]]:
    """``engine.score`` of the (prompt, completion) pairs whose whole sequence fits
    :func:`prompt_limit` (vLLM scores a pair as one prompt of ``len(p) + len(c)`` tokens, so the
    same rule as generation applies to the sum); each longer pair gets, without any engine call,
    one NaN per completion token. NaN is the scorer's "no answer": the judge counts it invalid and
    says 1/2, the readout gives the move probability 0. The pairs are counted with the over-long
    prompts (``engine.over_long_prompts``) and each call that had one warns. Every caller of
    ``engine.score`` scores through here."""
    return _fitting(engine, [len(p) + len(c) for p, c in zip(prompts, completions)], "scored sequence(s)",
                    "not scored (NaN), each read as no answer",
                    lambda ii: engine.score([prompts[i] for i in ii], [completions[i] for i in ii], **kwargs),
                    lambda i: [math.nan] * len(completions[i]))
