"""Fixed task sets for RL with verifiable rewards: a training stream and a held-out set that
never share an item.

A task set is named by a spec string:

* ``arithmetic``: word problems of :mod:`lmselfplay.tasks.arithmetic` (worked answers known);
* ``program``: predict a tiny program's printed output (:mod:`lmselfplay.tasks.programs`);
* ``reasoning_gym:<task>``: a reasoning-gym task by name, its own generator and scorer
  (``task_config``: the dataset's keyword arguments, e.g. ``{"min_terms": 2}``);
* ``jsonl:<path>``: a user's file, one ``{"question": ..., "answer": ...}`` object a line.

The split. Generated families (arithmetic, program) put an item in the held-out split when the
hash of its question text falls in the held-out bucket (:func:`is_heldout`): one question in
:data:`HELDOUT_BUCKETS`, whatever seed or stream drew it. Every training stream of the project
(this module's, the embedded model's pre-training corpus) skips those questions, so no training
seed can meet a held-out item. reasoning-gym: the held-out items are the dataset of
``heldout_seed``; training items come from other seeds, minus any question of the held-out set.
jsonl: the last ``heldout_size`` lines are held out (or a second file, ``heldout_path``).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmselfplay.tasks.answer_formats import with_instruction
from lmselfplay.tasks.arithmetic import arithmetic_problem, arithmetic_prompt
from lmselfplay.tasks.programs import program_output_prompt, python_program

HELDOUT_BUCKETS = 10  # one generated question in ten is held out
KINDS = ("arithmetic", "program", "reasoning_gym", "jsonl")
RG_TRAIN_CHUNK = 500  # reasoning-gym training items are drawn from datasets of this size
CORPUS_CHUNKS = 1000  # the embedded model's corpus draws a suite task's items from this many chunks


@dataclass(frozen=True)
class TaskItem:
    """One question with what decides its reward.

    ``kind``: which checker applies (``arithmetic``/``jsonl``: math equivalence with ``answer``;
    ``program``: the printed value equals ``answer``; ``reasoning_gym``: ``score`` of the answer
    between ``<answer>`` tags). ``prompt`` is what the model reads, its answer format's
    instruction included; ``answer_format`` names that format (:mod:`lmselfplay.tasks.answer_formats`;
    empty: the generator's own ``#### N``). ``worked``: a worked answer when the source has one
    (the supervised control's target). ``family``: a sub-kind for per-family accuracy.
    """

    id: str
    kind: str
    prompt: str
    question: str
    answer: str
    worked: str | None = None
    family: str = ""
    answer_format: str = ""
    score: Callable[[str], float] | None = field(default=None, compare=False, repr=False)


def is_heldout(question: str) -> bool:
    """Whether a generated question belongs to the held-out split (hash of its text)."""
    digest = hashlib.sha256(question.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_BUCKETS == 0


def parse_spec(spec: str) -> tuple[str, str]:
    """``(kind, argument)`` of a task-set spec; ValueError naming the spec when it is not one."""
    kind, _, arg = spec.partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown task set {spec!r}: use arithmetic, program, reasoning_gym:<task> or jsonl:<path>")
    if kind in ("arithmetic", "program") and arg:
        raise ValueError(f"task set {spec!r}: {kind} takes no argument")
    if kind in ("reasoning_gym", "jsonl") and not arg:
        raise ValueError(f"task set {spec!r}: name the {'task' if kind == 'reasoning_gym' else 'file'} after '{kind}:'")
    return kind, arg


# --- generated families ------------------------------------------------------------------------

def _arithmetic_item(rng: random.Random, id_: str) -> TaskItem:
    p = arithmetic_problem(rng)
    return TaskItem(id_, "arithmetic", arithmetic_prompt(p), p["prompt"], p["final"], p["answer"], p["kind"])


def _program_item(rng: random.Random, id_: str) -> TaskItem:
    t = python_program(rng)
    family = "list" if t["input"].startswith("[") else "str" if t["input"][:1] in "'\"" else "int"
    return TaskItem(id_, "program", program_output_prompt(t), t["code"] + t["input"], t["output"], t["output"], family)


GENERATORS: dict[str, Callable[[random.Random, str], TaskItem]] = {
    "arithmetic": _arithmetic_item, "program": _program_item}


def _generated(kind: str, rng: random.Random, heldout: bool, prefix: str) -> Iterator[TaskItem]:
    i = 0
    while True:
        item = GENERATORS[kind](rng, f"{prefix}-{i}")
        i += 1
        if is_heldout(item.question) == heldout:
            yield item


# --- reasoning-gym -------------------------------------------------------------------------------

# The default reasoning suite's tasks (eval/suites/default.yaml, checked equal by the tests): the
# seed, size and settings of their held-out items. Training items of these tasks (the embedded
# model's corpus) come from other seeds and never equal a suite question.
SUITE_TASKS: dict[str, tuple[int, int, dict[str, Any]]] = {
    "basic_arithmetic": (1301, 40, {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2}),
    "chain_sum": (1302, 40, {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2}),
    "gsm_symbolic": (1303, 40, {}),
    "propositional_logic": (1304, 40, {"min_vars": 2, "max_vars": 3, "min_statements": 2, "max_statements": 3}),
    "mini_sudoku": (1305, 40, {"min_empty": 4, "max_empty": 8}),
}
# The suite tasks whose items carry a reference answer (propositional_logic's are scored by validity).
CORPUS_SUITE_TASKS = ("basic_arithmetic", "chain_sum", "gsm_symbolic", "mini_sudoku")
_SUITE_QUESTIONS: set[str] = set()


def suite_questions() -> set[str]:
    """Every held-out question of :data:`SUITE_TASKS` (built once)."""
    if not _SUITE_QUESTIONS:
        for name, (seed, size, config) in SUITE_TASKS.items():
            ds = _rg_dataset(name, size, seed, config)
            _SUITE_QUESTIONS.update(ds[i]["question"] for i in range(size))
    return _SUITE_QUESTIONS


def _corpus_chunk(name: str, k: int) -> Any:
    """Training chunk ``k`` (of :data:`CORPUS_CHUNKS`) of suite task ``name`` in its suite settings."""
    return _rg_chunk(name, 1_000_003 + k, json.dumps(SUITE_TASKS[name][2], sort_keys=True))


def _in_corpus(question: str) -> bool:
    return question not in suite_questions() and not is_heldout(question)


def suite_training_item(rng: random.Random) -> TaskItem:
    """A training item of one of :data:`CORPUS_SUITE_TASKS` (never a suite question nor in the
    held-out bucket), its answer known."""
    while True:
        name = rng.choice(CORPUS_SUITE_TASKS)
        ds = _corpus_chunk(name, rng.randrange(CORPUS_CHUNKS))
        item = _rg_item(ds, rng.randrange(RG_TRAIN_CHUNK), f"corpus-{name}")
        if _in_corpus(item.question):
            return item


def corpus_questions(name: str) -> set[str]:
    """Every question of suite task ``name`` that the embedded model's corpus can hold (the
    questions of its training chunks outside the suite and the held-out bucket): a held-out set
    of the same task drawn from other seeds can share some of them."""
    return {q for k in range(CORPUS_CHUNKS) for q in (_corpus_chunk(name, k)[i]["question"]
                                                      for i in range(RG_TRAIN_CHUNK)) if _in_corpus(q)}


def _rg_dataset(name: str, size: int, seed: int, config: dict[str, Any]) -> Any:
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
    except Exception as e:  # an unknown task or settings the task refuses
        raise ValueError(f"reasoning-gym task {name!r} with {config}: {e}") from None


def _rg_item(ds: Any, i: int, id_: str) -> TaskItem:
    entry = ds[i]
    family = entry.get("metadata", {}).get("source_dataset", "")
    return TaskItem(id_, "reasoning_gym", with_instruction(entry["question"], "answer"), entry["question"],
                    str(entry["answer"]), family=family, answer_format="answer",
                    score=lambda answer, _ds=ds, _e=entry: float(_ds.score_answer(answer=answer, entry=_e)))


# --- user files ---------------------------------------------------------------------------------

def read_jsonl(path: str | Path) -> list[TaskItem]:
    """The items of a ``{"question", "answer"}`` JSONL file; ValueError naming the line at fault."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"task file {path}: {e}") from None
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ValueError(f"task file {path} line {n}: not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or "answer" not in row:
            raise ValueError(f"task file {path} line {n}: need an object with a string 'question' and an 'answer'")
        q, a = row["question"], str(row["answer"])
        items.append(TaskItem(f"{path.stem}-{n}", "jsonl", with_instruction(q, "final"), q, a,
                              row.get("solution") if isinstance(row.get("solution"), str) else None,
                              answer_format="final"))
    if not items:
        raise ValueError(f"task file {path}: no items")
    return items


# --- the task set ---------------------------------------------------------------------------------

class TaskSet:
    """A held-out set (fixed) and a training stream (seeded) that never meet.

    ``heldout`` is built at once; :meth:`training_batch` draws ``n`` training items for a step
    from a stream seeded by ``(seed, step)``, so a resumed run draws what an uninterrupted one would.
    """

    def __init__(self, spec: str, heldout_size: int, seed: int = 0, task_config: dict[str, Any] | None = None,
                 heldout_seed: int = 0, heldout_path: str | None = None):
        self.spec, self.seed, self.config = spec, seed, dict(task_config or {})
        self.kind, self.arg = parse_spec(spec)
        if self.config and self.kind != "reasoning_gym":
            raise ValueError(f"task_config applies to reasoning_gym tasks, not {spec!r}")
        if self.kind in GENERATORS:
            self.heldout = _take(_generated(self.kind, random.Random(f"heldout/{heldout_seed}"), True, "heldout"),
                                 heldout_size)
            self._train: list[TaskItem] = []
        elif self.kind == "reasoning_gym":
            ds = _rg_dataset(self.arg, heldout_size, heldout_seed, self.config) if heldout_size else None
            self.heldout = [_rg_item(ds, i, f"heldout-{i}") for i in range(heldout_size)]
            self._train = []
        else:
            items = read_jsonl(self.arg)
            if heldout_path:
                self.heldout, self._train = read_jsonl(heldout_path)[:heldout_size] if heldout_size else [], items
            else:
                if heldout_size >= len(items):
                    raise ValueError(f"task file {self.arg}: {len(items)} items, heldout_size {heldout_size} "
                                     "leaves none to train on")
                cut = len(items) - heldout_size
                self.heldout, self._train = items[cut:], items[:cut]
        self.heldout_questions = {t.question for t in self.heldout}
        if self.kind == "reasoning_gym" and self.heldout:
            self._warn_if_few_training_questions()
        if self.kind == "jsonl":
            self._train = [t for t in self._train if t.question not in self.heldout_questions]
            if not self._train:
                raise ValueError(f"task file {self.arg}: every training item is also held out")

    def training_batch(self, step: int, n: int) -> list[TaskItem]:
        rng = random.Random(f"train/{self.seed}/{step}")
        if self.kind in GENERATORS:
            return _take(_generated(self.kind, rng, False, f"train-{step}"), n)
        if self.kind == "jsonl":
            return [self._train[rng.randrange(len(self._train))] for _ in range(n)]
        return self._rg_training_batch(rng, step, n)

    def _training_chunk(self, chunk: int) -> Any:
        """Training dataset ``chunk`` of this task set's seed (cached)."""
        return _rg_chunk(self.arg, 1_000_003 * (self.seed + 1) + chunk, json.dumps(self.config, sort_keys=True))

    def _warn_if_few_training_questions(self) -> None:
        """One stderr line when the held-out set holds most of the task's questions: training then
        repeats the few left, and its reward rises without teaching anything held out."""
        ds = self._training_chunk(0)
        questions = [ds[i]["question"] for i in range(len(ds))]
        held = sum(q in self.heldout_questions for q in questions) / len(questions)
        if held >= 0.25:
            print(f"warning: {held:.0%} of {self.arg}'s training draws are held-out questions, so training "
                  f"repeats the {len(set(questions) - self.heldout_questions)} others of {len(questions)} draws; "
                  "widen --task_config or lower --heldout_size", file=sys.stderr)

    def _rg_training_batch(self, rng: random.Random, step: int, n: int) -> list[TaskItem]:
        """Items of training datasets (seeds ``1_000_003 * (seed + 1) + chunk``, apart from any held-out seed)."""
        out: list[TaskItem] = []
        while len(out) < n:
            ds = self._training_chunk(rng.randrange(1000))
            item = _rg_item(ds, rng.randrange(RG_TRAIN_CHUNK), f"train-{step}-{len(out)}")
            if item.question not in self.heldout_questions:
                out.append(item)
        return out


_RG_CACHE: dict[tuple[str, int, str], Any] = {}


def _rg_chunk(name: str, seed: int, config_json: str) -> Any:
    key = (name, seed, config_json)
    if key not in _RG_CACHE:
        if len(_RG_CACHE) > 64:
            _RG_CACHE.clear()
        _RG_CACHE[key] = _rg_dataset(name, RG_TRAIN_CHUNK, seed, json.loads(config_json))
    return _RG_CACHE[key]


def _take(stream: Iterator[TaskItem], n: int) -> list[TaskItem]:
    return [next(stream) for _ in range(n)]
