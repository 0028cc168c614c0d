"""The embedded model's tokenizer: a byte-level BPE trained on the build's corpus (digits split
one by one; with ``tokenizer: cells`` one token per board cell, digit and move name), with
``<move>`` / ``</move>`` and the strings a game's text needs as one token added."""

from __future__ import annotations

from typing import Any

from lmselfplay.models.tiny import TinyConfig

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
MOVE_TOKENS = ("<move>", "</move>")


def train_tokenizer(cfg: TinyConfig, texts: list[str], move_names: list[str] = (),
                    whole: list[str] = ()) -> Any:
    """A byte-level BPE (digits split one by one) wrapped as a PreTrainedTokenizerFast.

    ``cfg.tokenizer == "bpe"``: words carry their leading space (GPT-2's split), so a board
    cell ``X`` is ``" X"`` mid-row but ``"X"`` at a row's start. ``"cells"``: every
    whitespace character, punctuation character and digit is a token of its own and BPE
    merges only inside words, so a one-character board cell is one token whatever its
    neighbours, a board row of n cells is always 2n tokens and a cell's distance to the
    answer depends only on the layout; ``move_names`` (every corpus game's move names) are
    added as whole-word tokens, so every move is ONE token (``D4``, ``pass``). With either,
    ``whole`` (the strings a corpus game's text needs as one token: :func:`whole_strings`) are
    added tokens, matched wherever they stand (``1X2_3O`` is three tokens).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    if cfg.tokenizer == "cells":
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\s"), behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Punctuation(behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:  # "bpe" splits every digit; "numbers" keeps a digit run whole, so BPE learns common numbers as one token
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=cfg.tokenizer == "bpe"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(texts, trainer=trainer)
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in MOVE_TOKENS])
    if whole:
        tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in whole])
    if cfg.tokenizer == "cells":
        tk.add_tokens([AddedToken(m, special=False, normalized=False, single_word=True)
                       for m in move_names if len(m) > 1])
    pad, bos, eos = SPECIAL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=bos, eos_token=eos, pad_token=pad,
        padding_side="left", model_max_length=cfg.max_seq_len, clean_up_tokenization_spaces=False)


def move_names(cfg: TinyConfig) -> list[str]:
    """Every move name of the corpus games with enumerable moves (default variants), in
    order of first appearance."""
    from lmselfplay.games.base import has_enumerable_actions

    names: dict[str, None] = {}
    for g in cfg.game_names():
        game = cfg.make_game(g)
        if has_enumerable_actions(game):
            names.update((game.action_text(a), None) for a in range(game.n_actions))
    return list(names)


def whole_strings(cfg: TinyConfig) -> list[str]:
    """The strings the corpus games' texts need as one token each (a game's ``token_strings``:
    the tic-tac-toe cells text's ``1X`` .. ``9O``), in order of first appearance."""
    out: dict[str, None] = {}
    for g in cfg.game_names():
        out.update((t, None) for t in getattr(cfg.make_game(g), "token_strings", ()))
    return list(out)
