"""Stand-in models of the real families users bring: built from config in seconds, never downloaded.

No pretrained weights can be fetched in CI, yet the product is real Hugging Face models. A
stand-in is a randomly initialised 2-layer / 64-wide model of the REAL architecture class with
a tokenizer that behaves like the real one where it matters to this project:

* a byte-level BPE (small vocabulary) trained here on the project's own corpus text, with the
  family's pre-tokenizer split (Qwen: one digit per token; Llama-3: up to three digits);
* the family's special tokens (special ones dropped by ``skip_special_tokens``; Qwen3's
  ``<think>``/``</think>`` are added but NOT special, as in the real tokenizer, so they stay in
  decoded text), its bos/eos/pad (Llama-3.1 has no pad token; Qwen has no bos);
* the real chat template (:mod:`lmselfplay.models.chat_templates`), or none;
* the real ``generation_config.json`` defaults: eos LISTS, ``repetition_penalty``, ``top_k``...

Token ids differ from the real ones (the vocabulary is small); texts and token roles do not.

``ensure_standin(name)`` returns the cached folder (``$LMSELFPLAY_CACHE`` or
``~/.cache/lmselfplay``, under ``standins/<name>-<hash>``), building it once (atomically, one
builder per folder across processes). ``scripts/make_standins.py`` builds them from the shell.
The module lives in the package (not under tests/) because benchmarks and scripts use it too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmselfplay.models import chat_templates

BUILD_VERSION = 1  # bump when the corpus, tokenizer or model code changes what a spec builds

# The pre-tokenizer splits of the real tokenizer.json files.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN2_5_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                   "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                   "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                   "<|image_pad|>", "<|video_pad|>")
QWEN_LISTED = QWEN2_5_SPECIAL[1:]  # all but <|endoftext|>, as Qwen's tokenizer_config lists them
QWEN2_5_ADDED = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                 "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
QWEN3_ADDED = QWEN2_5_ADDED + ("<tool_response>", "</tool_response>", "<think>", "</think>")
LLAMA3_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                  "<|python_tag|>")


@dataclass(frozen=True)
class StandinSpec:
    """What a stand-in is built from. Token fields are token TEXTS (ids are assigned here)."""
    name: str
    family: str  # the real model it stands in for (documentation)
    architecture: str  # qwen2 | qwen3 | llama
    special_tokens: tuple[str, ...]
    added_tokens: tuple[str, ...] = ()  # added, not special: kept by skip_special_tokens
    split: str = QWEN_SPLIT
    bos: str | None = None
    eos: str = "<|endoftext|>"
    pad: str | None = None
    add_bos: bool = False  # the tokenizer puts BOS in front with add_special_tokens=True
    # tokenizer_config's additional_special_tokens (Qwen lists its specials; Llama-3 does not)
    listed_specials: tuple[str, ...] = ()
    chat_template: str | None = None
    # generation_config.json; "eos_token_id"/"bos_token_id"/"pad_token_id" hold token texts
    generation: dict[str, Any] = field(default_factory=dict)
    config_eos: tuple[str, ...] = ()  # config.json eos_token_id (a list when more than one)


QWEN_INSTRUCT_GEN = {"bos_token_id": "<|endoftext|>", "pad_token_id": "<|endoftext|>",
                     "eos_token_id": ["<|im_end|>", "<|endoftext|>"], "do_sample": True,
                     "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20}
QWEN3_GEN = {"bos_token_id": "<|endoftext|>", "pad_token_id": "<|endoftext|>",
             "eos_token_id": ["<|im_end|>", "<|endoftext|>"], "do_sample": True,
             "temperature": 0.6, "top_p": 0.95, "top_k": 20}
QWEN_BASE_GEN = {"bos_token_id": "<|endoftext|>", "eos_token_id": "<|endoftext|>", "do_sample": False,
                 "max_new_tokens": 2048}
LLAMA3_1_INSTRUCT_GEN = {"bos_token_id": "<|begin_of_text|>",
                         "eos_token_id": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
                         "do_sample": True, "temperature": 0.6, "top_p": 0.9}
LLAMA3_1_BASE_GEN = {"bos_token_id": "<|begin_of_text|>", "eos_token_id": "<|end_of_text|>",
                     "do_sample": True, "temperature": 0.6, "top_p": 0.9}


def _qwen(name: str, family: str, architecture: str, added: tuple[str, ...], eos: str, template: str,
          generation: dict[str, Any]) -> StandinSpec:
    """A Qwen family's spec: Qwen's specials, all listed in tokenizer_config; pad <|endoftext|>;
    config.json's eos is the tokenizer's."""
    return StandinSpec(name, family, architecture, QWEN2_5_SPECIAL, added, eos=eos, pad="<|endoftext|>",
                       chat_template=template, listed_specials=QWEN_LISTED, generation=generation,
                       config_eos=(eos,))


SPECS: dict[str, StandinSpec] = {s.name: s for s in (
    _qwen("qwen2.5-instruct", "Qwen/Qwen2.5-7B-Instruct", "qwen2", QWEN2_5_ADDED, "<|im_end|>",
          chat_templates.QWEN2_5, QWEN_INSTRUCT_GEN),
    _qwen("qwen3", "Qwen/Qwen3-4B", "qwen3", QWEN3_ADDED, "<|im_end|>", chat_templates.QWEN3, QWEN3_GEN),
    _qwen("qwen3-base", "Qwen/Qwen3-4B-Base", "qwen3", QWEN3_ADDED, "<|endoftext|>", chat_templates.QWEN3,
          QWEN_BASE_GEN),
    _qwen("qwen2.5-coder-base", "Qwen/Qwen2.5-Coder-7B", "qwen2", QWEN2_5_ADDED, "<|endoftext|>",
          chat_templates.QWEN2_5, QWEN_BASE_GEN),
    StandinSpec("llama-3.1-base", "meta-llama/Llama-3.1-8B", "llama", LLAMA3_SPECIAL, split=LLAMA3_SPLIT,
                bos="<|begin_of_text|>", eos="<|end_of_text|>", add_bos=True,
                generation=LLAMA3_1_BASE_GEN, config_eos=("<|end_of_text|>",)),
    StandinSpec("llama-3.1-instruct", "meta-llama/Llama-3.1-8B-Instruct", "llama", LLAMA3_SPECIAL,
                split=LLAMA3_SPLIT, bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True,
                chat_template=chat_templates.LLAMA3_1, generation=LLAMA3_1_INSTRUCT_GEN,
                config_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")),
)}
STANDINS: tuple[str, ...] = tuple(SPECS)


@dataclass(frozen=True)
class BuildOptions:
    """Sizes of a build (the defaults are the test fixtures')."""
    seed: int = 0
    layers: int = 2
    hidden_size: int = 64
    bpe_vocab: int = 1024  # BPE merges + the 256 byte symbols, before the family's tokens
    model_vocab: int | None = None  # embedding rows (>= tokenizer size): memory benchmarks pass 150k
    corpus_texts: int = 1500
    # Weight init std: 0.2 gives peaked, varied next-token distributions, as a trained model's
    # are (HF's 0.02 gives a near-uniform model that repeats one token, hiding sampling bugs).
    init_std: float = 0.2


def spec(name: str) -> StandinSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown stand-in {name!r}; known: {', '.join(STANDINS)}") from None


def build_key(s: StandinSpec, opts: BuildOptions) -> str:
    d = {"spec": dataclasses.asdict(s), "opts": dataclasses.asdict(opts), "version": BUILD_VERSION}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def standin_dir(name: str, opts: BuildOptions = BuildOptions(), root: str | Path | None = None) -> Path:
    from lmselfplay.models.cache import cache_root

    base = Path(root) if root is not None else cache_root() / "standins"
    return base / f"{name}-{build_key(spec(name), opts)}"


def ensure_standin(name: str, opts: BuildOptions = BuildOptions(), root: str | Path | None = None,
                   force: bool = False) -> Path:
    """The folder of stand-in ``name`` (a normal HF model folder), built now unless cached."""
    from lmselfplay.models.cache import build_lock
    from lmselfplay.utils.checkpoint import atomic_dir

    path = standin_dir(name, opts, root)
    if (path / "config.json").is_file() and not force:
        return path
    with build_lock(path):
        if (path / "config.json").is_file() and not force:  # built by another process meanwhile
            return path
        for stale in path.parent.glob(f".{path.name}.tmp-*"):  # left by a killed build
            shutil.rmtree(stale, ignore_errors=True)
        with atomic_dir(path) as tmp:
            build_standin(spec(name), opts, tmp)
    return path


# --- tokenizer ------------------------------------------------------------------------

def corpus_texts(n: int, seed: int = 0) -> list[str]:
    """Text the repo generates (game turns, word problems, programs) plus chat-shaped prose,
    for training the BPE: the merges then fit what the tests and recipes feed the model."""
    from lmselfplay.games import make
    from lmselfplay.models import corpus as st
    from lmselfplay.tasks.arithmetic import arithmetic_problem, arithmetic_prompt
    from lmselfplay.tasks.programs import program_output_prompt, python_program

    rng = random.Random(seed)
    games = [make(g) for g in ("nim", "tictactoe", "kuhn_poker")]
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            p = arithmetic_problem(rng)
            out.append(f"{arithmetic_prompt(p)}\n{p['answer']}")
        elif kind == 1:
            t = python_program(rng)
            out.append(f"{program_output_prompt(t)}\n{t['output']}\n{t['code']}")
        elif kind == 2:
            for prompt, answer in st.game_turns(rng.choice(games), rng, 2):
                out.append(f"{prompt}\n<think>\nI pick a legal move.\n</think>\n\n{answer}")
        else:
            out.append("You are a helpful assistant. Answer the question. The answer is \\boxed{"
                       f"{rng.randint(0, 99)}" "}. def f(x):\n    return x\n")
    return out


def build_tokenizer(s: StandinSpec, opts: BuildOptions) -> Any:
    """A fast tokenizer with the family's split, special tokens, roles and chat template."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if s.architecture.startswith("qwen"):
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(s.split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=opts.bpe_vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus_texts(opts.corpus_texts, opts.seed), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in s.special_tokens])
    if s.added_tokens:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in s.added_tokens])
    if s.add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{s.bos} $A", pair=f"{s.bos} $A {s.bos} $B", special_tokens=[(s.bos, tok.token_to_id(s.bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=s.bos, eos_token=s.eos, pad_token=s.pad,
                                   additional_special_tokens=list(s.listed_specials) or None,
                                   clean_up_tokenization_spaces=False, model_max_length=32768)
    if s.chat_template:
        fast.chat_template = s.chat_template
    return fast


# --- model ------------------------------------------------------------------------------

def _token_ids(tok: Any, value: Any) -> Any:
    if isinstance(value, list):
        return [tok.convert_tokens_to_ids(v) for v in value]
    return tok.convert_tokens_to_ids(value) if isinstance(value, str) else value


def build_model(s: StandinSpec, opts: BuildOptions, tok: Any) -> Any:
    """A randomly initialised model of the real architecture class, ids from ``tok``."""
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
               "llama": (LlamaConfig, LlamaForCausalLM)}
    config_cls, model_cls = classes[s.architecture]
    vocab = max(len(tok), opts.model_vocab or 0)
    eos = [tok.convert_tokens_to_ids(t) for t in s.config_eos]
    cfg = config_cls(vocab_size=vocab, hidden_size=opts.hidden_size, intermediate_size=2 * opts.hidden_size,
                     num_hidden_layers=opts.layers, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=opts.hidden_size // 4, max_position_embeddings=4096,
                     tie_word_embeddings=s.architecture != "llama", initializer_range=opts.init_std,
                     bos_token_id=_token_ids(tok, s.bos or s.generation.get("bos_token_id")),
                     eos_token_id=eos[0] if len(eos) == 1 else eos,
                     pad_token_id=tok.pad_token_id)
    torch.manual_seed(opts.seed)
    model = model_cls(cfg)
    model.generation_config = GenerationConfig(**{k: _token_ids(tok, v) for k, v in s.generation.items()})
    return model


def build_standin(s: StandinSpec, opts: BuildOptions, out: str | Path) -> Path:
    """Write the stand-in's model folder (weights, config, generation_config, tokenizer) to ``out``."""
    out = Path(out)
    tok = build_tokenizer(s, opts)
    model = build_model(s, opts, tok)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "standin.json").write_text(json.dumps(
        {"name": s.name, "stands_in_for": s.family, "build": dataclasses.asdict(opts),
         "key": build_key(s, opts)}, indent=2))
    return out
