"""The embedded default model: a byte-level BPE tokenizer and a small (0.5-1.2M-parameter) Llama,
built offline on CPU from the project's own synthetic corpus, deterministic from a seed.

Why it exists: every recipe must run on a laptop with no download. ``ensure_tiny_model()``
returns the cached build (``$LMSELFPLAY_CACHE`` or ``~/.cache/lmselfplay``, one folder per
config hash) or builds it (a few minutes on 2 cores) and writes it atomically, so a killed
build never leaves half a model; its training state is saved every ``checkpoint_every``
steps, so the next call continues a killed build where it stopped, to the same weights.
Builds are named (:data:`BUILDS`, ``lmselfplay bootstrap --build v4``): v7, the shipped
default, is the shape probe's winner, a 2-layer Llama that reads tic-tac-toe's cells text
(``game_params``: a build's game texts, recorded in its config.json and read back by
:func:`~lmselfplay.games.model_texts.make_game_for`); v6 is v3 (the corpus below, from scratch) trained further on a mix
heavy in arithmetic word problems; v4 reads with the "cells" tokenizer (one token per board
cell, digit and move name) and adds board-reading and judge-format tasks to the corpus. The result is a normal Hugging Face folder:
``AutoModelForCausalLM.from_pretrained(path)`` / ``AutoTokenizer.from_pretrained(path)``.

The default config's build also ships inside the package (``lmselfplay/models/embedded/``, a
few MB, written by ``scripts/ship_embedded_model.py``): when its key equals the requested
config's, ``ensure_tiny_model()`` copies it into the cache (atomically, checksums verified)
instead of building, so a first run starts at once. Any other key (a changed corpus or
config) is built as before; the shipped copy is only ever used for its own key.

The corpus (see :mod:`lmselfplay.models.corpus`):

* turns of uniformly RANDOM legal play of every game, in the exact text protocol — a
  uniform prior like AlphaZero's generation 0, so self-play has room to improve;
* arithmetic word problems with worked answers ending in ``#### N`` (and, for R-Zero's
  challenger, writing such a problem);
* tiny Python programs: predict ``repr(f(x))``, and write an ``f`` for an input/output pair;
* reading: "repeat line k" of a game observation, so that moves can depend on the state
  (:func:`lmselfplay.models.corpus.reading_task`).

Every example is tokenized with THE formatter (:func:`lmselfplay.lm.prompt.encode_prompt` +
:func:`~lmselfplay.lm.prompt.encode_completion`), so pre-training sees exactly the token
sequences that generation will see. The loss is on the answer tokens (the prompt tokens
get ``prompt_loss_weight``); at the move token of a game turn the target is the uniform
distribution over ALL legal moves (:func:`soft_target`), i.e. the random prior itself
rather than one sample of it, which is what makes >= 95% legal moves cheap to learn.
``<move>`` and ``</move>`` are added (non-special) tokens and digits are split one by
one, so every tic-tac-toe/Nim move name is ONE token (Kuhn's ``pass``/``bet`` are single
BPE tokens at the default vocabulary size): no illegal move from a name split in two.

This module is the builds' registry (:data:`BUILDS`, :class:`TinyConfig`, its cache key); the
tokenizer is :mod:`lmselfplay.models.tokenizer`, the corpus stream and pre-training loop
:mod:`lmselfplay.models.pretrain`, the cache, lock and shipped copy :mod:`lmselfplay.models.cache`,
the game texts a build records :mod:`lmselfplay.games.model_texts`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from lmselfplay.games.model_texts import parse_game_params

# Bump when the corpus, tokenizer or training code changes what a config builds.
BUILD_VERSION = 3  # 2: reading tasks; 3: soft targets along multi-token moves, Go, Taboo
INFO_FILE = "tiny_build.json"
NON_SEMANTIC = ("num_threads", "checkpoint_every")  # fields that do not enter the cache key
# Fields added after builds shipped: they enter the key only when set away from these values,
# so every earlier key (and the shipped build) stays valid.
LATER_FIELDS = {"tokenizer": "bpe", "continue_from": "", "game_params": "", "exclude_heldout": False}
# What a continued build takes from the build it continues (see TinyConfig.continue_from).
INHERITED = ("num_layers", "hidden_size", "num_heads", "intermediate_size", "max_seq_len",
             "vocab_size", "tokenizer", "tokenizer_texts", "game_params")
TOKENIZERS = ("bpe", "cells", "numbers")


# Named builds: the fields each one sets on top of TinyConfig's defaults (v3's from-scratch
# settings). v4: the "cells" tokenizer (one token per board cell, digit and move name),
# reading targets on the board (grid_reading), more arithmetic and program tasks and the
# judge's two-option questions; 2,400 steps fit the 60-minute build limit with its longer
# cell-token sequences. docs/embedded_model.md compares the builds.
BUILDS: dict[str, dict[str, Any]] = {
    "v3": {},
    "v4": {"tokenizer": "cells", "train_steps": 2400, "num_threads": 2,
           "task_weights": "tictactoe=8,reading=3,grid_reading=4,arithmetic=3,programs=3,two_option=2"},
    # v5 and v6: v3's weights and tokenizer, then more steps of the same game turns and
    # reading beside arithmetic word problems, programs and the judge's A/B questions; the
    # games stay at the random prior (docs/embedded_model.md). v5 weighs arithmetic most;
    # v6 gives the reading questions and Kuhn turns more share.
    "v5": {"continue_from": "v3", "train_steps": 2000, "lr": 1e-3, "num_threads": 2,
           "task_weights": "tictactoe=8,reading=3,arithmetic=20,programs=5,two_option=2"},
    "v6": {"continue_from": "v3", "train_steps": 2400, "lr": 1e-3, "num_threads": 2,
           "task_weights": "tictactoe=8,reading=6,kuhn_poker=3,arithmetic=20,programs=4,two_option=2"},
    # v7: the shape probe's winner, a Llama of 2 layers x 128 with 8 heads and an MLP
    # of twice the width, from scratch; tic-tac-toe's cells text (one token per cell that names
    # it: "5X"), whose 27 cell strings the tokenizer holds as one token each, and board-reading
    # questions on those cells (grid_reading) beside v6's mix. docs/embedded_model.md.
    "v7": {"num_layers": 2, "num_heads": 8, "intermediate_size": 256, "game_params": "tictactoe.board=cells",
           "train_steps": 2000, "num_threads": 1,
           "task_weights": "tictactoe=8,reading=6,grid_reading=4,kuhn_poker=3,arithmetic=20,programs=4,two_option=2"},
    # v8, the language recipes' build: v7's shape, numbers as whole tokens (the tokenizer probe:
    # word problems learned faster from scratch than with split digits), a corpus of word problems,
    # programs, the judge's A/B questions and the reasoning suite's tasks at training seeds, never a
    # held-out question; Nim only, so reading tasks have a game to read.
    "v8": {"num_layers": 2, "num_heads": 8, "intermediate_size": 256, "tokenizer": "numbers", "games": "nim",
           "train_steps": 2000, "num_threads": 1, "exclude_heldout": True,
           "task_weights": "nim=1,reading=1,arithmetic=20,programs=6,two_option=3,reasoning_gym=8"},
    # v8sums: v8 continued on v8's mix with the request for a sum of three one-digit numbers
    # beside it, so that R-Zero's challenger can write the questions of the positive control's
    # family (task_form: sum).
    "v8sums": {"continue_from": "v8", "num_layers": 2, "num_heads": 8, "intermediate_size": 256,
               "tokenizer": "numbers", "games": "nim", "train_steps": 300, "lr": 1e-3, "warmup_steps": 20,
               "num_threads": 1, "exclude_heldout": True,
               "task_weights": "nim=1,reading=1,arithmetic=20,programs=6,two_option=3,reasoning_gym=8,sum_writing=3"},
}


# What every recipe loads when no model is named; it ships in the package: v7, the build whose
# tic-tac-toe can be learned (docs/embedded_model.md).
DEFAULT_BUILD = "v7"


def build_config(build: str = DEFAULT_BUILD, **overrides: Any) -> TinyConfig:
    """The TinyConfig of a named build (:data:`BUILDS`), with ``overrides`` on top."""
    if build not in BUILDS:
        raise ValueError(f"unknown build {build!r}; known: {list(BUILDS)}")
    return TinyConfig(**(BUILDS[build] | overrides))


@dataclass
class TinyConfig:
    seed: int = 0
    # architecture (LlamaConfig); 4 x 128 was the best measured per token budget
    num_layers: int = 4
    hidden_size: int = 128
    num_heads: int = 4
    intermediate_size: int = 512
    max_seq_len: int = 512  # a 9x9 Go turn is up to ~480 tokens (the legal list)
    vocab_size: int = 1024  # BPE merges + bytes + special tokens (before the 2 move tokens)
    # training
    train_steps: int = 1100
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    prompt_loss_weight: float = 0.0
    # corpus games: pinned, so registering a new game does not silently change the default
    # build (its cache key); "all" = every registered game with enumerable moves
    games: str = "nim,nim_misere,tictactoe,kuhn_poker,go9,taboo"
    # relative sampling weights; unlisted games weigh 1
    task_weights: str = "tictactoe=8,reading=3"
    nim_max_start: int = 31  # games with a `start` parameter get random starts 1..this
    tokenizer_texts: int = 6000  # examples the BPE is trained on
    # "bpe": byte-level BPE (words glue their leading space: " X" and "X" differ);
    # "cells": every whitespace and punctuation character and every digit is its own token,
    # and every move name of the corpus games is one token (see train_tokenizer);
    # "numbers": as "bpe", but a run of digits is one pre-token, so frequent numbers are one token
    tokenizer: str = "bpe"
    # "": train tokenizer and weights from scratch; a build name (BUILDS): start from that
    # build's tokenizer and weights (built or installed first) and train train_steps more on
    # this config's corpus, with a fresh optimizer and schedule; INHERITED fields must match it
    continue_from: str = ""
    # a resumable build saves its state every this many steps (not in the cache key)
    checkpoint_every: int = 100
    # torch threads while building (not in the cache key; 1 = reproducible, and faster than 2
    # on a shared 2-core machine: 8k vs 3.6k tok/s measured with one core busy elsewhere)
    num_threads: int = 1
    # true: the corpus never draws a question of the held-out split (lmselfplay.tasks.task_sets:
    # the held-out bucket of word problems and programs, the reasoning suite's questions)
    exclude_heldout: bool = False
    # parameters of the corpus games' texts, "game.param=value" comma-separated
    # ("tictactoe.board=cells": v7's named-cell board); recorded in the model's config.json
    # (GAME_PARAMS_ATTR) so that recipes and evaluations make the games with them
    game_params: str = ""

    def game_kwargs(self) -> dict[str, dict[str, str]]:
        """``game_params`` as ``{game: {param: value}}`` (values are strings)."""
        return parse_game_params(self.game_params)

    def make_game(self, name: str, **extra: Any) -> Any:
        """The registry's game ``name`` with this config's parameters for it (and ``extra``)."""
        from lmselfplay import games

        return games.make(name, **self.game_kwargs().get(name, {}), **extra)

    def game_names(self) -> list[str]:
        from lmselfplay.games import REGISTRY

        if self.games.strip() == "all":  # free-text games need scripted players for their turns
            return [g for g, f in REGISTRY.items()
                    if getattr(f, "action_space", "discrete") != "text" or hasattr(f, "scripted_action")]
        names = [g.strip() for g in self.games.split(",") if g.strip()]
        unknown = [g for g in names if g not in REGISTRY]
        if unknown:
            raise ValueError(f"unknown game(s) {unknown} in TinyConfig.games; known: {list(REGISTRY)}")
        return names

    def weights(self) -> dict[str, float]:
        """Sampling weight of every task kind (games by name, 'arithmetic', 'programs',
        'reading': a line-copy question about a random game's observation; 'grid_reading':
        a cell / line question about a board game's board and 'two_option': a judge-format
        A/B question, both weight 0 unless given)."""
        from lmselfplay.utils.config import parse_weights

        kinds = {g: 1.0 for g in self.game_names()} | {"arithmetic": 1.0, "programs": 1.0, "reading": 1.0}
        kinds["grid_reading"] = 0.0  # a lever (corpus.grid_reading_task), off in the default build
        kinds["two_option"] = 0.0  # corpus.two_option_task, off in the default build
        kinds["reasoning_gym"] = 0.0  # the reasoning suite's tasks at training seeds, <answer> format
        kinds["sum_writing"] = 0.0  # "Write a sum of three one-digit numbers." -> "4 + 3 - 2"
        return parse_weights(self.task_weights, kinds, "task_weights")

    def key(self) -> str:
        """Short hash of everything that changes the built model."""
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {self.tokenizer!r}; known: {list(TOKENIZERS)}")
        d = {k: v for k, v in dataclasses.asdict(self).items()
             if k not in NON_SEMANTIC and LATER_FIELDS.get(k, object()) != v}
        d["games"] = self.game_names()
        d["build_version"] = BUILD_VERSION
        if self.continue_from:
            d["continue_from"] = self.base_config().key()
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    def base_config(self) -> TinyConfig:
        """The config of the build this one continues (``continue_from``), after checking
        that every INHERITED field agrees with it: a continued build cannot change them."""
        base = build_config(self.continue_from)
        differ = [f for f in INHERITED if getattr(self, f) != getattr(base, f)]
        if differ:
            raise ValueError(f"a build continuing {self.continue_from!r} takes its {', '.join(differ)} "
                             f"from it; leave them at {[getattr(base, f) for f in differ]}")
        return base
