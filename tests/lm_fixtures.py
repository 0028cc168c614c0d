"""A random tiny Llama + byte-level BPE tokenizer built from config in a second (no hub)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from lmselfplay.games import make
    from lmselfplay.games.base import random_playout

    texts = []
    for name in ("nim", "tictactoe", "kuhn_poker"):
        g = make(name)
        for s in random_playout(g, 0):
            if g.current_player(s) >= 0:
                texts.append(g.observation_text(s, g.current_player(s)) + "\nAnswer:\n<move>1</move>")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts * 3, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.padding_side = "left"
    return fast


def tiny_model(seed: int = 0, layers: int = 2, width: int = 32):
    # a 1024-token context: the recipes' longest prompts in this coarse tokenizer (a 9x9 Go turn, ~560
    # tokens) fit, so the engines answer them (rotary positions: the context changes no weight)
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=1024, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(cfg)


# the trainer settings the unit tests compute losses by hand against: one PPO pass, no gradient
# clipping, no merging of identical samples, no KL unless asked (and a learning rate that moves a tiny model)
UNIT_TRAINER = {"learning_rate": 1e-2, "beta": 0.0, "num_iterations": 1, "max_grad_norm": 0.0,
                "merge_identical": False}


def tiny_trainer(model=None, total_steps=200, target_loss=None, surrogate="ppo", **cfg):
    """A ``PolicyTrainer`` on ``model`` (default: a fresh tiny model of seed 0) with
    :data:`UNIT_TRAINER`'s settings, ``cfg`` adding or overriding ``TrainerConfig`` fields;
    ``total_steps`` is the length of its learning-rate schedule (a recipe's loop length),
    ``target_loss`` / ``surrogate`` its optional terms (``"ppo"``: the default surrogate)."""
    from lmselfplay.rl.trainer import PPO_SURROGATE, PolicyTrainer, TrainerConfig

    return PolicyTrainer(model if model is not None else tiny_model(seed=0), tiny_tokenizer(),
                         TrainerConfig(**{**UNIT_TRAINER, **cfg}), total_steps=total_steps,
                         target_loss=target_loss, surrogate=PPO_SURROGATE if surrogate == "ppo" else surrogate)


def save_tiny(path, seed: int = 0):
    """A model dir (weights + tokenizer) loadable with from_pretrained, as recipes expect."""
    tiny_model(seed=seed).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def saved_weights(path):
    """The state dict of a model folder a recipe saved (its ``final_model``, say)."""
    from transformers import AutoModelForCausalLM

    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}
