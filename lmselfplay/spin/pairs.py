"""The supervised pairs in tokens, and the run's data sets on disk.

THE formatter (:func:`tokenize_pairs`): generation prompts come from
:func:`~lmselfplay.lm.prompt.encode_prompt` and data answers from
:func:`~lmselfplay.lm.prompt.encode_completion` (+EOS); the same ids are what ``DPOTrainer``
trains on (uclaml/SPIN#33). The supervised train / held-out sets are drawn once and saved with the
run (``data/``, :func:`supervised_data`), so a resume sees the same sets; every data set folder
is written atomically by the main process (:func:`save_dataset`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import PartialState

from lmselfplay.lm.prompt import encode_completion, encode_prompt
from lmselfplay.models.policy import load_tokenizer, prompt_style_of
from lmselfplay.spin.config import SpinConfigs
from lmselfplay.spin.data import load_supervised
from lmselfplay.utils.checkpoint import atomic_dir
from lmselfplay.utils.run import Run


def tokenize_pairs(tokenizer: Any, rows: list[dict[str, Any]], max_completion: int | None
                   ) -> tuple[list[list[int]], list[list[int]], int]:
    """THE formatter: prompt ids (what generation conditions on) and data-answer ids (+EOS).

    Returns (prompt_ids, chosen_ids, number of answers cut to ``max_completion``)."""
    prompts = [encode_prompt(tokenizer, r["prompt"]) for r in rows]
    chosen = [encode_completion(tokenizer, r["answer"]) for r in rows]
    cut = 0
    if max_completion is not None:
        cut = sum(len(c) > max_completion for c in chosen)
        chosen = [c[:max_completion] for c in chosen]
    return prompts, chosen, cut


def save_dataset(ds: Any, final_dir: Path, state: PartialState) -> None:
    """``ds`` in ``final_dir/ds``, written atomically by the main process; every process waits."""
    if state.is_main_process:
        with atomic_dir(final_dir) as tmp:
            ds.save_to_disk(str(tmp / "ds"))
    state.wait_for_everyone()


def load_dataset_dir(final_dir: Path) -> Any:
    """The data set :func:`save_dataset` wrote in ``final_dir``."""
    import datasets

    return datasets.load_from_disk(str(final_dir / "ds"))


def supervised_data(cfg: SpinConfigs, run: Run) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The supervised train and held-out sets: generated or loaded once, saved with the run
    (``data/``) so a resume sees the same sets."""
    import datasets

    out = run.out
    if (out / "data" / "COMPLETE").exists():
        sup = load_dataset_dir(out / "data")
        return sup["train"].to_list(), sup["eval"].to_list()
    train_rows, held = load_supervised(cfg.spin.dataset, cfg.spin.num_train_examples, cfg.spin.num_eval_examples,
                                       cfg.run.seed, cfg.spin.dataset_split, cfg.spin.dataset_settings())
    save_dataset(datasets.DatasetDict({"train": datasets.Dataset.from_list(train_rows),
                                       "eval": datasets.Dataset.from_list(held)}), out / "data", run.acc)
    return train_rows, held


@dataclass
class Pairs:
    """The tokenized data: prompts and data answers of the train and held-out sets."""

    tokenizer: Any
    p_train: list[list[int]]
    y_train: list[list[int]]
    p_held: list[list[int]]
    y_held: list[list[int]]
    gen_len: int  # the answer budget of y' (and of the greedy held-out answers)


def tokenized(cfg: SpinConfigs, run: Run, source: str | None, train_rows, held) -> Pairs:
    """Both sets through THE formatter with ``source``'s tokenizer; the answer budget is
    ``max_completion_length`` or the longest training answer (held-out answers cut to it)."""
    tokenizer = load_tokenizer(source, prompt_style_of(cfg.policy))
    p_train, y_train, cut_train = tokenize_pairs(tokenizer, train_rows, cfg.spin.max_completion_length)
    gen_len = cfg.spin.max_completion_length or max(len(c) for c in y_train)
    p_held, y_held, _ = tokenize_pairs(tokenizer, held, gen_len)
    if cut_train and run.is_main:
        print(f"note: {cut_train} data answers are longer than max_completion_length={gen_len} "
              f"and were cut (no EOS)", file=sys.stderr)
    return Pairs(tokenizer, p_train, y_train, p_held, y_held, gen_len)
