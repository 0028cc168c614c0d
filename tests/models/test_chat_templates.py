"""The shipped copies of the real families' chat templates render what the real tokenizers render:
Qwen2.5's default system prompt, Qwen3's thinking switch and kept reasoning, Llama-3.1's date header."""

import pytest
from lm_fixtures import tiny_tokenizer

from lmselfplay.models import chat_templates

HI = [{"role": "user", "content": "hi"}]


def _render(template, messages, **kw):
    return tiny_tokenizer().apply_chat_template(messages, chat_template=template, tokenize=False, **kw)


@pytest.mark.parametrize("name, want", [
    ("QWEN2_5", "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ("QWEN3", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ("LLAMA3_1", "<s><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                 "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n"),
])
def test_generation_prompt_is_the_real_text(name, want):
    assert _render(getattr(chat_templates, name), HI, add_generation_prompt=True) == want


def test_qwen3_thinking_switch_and_a_finished_turn():
    off = _render(chat_templates.QWEN3, HI, add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    turn = _render(chat_templates.QWEN3, [*HI, {"role": "assistant", "content": "<think>\nx\n</think>\n\nok"}])
    assert turn.endswith("<|im_start|>assistant\n<think>\nx\n</think>\n\nok<|im_end|>\n")
