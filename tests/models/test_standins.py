"""The stand-in models render exactly what the real tokenizers render, and declare the real
special tokens and generation defaults (the facts the engine and prompt code must honour)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from lmselfplay.models.standins import STANDINS, BuildOptions, ensure_standin, standin_dir

HI = [{"role": "user", "content": "Hi"}]
QWEN_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
LLAMA_SYSTEM = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n")

# (stand-in, messages, template kwargs, the text the real tokenizer renders)
RENDERED = [
    ("qwen2.5-instruct", HI, {}, QWEN_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen2.5-instruct", [{"role": "system", "content": "Be brief."}, *HI], {},
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen2.5-instruct", [*HI, {"role": "assistant", "content": "Hello."}], {"add_generation_prompt": False},
     QWEN_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"),
    ("qwen2.5-coder-base", HI, {}, QWEN_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen3", HI, {}, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen3", HI, {"enable_thinking": True}, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen3", HI, {"enable_thinking": False},
     "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ("qwen3", [*HI, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello."}],
     {"add_generation_prompt": False},
     "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nhm\n</think>\n\nHello.<|im_end|>\n"),
    ("qwen3-base", [{"role": "system", "content": "S"}, *HI], {},
     "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
    ("llama-3.1-instruct", HI, {},
     LLAMA_SYSTEM + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("llama-3.1-instruct", [{"role": "system", "content": " Be brief. "}, *HI,
                            {"role": "assistant", "content": "Hello."}], {"add_generation_prompt": False},
     LLAMA_SYSTEM + "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
     "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"),
]


@pytest.mark.parametrize("name,messages,kwargs,expected", RENDERED)
def test_templates_render_the_real_text(standin, name, messages, kwargs, expected):
    tok = AutoTokenizer.from_pretrained(standin(name))
    kwargs = {"add_generation_prompt": True, **kwargs}
    assert tok.apply_chat_template(messages, tokenize=False, **kwargs) == expected


# (stand-in, bos, eos, pad, has a template, generation_config eos tokens, config eos tokens, class)
ROLES = [
    ("qwen2.5-instruct", None, "<|im_end|>", "<|endoftext|>", True, ["<|im_end|>", "<|endoftext|>"],
     ["<|im_end|>"], "Qwen2ForCausalLM"),
    ("qwen3", None, "<|im_end|>", "<|endoftext|>", True, ["<|im_end|>", "<|endoftext|>"], ["<|im_end|>"],
     "Qwen3ForCausalLM"),
    ("qwen3-base", None, "<|endoftext|>", "<|endoftext|>", True, ["<|endoftext|>"], ["<|endoftext|>"],
     "Qwen3ForCausalLM"),
    ("qwen2.5-coder-base", None, "<|endoftext|>", "<|endoftext|>", True, ["<|endoftext|>"], ["<|endoftext|>"],
     "Qwen2ForCausalLM"),
    ("llama-3.1-base", "<|begin_of_text|>", "<|end_of_text|>", None, False, ["<|end_of_text|>"],
     ["<|end_of_text|>"], "LlamaForCausalLM"),
    ("llama-3.1-instruct", "<|begin_of_text|>", "<|eot_id|>", None, True,
     ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
     "LlamaForCausalLM"),
]


def _tokens(tok, ids):
    return tok.convert_ids_to_tokens(ids if isinstance(ids, list) else [ids])


@pytest.mark.parametrize("name,bos,eos,pad,templated,gen_eos,cfg_eos,arch", ROLES)
def test_token_roles_and_generation_defaults(standin, name, bos, eos, pad, templated, gen_eos, cfg_eos, arch):
    path = standin(name)
    tok = AutoTokenizer.from_pretrained(path)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (bos, eos, pad)
    assert bool(tok.chat_template) is templated
    assert _tokens(tok, GenerationConfig.from_pretrained(path).eos_token_id) == gen_eos
    config = AutoConfig.from_pretrained(path)
    assert _tokens(tok, config.eos_token_id) == cfg_eos
    assert config.architectures == [arch]
    assert (config.num_hidden_layers, config.hidden_size) == (2, 64)


def test_qwen_instruct_declares_its_sampling_defaults(standin):
    gen = GenerationConfig.from_pretrained(standin("qwen2.5-instruct"))
    assert (gen.repetition_penalty, gen.top_k, gen.top_p, gen.temperature, gen.do_sample) == (1.05, 20, 0.8, 0.7, True)
    assert GenerationConfig.from_pretrained(standin("qwen3")).top_k == 20


@pytest.mark.parametrize("name", STANDINS)
def test_special_tokens_are_single_tokens_and_roundtrip(standin, name):
    """Specials are one token each and vanish with skip_special_tokens; Qwen3's think tags are
    one token each and STAY in decoded text (they are added but not special, as in the real one)."""
    tok = AutoTokenizer.from_pretrained(standin(name))
    end = tok.eos_token
    text = "Nim: 12 stones left.\n<think>\nTake 3.\n</think>\n\n<move>3</move>"
    ids = tok(text + end, add_special_tokens=False)["input_ids"]
    assert ids[-1] == tok.eos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    if name.startswith("qwen3"):
        assert len(tok("<think></think>", add_special_tokens=False)["input_ids"]) == 2


def test_llama_adds_bos_and_qwen_does_not(standin):
    llama = AutoTokenizer.from_pretrained(standin("llama-3.1-base"))
    qwen = AutoTokenizer.from_pretrained(standin("qwen2.5-instruct"))
    assert llama("Hi")["input_ids"][0] == llama.bos_token_id
    assert qwen("Hi")["input_ids"] == qwen("Hi", add_special_tokens=False)["input_ids"]


def test_qwen_splits_digits_one_by_one_and_llama_by_threes(standin):
    qwen = AutoTokenizer.from_pretrained(standin("qwen3"))
    llama = AutoTokenizer.from_pretrained(standin("llama-3.1-base"))
    def pieces(tok):
        return [p for p, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("12345")]

    assert pieces(qwen) == ["1", "2", "3", "4", "5"]
    assert pieces(llama) == ["123", "45"]


@pytest.mark.parametrize("name", ["qwen2.5-instruct", "llama-3.1-instruct"])
def test_models_load_and_run(standin, name):
    path = standin(name)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = tok.apply_chat_template(HI, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    logits = model(**ids).logits
    assert logits.shape[-1] == model.config.vocab_size >= len(tok)


def test_cached_build_is_reused_and_keyed_by_options(tmp_path):
    first = ensure_standin("qwen3-base", root=tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_standin("qwen3-base", root=tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    big = BuildOptions(model_vocab=4096)
    assert standin_dir("qwen3-base", big, tmp_path) != first
    assert json.loads((ensure_standin("qwen3-base", big, root=tmp_path) / "config.json").read_text())["vocab_size"] == 4096


def test_unknown_standin_is_a_one_line_error():
    with pytest.raises(ValueError, match="unknown stand-in 'gpt-9'.*known: qwen2.5-instruct"):
        ensure_standin("gpt-9")
