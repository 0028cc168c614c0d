"""The supervised data SPIN plays against: (prompt, answer) pairs, plus their final answers.

Sources (``load_supervised``):

* ``None`` -> the project's own arithmetic word problems
  (:func:`lmselfplay.tasks.arithmetic.arithmetic_problem`), generated from a seed, no download;
* a local file: ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv``, or a folder written by
  ``Dataset.save_to_disk``;
* ``reasoning_gym:<task>`` -> a reasoning-gym task (its settings: ``dataset_config``), held-out and
  training items split as the positive control splits them (:func:`reasoning_gym_pairs`);
* anything else is passed to ``datasets.load_dataset(name, split=split)``.

Accepted columns, first match wins: ``prompt`` + ``answer``, ``prompt`` + ``completion``,
``question`` + ``answer`` (GSM8K), or ``messages`` (one user turn then one assistant turn;
a leading system turn is refused rather than silently dropped). A bad file gives a
:class:`SpinDataError` that names the file, the row and what is wrong.

``final`` is the part of the answer that accuracy is measured on: the ``final`` column
when present, else the number after the last ``#### `` (GSM8K convention), else ``None``
(then accuracy is exact match of the whole answer).
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from lmselfplay.tasks.arithmetic import arithmetic_problem, arithmetic_prompt
from lmselfplay.utils.errors import UserError

FINAL_RE = re.compile(r"####\s*([^\n]*)")
LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class SpinDataError(UserError, ValueError):
    """A supervised data set that cannot be used; the message says where and why."""


def gsm8k_final(text: str) -> str | None:
    """The answer after the LAST ``####`` marker, normalised (``"1,024."`` -> ``"1024"``).

    Model output is hostile input: anything goes, this never raises, ``None`` = no marker.
    """
    if not isinstance(text, str):
        return None
    found = FINAL_RE.findall(text)
    if not found:
        return None
    value = found[-1].strip().replace(",", "").rstrip(".").strip()
    return value or None


def answers_match(prediction: str, answer: str, final: str | None) -> bool:
    """Exact-answer accuracy: compare ``#### N`` finals when the data has one, else whole texts."""
    if final is not None:
        return gsm8k_final(prediction) == final
    return prediction.strip() == answer.strip()


def arithmetic_pairs(n: int, seed: int, exclude: set[str] | None = None) -> list[dict[str, str]]:
    """``n`` distinct arithmetic problems (prompt as the model reads it, worked answer, final)."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    rows: list[dict[str, str]] = []
    tries = 0
    while len(rows) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise SpinDataError(f"could not draw {n} distinct arithmetic problems")
        p = arithmetic_problem(rng)
        prompt = arithmetic_prompt(p)
        if prompt in seen:
            continue
        seen.add(prompt)
        rows.append({"prompt": prompt, "answer": p["answer"], "final": p["final"]})
    return rows


def reasoning_gym_pairs(source: str, num_train: int, num_eval: int, seed: int,
                        config: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``reasoning_gym:<task>``: the task set's held-out items (the dataset of ``seed``) and
    ``num_train`` distinct training items of its training stream, which never meets them
    (:class:`~lmselfplay.tasks.task_sets.TaskSet`); answers are ``<answer>N</answer>``, matched whole."""
    from lmselfplay.tasks.task_sets import TaskSet

    if num_train < 1:
        raise SpinDataError("num_train_examples must be >= 1 for a reasoning-gym data set")
    try:
        tasks = TaskSet(source, num_eval, seed=seed, task_config=config, heldout_seed=seed)
    except ValueError as e:
        raise SpinDataError(str(e)) from None
    rows: dict[str, dict[str, Any]] = {}
    for step in range(100 * num_train):
        if len(rows) >= num_train:
            break
        for t in tasks.training_batch(step, 16):
            rows.setdefault(t.prompt, _tagged_row(t))
    if len(rows) < num_train:
        raise SpinDataError(f"{source} with {config}: only {len(rows)} distinct training questions; "
                            "lower num_train_examples or widen dataset_config")
    return list(rows.values())[:num_train], [_tagged_row(t) for t in tasks.heldout]


def _tagged_row(item: Any) -> dict[str, Any]:
    return {"prompt": item.prompt, "answer": f"<answer>{item.answer}</answer>", "final": None}


def _load_raw(source: str, split: str) -> Any:
    import datasets

    path = Path(source)
    try:
        if path.is_dir():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise SpinDataError(f"{source}: no split {split!r} (has {', '.join(ds)})")
                ds = ds[split]
            return ds
        if path.suffix in LOCAL_BUILDERS:
            if not path.is_file():
                raise SpinDataError(f"data file not found: {source}")
            return datasets.load_dataset(LOCAL_BUILDERS[path.suffix], data_files=str(path), split="train")
        if path.exists():
            raise SpinDataError(f"{source}: unsupported file type (use .jsonl, .json, .parquet, .csv "
                                f"or a save_to_disk folder)")
        return datasets.load_dataset(source, split=split)
    except SpinDataError:
        raise
    except Exception as e:  # malformed JSON, missing hub data set, offline, ...
        raise SpinDataError(f"cannot read data set {source!r}: {type(e).__name__}: {e}") from None


def _row_pair(row: dict[str, Any], cols: set[str], where: str) -> tuple[str, str]:
    if "messages" in cols and not ({"prompt", "question"} & cols):
        msgs = row["messages"]
        if not isinstance(msgs, list) or len(msgs) != 2 or not all(isinstance(m, dict) for m in msgs):
            raise SpinDataError(f"{where}: 'messages' must be exactly [user turn, assistant turn]")
        roles = [m.get("role") for m in msgs]
        if roles != ["user", "assistant"]:
            raise SpinDataError(f"{where}: 'messages' roles must be ['user', 'assistant'], got {roles}")
        return msgs[0].get("content"), msgs[1].get("content")
    p_col = "prompt" if "prompt" in cols else "question"
    a_col = "answer" if "answer" in cols else "completion"
    return row[p_col], row[a_col]


def normalise(ds: Any, name: str) -> list[dict[str, Any]]:
    """Rows ``{"prompt", "answer", "final"}`` from any accepted column layout."""
    cols = set(ds.column_names)
    has_pair = ({"prompt", "question"} & cols) and ({"answer", "completion"} & cols)
    if not has_pair and "messages" not in cols:
        raise SpinDataError(f"{name}: needs columns prompt+answer, prompt+completion, question+answer "
                            f"or messages; found {', '.join(sorted(cols)) or 'none'}")
    rows = []
    for i, row in enumerate(ds):
        where = f"{name} row {i}"
        prompt, answer = _row_pair(row, cols, where)
        for what, v in (("prompt", prompt), ("answer", answer)):
            if not isinstance(v, str) or not v.strip():
                raise SpinDataError(f"{where}: {what} must be a non-empty string, got {v!r:.60}")
        final = row.get("final") if "final" in cols else gsm8k_final(answer)
        rows.append({"prompt": prompt, "answer": answer, "final": None if final is None else str(final)})
    if not rows:
        raise SpinDataError(f"{name}: the data set is empty")
    return rows


def load_supervised(source: str | None, num_train: int, num_eval: int, seed: int = 0,
                    split: str = "train", config: dict[str, Any] | None = None,
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, held-out rows). Held-out prompts never appear in train.

    A loaded set is shuffled with ``seed``; the first ``num_eval`` distinct prompts are
    held out, the next ``num_train`` (``<= 0``: all the rest) are the training set.
    """
    if num_eval < 1:
        raise SpinDataError("num_eval_examples must be >= 1 (the held-out metrics need prompts)")
    if source in (None, "", "arithmetic"):
        if num_train < 1:
            raise SpinDataError("num_train_examples must be >= 1 for the generated data set")
        held_out = arithmetic_pairs(num_eval, seed + 1)
        return arithmetic_pairs(num_train, seed, exclude={r["prompt"] for r in held_out}), held_out
    if source.startswith("reasoning_gym:"):
        return reasoning_gym_pairs(source, num_train, num_eval, seed, config or {})
    rows = normalise(_load_raw(source, split), source)
    random.Random(seed).shuffle(rows)
    held_out, held_prompts, train = [], set(), []
    for r in rows:
        if len(held_out) < num_eval and r["prompt"] not in held_prompts:
            held_out.append(r)
            held_prompts.add(r["prompt"])
        elif r["prompt"] not in held_prompts:
            train.append(r)
    if num_train > 0:
        train = train[:num_train]
    if not train:
        raise SpinDataError(f"{source}: {len(rows)} rows leave none for training after holding out "
                            f"{num_eval}; lower num_eval_examples")
    return train, held_out
