"""Generation and prompting on stand-ins of the real families: end of turn, the sampling
distribution, thinking, base vs chat prompts (each a defect real models exposed)."""

from __future__ import annotations

import pytest
import torch

from lmselfplay.games.base import Invalid
from lmselfplay.games.text import extract_move, visible_answer_text
from lmselfplay.lm.engines.base import SamplingParams, completion_length
from lmselfplay.lm.engines.hf import HFEngine, StopAfterThink
from lmselfplay.lm.prompt import (
    PromptStyle,
    encode_completion,
    encode_prompt,
    format_prompt,
    set_prompt_style,
)
from lmselfplay.models.policy import PolicyConfig, load_policy, load_tokenizer

PROMPTS = [f"Nim: {n} stones left. Take 1, 2 or 3. Answer with <move>N</move>." for n in range(1, 9)]


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: more threads only contend
    yield
    torch.set_num_threads(n)


def policy(standin, name, **kw):
    return load_policy(PolicyConfig(model_name_or_path=str(standin(name)), dtype="float32", **kw), device="cpu")


def force_token(model, token_id: int, bias: float = 100.0) -> None:
    """Make ``token_id`` the model's argmax everywhere (an output bias on an untied head)."""
    head = model.lm_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    biased.weight = head.weight
    with torch.no_grad():
        biased.bias.zero_()
        biased.bias[token_id] = bias
    model.lm_head = biased


# --- end of turn ------------------------------------------------------------------------

@pytest.mark.parametrize("name,end", [("llama-3.1-instruct", "<|eom_id|>"), ("llama-3.1-instruct", "<|end_of_text|>"),
                                      ("qwen2.5-instruct", "<|endoftext|>")])
def test_generation_stops_at_every_declared_end_token(standin, name, end):
    """generation_config's eos LIST ends a turn, not only the tokenizer's one eos."""
    model, tok = policy(standin, name)
    force_token(model, tok.convert_tokens_to_ids(end))
    eng = HFEngine(model, tok)
    out = eng.generate([encode_prompt(tok, PROMPTS[0])], SamplingParams(max_new_tokens=12, temperature=0.0))[0]
    assert out.token_ids == [tok.convert_tokens_to_ids(end)] and out.finish_reason == "eos"


def test_a_base_model_stops_at_the_templates_end_of_turn(standin):
    model, tok = policy(standin, "qwen2.5-coder-base", prompt_format="chat")
    force_token(model, tok.convert_tokens_to_ids("<|im_end|>"))
    out = HFEngine(model, tok).generate([encode_prompt(tok, "Hi")], SamplingParams(max_new_tokens=8, temperature=0))[0]
    assert out.finish_reason == "eos" and len(out.token_ids) == 1


def test_the_cut_rule_takes_any_end_token(standin):
    tok = load_tokenizer(str(standin("llama-3.1-instruct")))
    ids = tok("ab", add_special_tokens=False)["input_ids"]
    eom, eot = tok.convert_tokens_to_ids(["<|eom_id|>", "<|eot_id|>"])
    assert completion_length(tok, ids + [eom, 5, eot], [eot, eom], []) == (len(ids) + 1, "eos")
    assert completion_length(tok, ids + [eom, 5], eot, []) == (len(ids) + 2, "length")


@pytest.mark.parametrize("name,expected", [
    ("qwen2.5-instruct", "Hello.<|im_end|>"),
    ("llama-3.1-instruct", "Hello.<|eot_id|>"),
    ("qwen3", "<think>\n\n</think>\n\nHello.<|im_end|>"),
    ("qwen3-base", "Hello.<|endoftext|>"),  # plain prompts: the eos ends the answer
    ("llama-3.1-base", "Hello.<|end_of_text|>"),
])
def test_training_answers_end_with_the_templates_end_of_turn(standin, name, expected):
    tok = load_tokenizer(str(standin(name)))
    assert tok.decode(encode_completion(tok, "Hello.")) == expected


def test_a_chat_prompted_base_model_is_trained_to_end_with_im_end_not_endoftext(standin):
    tok = load_tokenizer(str(standin("qwen3-base")), PromptStyle("chat", enable_thinking=False))
    ids = encode_completion(tok, "Hello.")
    assert tok.convert_ids_to_tokens(ids[-1]) == "<|im_end|>" and tok.decode(ids) == "Hello.<|im_end|>"


# --- the sampling distribution ------------------------------------------------------------

def test_greedy_tokens_are_the_argmax_and_logprobs_the_teacher_forced_ones(standin):
    """The Qwen2.5 stand-in declares repetition_penalty 1.05 / top_k 20 / top_p 0.8: none may
    shape the tokens, whose log-probs are the model's own."""
    model, tok = policy(standin, "qwen2.5-instruct")
    eng = HFEngine(model, tok)
    prompts = [encode_prompt(tok, p) for p in PROMPTS]
    outs = eng.generate(prompts, SamplingParams(max_new_tokens=40, temperature=0.0))
    differ = total = 0
    for o in outs:
        with torch.no_grad():
            logits = model(torch.tensor([o.prompt_ids + o.token_ids])).logits[0]
        argmax = logits[len(o.prompt_ids) - 1 : -1].argmax(-1).tolist()
        differ += sum(a != b for a, b in zip(argmax, o.token_ids))
        total += len(o.token_ids)
    assert total >= 200 and differ == 0
    assert len({t for o in outs for t in o.token_ids}) > 10  # varied text, not one repeated token
    for temperature in (0.0, 1.0, 0.7):
        outs = eng.generate(prompts, SamplingParams(max_new_tokens=24, temperature=temperature, top_p=0.9, seed=1))
        scored = eng.score([o.prompt_ids for o in outs], [o.token_ids for o in outs],
                           temperature=temperature if temperature > 0 else 1.0)
        for o, s in zip(outs, scored):
            assert o.logprobs == pytest.approx(s, abs=1e-4)


def test_model_generation_defaults_never_apply(standin):
    """A generation_config that would force one token (suppress all others) changes nothing."""
    model, tok = policy(standin, "qwen2.5-instruct")
    vocab = model.config.vocab_size
    model.generation_config.suppress_tokens = list(range(1, vocab))
    model.generation_config.min_new_tokens = 30
    eng = HFEngine(model, tok)
    outs = eng.generate([encode_prompt(tok, p) for p in PROMPTS[:4]],
                        SamplingParams(max_new_tokens=20, temperature=1.0, seed=0))
    assert len({t for o in outs for t in o.token_ids}) > 5
    assert model.generation_config.suppress_tokens == list(range(1, vocab))  # restored afterwards


def test_generation_keeps_no_logits(standin, monkeypatch):
    """Behaviour log-probs are gathered per step: generate is never asked for its logits."""
    model, tok = policy(standin, "qwen2.5-instruct")
    seen = []
    original = type(model).generate

    def spy(self, *args, **kwargs):
        gc = kwargs.get("generation_config")
        seen.append((kwargs.get("output_logits"), kwargs.get("output_scores"), gc and gc.output_logits,
                     gc and gc.output_scores))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "generate", spy)
    HFEngine(model, tok).generate([encode_prompt(tok, PROMPTS[0])], SamplingParams(max_new_tokens=4))
    assert seen and all(not any(flags) for flags in seen)


# --- thinking -----------------------------------------------------------------------------

@pytest.mark.parametrize("text,visible", [
    ("<move>1</move>", "<move>1</move>"),
    ("<think>a <move>1</move></think><move>2</move>", "<move>2</move>"),
    ("<think>a <move>1</move>", None),
    ("<think>a</think> b <think>c", None),
    ("<think>a</think>b<think>c</think>d", "d"),
])
def test_visible_answer_text(text, visible):
    assert visible_answer_text(text) == visible


def test_answers_are_read_after_the_think_block_and_the_last_wins():
    from lmselfplay.verifiers.answers import extract_boxed, extract_final, extract_tag
    from lmselfplay.verifiers.code_tasks import parse_answer
    from lmselfplay.verifiers.referees import program_answer

    assert extract_move("<think>maybe <move>1</move></think>\n\n<move>2</move>") == "2"
    assert isinstance(extract_move("<think>maybe <move>1</move>"), Invalid)
    assert extract_tag("<think><answer>1</answer>") is None
    assert extract_boxed("<think>so \\boxed{3}") is None  # R-Zero's unclosed think
    assert extract_final("<think>\\boxed{3}</think> #### 4") == "4"
    assert program_answer("<think>\n7\n") is None
    assert parse_answer("deduction", "<answer>1</answer> wait, <answer>2</answer>") == (2, None)
    assert parse_answer("deduction", "<think><answer>1</answer>")[0] is None


def test_stop_strings_apply_only_after_the_think_block(standin):
    tok = load_tokenizer(str(standin("qwen3")))
    text = "<think>\nI could say <move>1</move> but\n</think>\n\n<move>2</move> and more"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    n, reason = completion_length(tok, ids, None, ["</move>"])
    assert reason == "stop" and tok.decode(ids[:n]).endswith("<move>2</move>")
    crit = StopAfterThink(tok, ["</move>"])
    fired = [bool(crit(torch.tensor([ids[: k + 1]]), None)[0]) for k in range(len(ids))]
    assert fired.index(True) == n - 1


@pytest.mark.parametrize("thinking,tail", [(None, "<|im_start|>assistant\n"),
                                           (False, "<|im_start|>assistant\n<think>\n\n</think>\n\n")])
def test_policy_options_reach_the_template(standin, thinking, tail):
    _, tok = policy(standin, "qwen3", enable_thinking=thinking, system_prompt="Play well.")
    text = format_prompt(tok, "Hi")
    assert text == "<|im_start|>system\nPlay well.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" + tail


# --- base vs chat -------------------------------------------------------------------------

@pytest.mark.parametrize("name,fmt", [("qwen2.5-instruct", "chat"), ("qwen3", "chat"), ("llama-3.1-instruct", "chat"),
                                      ("qwen3-base", "plain"), ("qwen2.5-coder-base", "plain"),
                                      ("llama-3.1-base", "plain")])
def test_auto_prompt_format(standin, name, fmt):
    tok = load_tokenizer(str(standin(name)))
    text = format_prompt(tok, "Hi")
    assert (text == "Hi\nAnswer:\n") is (fmt == "plain")
    if fmt == "plain":
        bos = tok.bos_token_id
        assert encode_prompt(tok, "Hi")[:1] == ([bos] if bos is not None else tok("Hi")["input_ids"][:1])


def test_prompt_format_chat_needs_a_template(standin):
    from lmselfplay.utils.errors import UserError

    tok = load_tokenizer(str(standin("llama-3.1-base")))
    with pytest.raises(UserError, match="no chat template"):
        set_prompt_style(tok, PromptStyle("chat"))
    with pytest.raises(UserError, match="prompt_format 'html'"):
        set_prompt_style(tok, PromptStyle("html"))


def test_engines_that_load_the_model_themselves_read_its_end_tokens_and_think_rule(standin):
    """vLLM engines get every declared end token from the folder, and hand vLLM no stop
    strings when the policy thinks (they are cut afterwards, after </think>)."""
    from lmselfplay.lm.engines.base import end_token_ids, native_stops

    llama = load_tokenizer(str(standin("llama-3.1-instruct")))
    assert set(llama.convert_ids_to_tokens(end_token_ids(llama))) == {"<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"}
    sp = SamplingParams(stop=["</move>"])
    assert native_stops(load_tokenizer(str(standin("qwen3"))), sp) is None
    assert native_stops(load_tokenizer(str(standin("qwen3")), PromptStyle(enable_thinking=False)), sp) == ["</move>"]
    assert native_stops(load_tokenizer(str(standin("qwen2.5-instruct"))), sp) == ["</move>"]
