"""THE prompt formatter: the one way a task text becomes model input.

Generation and training must see the same tokens. Everything that turns a task text
into model input goes through :func:`encode_prompt`, and every answer through
:func:`encode_completion`; rollouts keep token ids (never re-tokenized text), so the
trainer scores exactly what the engine sampled.

Format: the tokenizer's chat template when it has one (one user turn, generation
prompt added); otherwise the plain format ``PLAIN_TEMPLATE`` with a BOS token in front:

    <bos>{prompt}
    Answer:
    {answer}<eos>
"""

from __future__ import annotations

from typing import Any

PLAIN_TEMPLATE = "{prompt}\nAnswer:\n"


def format_prompt(tokenizer: Any, prompt: str) -> str:
    """The prompt as text, exactly as the model reads it (without BOS)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return PLAIN_TEMPLATE.format(prompt=prompt)


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of the formatted prompt: what generation is conditioned on."""
    text = format_prompt(tokenizer, prompt)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if getattr(tokenizer, "chat_template", None):
        return list(ids)  # chat templates carry their own BOS
    bos = tokenizer.bos_token_id
    return ([bos] if bos is not None else []) + list(ids)


def encode_completion(tokenizer: Any, answer: str, eos: bool = True) -> list[int]:
    """Token ids of an answer as the model would have produced it (EOS at the end)."""
    ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    if eos and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids
