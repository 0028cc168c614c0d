"""THE prompt formatter: the one way a task text becomes model input.

Generation and training must see the same tokens. Everything that turns a task text
into model input goes through :func:`encode_prompt`, and every answer through
:func:`encode_completion`; rollouts keep token ids (never re-tokenized text), so the
trainer scores exactly what the engine sampled.

Two formats, chosen by the run's :class:`PromptStyle` (PolicyConfig ``prompt_format``):

* ``chat`` — the tokenizer's chat template: an optional system turn (``system_prompt``; else
  the template's own default, e.g. Qwen2.5's "You are Qwen..."), one user turn, the generation
  prompt; ``enable_thinking`` is passed to the template when set (Qwen3). An answer written
  for training ends with the template's own end of turn (``<|im_end|>``, ``<|eot_id|>``), as
  the template renders an assistant turn.
* ``plain`` — a continuation prompt with BOS in front (a base model's convention)::

      <bos>[{system_prompt}\\n\\n]{prompt}
      Answer:
      {answer}<eos>

``auto`` (the default) is ``chat`` iff the tokenizer has a chat template AND the model declares
that template's end of turn as an end of sequence (the tokenizer's eos or generation_config's
eos list): an instruct model was trained to end its turns, a base model that merely ships a
template (Qwen3-Base, Qwen2.5-Coder) declares only ``<|endoftext|>``. Set ``chat``/``plain``
to override. The style travels on the tokenizer (:func:`set_prompt_style`, done by
``load_policy``), so every caller holding the tokenizer formats the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmselfplay.utils.errors import UserError

PLAIN_TEMPLATE = "{prompt}\nAnswer:\n"
PROMPT_FORMATS = ("auto", "chat", "plain")
_STYLE_ATTR = "lmselfplay_prompt_style"
_CACHE_ATTR = "lmselfplay_template_facts"
_PROBE_ANSWER = "Probe answer 7."  # rendered to find the template's end of turn


@dataclass(frozen=True)
class PromptStyle:
    """How prompts are rendered. ``format`` is resolved (chat | plain) once the model is known."""
    format: str = "auto"
    system_prompt: str | None = None
    enable_thinking: bool | None = None  # None: the template's default (Qwen3: thinks)


def set_prompt_style(tokenizer: Any, style: PromptStyle) -> None:
    if style.format not in PROMPT_FORMATS:
        raise UserError(f"prompt_format {style.format!r}: use one of {', '.join(PROMPT_FORMATS)}")
    if style.format == "chat" and not getattr(tokenizer, "chat_template", None):
        raise UserError("prompt_format chat: this tokenizer has no chat template (use plain or auto)")
    setattr(tokenizer, _STYLE_ATTR, style)


def prompt_style(tokenizer: Any) -> PromptStyle:
    return getattr(tokenizer, _STYLE_ATTR, None) or PromptStyle()


def end_of_turn(tokenizer: Any) -> str | None:
    """The special token the chat template closes an assistant turn with (None: no template,
    or the template closes turns with no special token)."""
    return _template_facts(tokenizer)["end_of_turn"]


def is_chat_model(tokenizer: Any, declared_eos_ids: list[int] | tuple[int, ...] = ()) -> bool:
    """``auto``'s rule: a template whose end of turn is one of the model's declared eos tokens."""
    eot = end_of_turn(tokenizer)
    if eot is None:
        return False
    eot_id = tokenizer.convert_tokens_to_ids(eot)
    return eot == tokenizer.eos_token or eot_id in set(declared_eos_ids)


def resolve_prompt_format(tokenizer: Any, style: PromptStyle, declared_eos_ids: list[int] | tuple[int, ...] = ()
                          ) -> PromptStyle:
    """``style`` with ``auto`` replaced by chat or plain (see the module docstring)."""
    if style.format != "auto":
        return style
    fmt = "chat" if is_chat_model(tokenizer, declared_eos_ids) else "plain"
    return PromptStyle(fmt, style.system_prompt, style.enable_thinking)


def uses_chat(tokenizer: Any) -> bool:
    """Whether prompts go through the chat template (``auto`` resolved from the tokenizer alone
    when no style was set: its eos is the template's end of turn)."""
    style = prompt_style(tokenizer)
    if style.format == "auto":
        return is_chat_model(tokenizer)
    return style.format == "chat"


def thinks(tokenizer: Any) -> bool:
    """Whether the policy writes a ``<think>`` block before answering: thinking enabled
    explicitly, or left to a chat template that has the ``enable_thinking`` switch (Qwen3)."""
    style = prompt_style(tokenizer)
    if style.enable_thinking is not None:
        return style.enable_thinking
    return uses_chat(tokenizer) and "enable_thinking" in (tokenizer.chat_template or "")


def _template_kwargs(style: PromptStyle) -> dict[str, Any]:
    return {} if style.enable_thinking is None else {"enable_thinking": style.enable_thinking}


def _messages(style: PromptStyle, prompt: str) -> list[dict[str, str]]:
    system = [] if style.system_prompt is None else [{"role": "system", "content": style.system_prompt}]
    return [*system, {"role": "user", "content": prompt}]


def format_prompt(tokenizer: Any, prompt: str) -> str:
    """The prompt as text, exactly as the model reads it (without a plain prompt's BOS)."""
    style = prompt_style(tokenizer)
    if uses_chat(tokenizer):
        return tokenizer.apply_chat_template(_messages(style, prompt), add_generation_prompt=True,
                                             tokenize=False, **_template_kwargs(style))
    system = "" if style.system_prompt is None else style.system_prompt + "\n\n"
    return system + PLAIN_TEMPLATE.format(prompt=prompt)


def with_bos(tokenizer: Any, ids: list[int]) -> list[int]:
    bos = tokenizer.bos_token_id
    return ([bos] if bos is not None else []) + list(ids)


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of the formatted prompt: what generation is conditioned on."""
    ids = list(tokenizer(format_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"])
    return ids if uses_chat(tokenizer) else with_bos(tokenizer, ids)  # chat templates carry their own BOS


def text_for_prompt_ids(tokenizer: Any, prompt: str) -> str:
    """The text that ``tokenizer(text)`` (with its default special tokens, as TRL calls it) turns
    into exactly :func:`encode_prompt`'s ids, BOS included; ValueError when no such text exists."""
    ids = encode_prompt(tokenizer, prompt)
    formatted = format_prompt(tokenizer, prompt)
    for cand in (formatted, (tokenizer.bos_token or "") + formatted):
        if list(tokenizer(text=cand)["input_ids"]) == ids:
            return cand
    raise ValueError("no text makes tokenizer(text) give the ids of lmselfplay.lm.prompt.encode_prompt")


def encode_continuation(tokenizer: Any, text: str) -> list[int]:
    """BOS + ``text`` itself: a base model's continuation prompt (HumanEval's convention)."""
    return with_bos(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"])


def assistant_turn_text(tokenizer: Any, answer: str) -> str:
    """``answer`` as the chat template writes an assistant turn after the generation prompt,
    up to and including its end of turn (Qwen3: an empty think block in front when thinking)."""
    style = prompt_style(tokenizer)
    kwargs = _template_kwargs(style)
    user = _messages(style, "x")
    head = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False, **kwargs)
    full = tokenizer.apply_chat_template([*user, {"role": "assistant", "content": answer}],
                                         add_generation_prompt=False, tokenize=False, **kwargs)
    eot = end_of_turn(tokenizer) or tokenizer.eos_token or ""
    if not full.startswith(head):  # a template that rewrites earlier turns: the answer, then the end
        return answer + eot
    turn = full[len(head):]
    cut = turn.rfind(eot) if eot else -1
    return turn[: cut + len(eot)] if cut >= 0 else turn + eot


def encode_completion(tokenizer: Any, answer: str, eos: bool = True) -> list[int]:
    """Token ids of an answer as the model would have produced it: with ``eos``, ended as the
    model ends a turn (chat: the template's end of turn; plain: the eos token)."""
    if not eos:
        return list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    if uses_chat(tokenizer):
        return list(tokenizer(assistant_turn_text(tokenizer, answer), add_special_tokens=False)["input_ids"])
    ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    return ids + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])


def _special_tokens(tokenizer: Any) -> set[str]:
    """Every special token: the named ones and the added tokens marked special (Llama-3 lists
    <|eot_id|> only there)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return {t for t in tokenizer.all_special_tokens if t} | {a.content for a in added.values() if a.special}


def _template_facts(tokenizer: Any) -> dict[str, Any]:
    """Facts read off the chat template once per tokenizer (its end-of-turn token)."""
    template = getattr(tokenizer, "chat_template", None)
    cached = getattr(tokenizer, _CACHE_ATTR, None)
    if cached is not None and cached["template"] == template:
        return cached
    facts: dict[str, Any] = {"template": template, "end_of_turn": None}
    if template:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE_ANSWER}], tokenize=False)
        rest = text[text.rfind(_PROBE_ANSWER) + len(_PROBE_ANSWER):]
        specials = [t for t in _special_tokens(tokenizer) if t in rest]
        if specials:
            facts["end_of_turn"] = min(specials, key=rest.index)
    try:
        setattr(tokenizer, _CACHE_ATTR, facts)
    except AttributeError:  # a tokenizer that refuses attributes: recomputed each time
        pass
    return facts
