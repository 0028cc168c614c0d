"""The text a library that tokenizes with ``tokenizer(text)`` (TRL) must be given to see THE formatter's ids."""

from __future__ import annotations

import pytest

from lmselfplay.lm.prompt import encode_prompt, text_for_prompt_ids
from lmselfplay.models.policy import load_tokenizer


@pytest.mark.parametrize("model", [None, "embedded:v8"])
def test_text_for_prompt_ids_tokenizes_to_the_formatters_ids(model):
    tok = load_tokenizer(model)
    for prompt in ("What is 2 + 2?", "Solve the problem.\nAnn has 3 pens and gets 12 more."):
        assert list(tok(text=text_for_prompt_ids(tok, prompt))["input_ids"]) == encode_prompt(tok, prompt)
