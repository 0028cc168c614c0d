"""Two-option questions with a known answer and a plausible wrong one (debate's test bed).

Every task is a :class:`DebateTask`: a question, a context (the story, the program, the
worked solution), the correct answer and one incorrect answer. Correctness is exact, so
a judge's accuracy is exact. The families:

* ``arithmetic`` — the project's word problems (:func:`lmselfplay.tasks.arithmetic.arithmetic_problem`);
  context: the worked solution; wrong answer: a near value (the true one +- 1..10, >= 0).
* ``programs`` — "what does f(x) return?" for the project's tiny programs; context: the
  program. Both answers come from running code in the executor sandbox (never in this
  process): the true program, and a near-miss mutant (one integer constant changed),
  whose different output is a wrong solution; if it does not differ, a nearby value of
  the same type (:func:`perturb`).
* ``reasoning_gym`` — any reasoning-gym dataset by name; context: the dataset's worked
  solution when it ships one (``metadata['answer_cot']``), else empty. Wrong answer: a
  near value for integer answers, else another item's answer; either way the dataset's
  own ``score_answer`` must give it less than 1 (it is wrong by the benchmark's checker).
* ``dataset`` — any local file ``datasets`` reads (json/jsonl/csv/parquet) with columns
  ``question, context, correct, incorrect`` (QuALITY-style).

``hidden_context`` is not a property of a task but of the protocol that shows it (see
:mod:`lmselfplay.debate.protocols`): debaters always read the context, the judge only
when it is not hidden.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lmselfplay.tasks.arithmetic import arithmetic_problem
from lmselfplay.tasks.programs import python_program
from lmselfplay.verifiers.executor import Executor, ExecutorConfig, Program, parse_literal_args

DATASET_COLUMNS = ("question", "context", "correct", "incorrect")
NEAR_OFFSETS = (1, 2, 3, 4, 5, 10)


@dataclass(frozen=True)
class DebateTask:
    id: str
    family: str
    question: str
    context: str
    correct: str
    incorrect: str

    def __post_init__(self):
        if self.correct.strip() == self.incorrect.strip():
            raise ValueError(f"task {self.id}: the incorrect answer equals the correct one")


def near_value(value: int, rng: random.Random, nonnegative: bool = False) -> int:
    """A different integer close to ``value`` (a plausible slip)."""
    while True:
        cand = value + rng.choice(NEAR_OFFSETS) * rng.choice((-1, 1))
        if cand != value and (cand >= 0 or not nonnegative):
            return cand


def _as_int(text: str) -> int | None:
    try:
        return int(str(text).strip())
    except ValueError:
        return None


# --- arithmetic --------------------------------------------------------------------

def arithmetic_tasks(n: int, seed: int) -> list[DebateTask]:
    rng = random.Random(f"arithmetic/{seed}")
    out = []
    for i in range(n):
        p = arithmetic_problem(rng)
        work = p["answer"].rsplit("####", 1)[0].strip()
        wrong = near_value(int(p["final"]), rng, nonnegative=True)
        out.append(DebateTask(f"arithmetic/{seed}/{i}", "arithmetic", p["prompt"], work, p["final"], str(wrong)))
    return out


# --- program outputs (run in the sandbox) --------------------------------------------

def mutate_constant(code: str, rng: random.Random) -> str | None:
    """The program with one integer literal changed by +-1 (None when it has none)."""
    spots = [m for m in re.finditer(r"(?<![\w.])\d+(?![\w.])", code)]
    if not spots:
        return None
    m = rng.choice(spots)
    v = int(m.group())
    new = v + rng.choice((-1, 1))
    return code[: m.start()] + str(new if new >= 0 else v + 1) + code[m.end():]


def perturb(value, rng: random.Random):
    """A nearby value of the same type: an int moved, a bool flipped, one list item or
    one character changed (an empty string or list gains an element)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return near_value(value, rng)
    if isinstance(value, str):
        if not value:
            return "a"
        i = rng.randrange(len(value))
        return value[:i] + ("a" if value[i] != "a" else "b") + value[i + 1:]
    if isinstance(value, list):
        if not value:
            return [0]
        i = rng.randrange(len(value))
        return value[:i] + [perturb(value[i], rng)] + value[i + 1:]
    return repr(value) + "0"


def program_tasks(n: int, seed: int, executor=None) -> list[DebateTask]:
    """``n`` program-output questions; every output is computed by the executor sandbox.

    Programs whose true run fails (never expected for the project's grammar) are skipped
    and replaced by new ones, at most ``4 n`` draws in all. ``executor``: the caller's sandbox
    (left open); default: a sandbox of its own, closed on return."""
    rng = random.Random(f"programs/{seed}")
    own = executor is None
    ex = executor or Executor(ExecutorConfig(timeout_s=2.0, cpu_s=2.0))
    out: list[DebateTask] = []
    try:
        draws = 0
        while len(out) < n and draws < 4 * n:
            batch = [python_program(rng) for _ in range(n - len(out))]
            draws += len(batch)
            mutants = [mutate_constant(p["code"], rng) for p in batch]
            jobs = []
            for p, m in zip(batch, mutants):
                args = parse_literal_args(p["input"])
                jobs += [Program(p["code"], entry="f", args=args), Program(m or p["code"], entry="f", args=args)]
            res = ex.run_batch(jobs, progress=False)
            for k, p in enumerate(batch):
                true, mut = res[2 * k], res[2 * k + 1]
                if not true.ok:
                    continue
                right = true.value_repr
                wrong = mut.value_repr if mut.ok and mut.value_repr != right else None
                if wrong is None:
                    wrong = repr(perturb(true.value, rng))
                    if wrong == right:
                        continue
                i = len(out)
                q = f"What does f({p['input']}) return?"
                out.append(DebateTask(f"programs/{seed}/{i}", "programs", q, p["code"].rstrip(), right, wrong))
    finally:
        if own:
            ex.close()
    return out


# --- reasoning-gym -----------------------------------------------------------------------

def reasoning_gym_tasks(names: str, n: int, seed: int) -> list[DebateTask]:
    """``n`` questions spread over the comma-separated reasoning-gym dataset ``names``."""
    import reasoning_gym

    names_list = [x.strip() for x in names.split(",") if x.strip()]
    if not names_list:
        return []
    out: list[DebateTask] = []
    per = [n // len(names_list) + (i < n % len(names_list)) for i in range(len(names_list))]
    for name, k in zip(names_list, per):
        if k == 0:
            continue
        ds = reasoning_gym.create_dataset(name, size=max(2 * k, 4), seed=seed)
        items = list(ds)
        rng = random.Random(f"rg/{name}/{seed}")
        found = 0
        for idx, item in enumerate(items):
            if found == k:
                break
            wrong = _rg_distractor(ds.score_answer, item, items, rng)
            if wrong is None:
                continue
            ctx = str(item.get("metadata", {}).get("answer_cot") or "")
            out.append(DebateTask(f"rg/{name}/{seed}/{idx}", f"rg/{name}", str(item["question"]).strip(), ctx,
                                  str(item["answer"]), wrong))
            found += 1
    return out


def _rg_distractor(score: Callable, item: dict, items: list[dict], rng: random.Random) -> str | None:
    """A wrong answer by the dataset's own checker: a near value, else another item's answer."""
    truth = str(item["answer"])
    value = _as_int(truth)
    cands = [str(near_value(value, rng)) for _ in range(5)] if value is not None else []
    cands += [str(o["answer"]) for o in rng.sample(items, len(items)) if str(o["answer"]) != truth]
    for c in cands:
        try:
            wrong = float(score(c, item)) < 1.0
        except Exception:  # a checker that cannot read the candidate: not a usable distractor
            wrong = False
        if wrong:
            return c
    return None


# --- a user's data set ---------------------------------------------------------------------

def dataset_tasks(path: str, n: int = 0, seed: int = 0, split: str = "train") -> list[DebateTask]:
    """Rows of a local json/jsonl/csv/parquet file with ``question, context, correct,
    incorrect`` columns (``n`` > 0: a seeded sample of n rows). Rows with an empty or
    identical answer pair are skipped; missing columns are an error naming them."""
    from datasets import load_dataset

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"debate data set not found: {path}")
    kind = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}.get(p.suffix)
    if kind is None:
        raise ValueError(f"debate data set {path}: use a .json, .jsonl, .csv or .parquet file")
    ds = load_dataset(kind, data_files={split: str(p)}, split=split)
    missing = [c for c in DATASET_COLUMNS if c not in ds.column_names]
    if missing:
        raise ValueError(f"debate data set {path} lacks column(s) {missing}; it has {ds.column_names}")
    rows = list(range(len(ds)))
    if n and n < len(rows):
        rows = sorted(random.Random(seed).sample(rows, n))
    out = []
    for i in rows:
        r = ds[i]
        vals = {c: "" if r[c] is None else str(r[c]) for c in DATASET_COLUMNS}
        if not vals["correct"].strip() or not vals["incorrect"].strip() or \
                vals["correct"].strip() == vals["incorrect"].strip():
            continue
        out.append(DebateTask(f"data/{p.stem}/{i}", "dataset", **vals))
    return out


# --- one entry point --------------------------------------------------------------------

def make_tasks(families: str, n: int, seed: int, reasoning_gym_names: str = "", dataset_path: str = "",
               executor=None) -> list[DebateTask]:
    """``n`` tasks split evenly over the comma-separated ``families`` (arithmetic,
    programs, reasoning_gym, dataset), in a seeded shuffled order."""
    fams = [f.strip() for f in families.split(",") if f.strip()]
    known = ("arithmetic", "programs", "reasoning_gym", "dataset")
    bad = [f for f in fams if f not in known]
    if bad or not fams:
        raise ValueError(f"unknown task families {bad or families!r}; known: {list(known)}")
    per = [n // len(fams) + (i < n % len(fams)) for i in range(len(fams))]
    out: list[DebateTask] = []
    for fam, k in zip(fams, per):
        if fam == "arithmetic":
            out += arithmetic_tasks(k, seed)
        elif fam == "programs":
            out += program_tasks(k, seed, executor)
        elif fam == "reasoning_gym":
            if not reasoning_gym_names:
                raise ValueError("family reasoning_gym needs reasoning_gym_datasets (e.g. 'chain_sum')")
            out += reasoning_gym_tasks(reasoning_gym_names, k, seed)
        else:
            if not dataset_path:
                raise ValueError("family dataset needs dataset_path (a local file)")
            out += dataset_tasks(dataset_path, k, seed)
    random.Random(f"order/{seed}").shuffle(out)
    return out
