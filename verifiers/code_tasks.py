"""Absolute Zero code tasks: the (program, input, output) triple, its three task types,
parsing of proposer and solver outputs, and validation / answer checking in the executor.

A task is a program defining ``f`` with inputs (Python literal argument lists, e.g.
``"[1, 2], 3"``) and the outputs the executor computed. One part is hidden per type:

* ``deduction`` — given program + input, predict the output (a Python literal);
* ``abduction`` — given program + output, give an input; ANY input on which the program
  returns the output is right (checked by running it);
* ``induction`` — given the first half of the input/output pairs and the proposer's
  message, write ``f``; checked on the held-out second half.

Rules (every parser returns a value or an error reason, never raises):

* A proposal holds exactly one program that defines ``f`` once at top level, and its
  input(s): deduction/abduction one, induction ``n_inputs``. Two formats are read: AZR's
  fences (```` ```python ```` / ```` ```input ```` / ```` ```message ````) and bare code
  followed by ``input: ...`` / ``message: ...`` lines.
* A proposal is valid when the program parses, every input is a literal argument list,
  ``f(*input)`` returns ``ok`` inside the executor's limits on two executors with
  different hash seeds and both values agree (:func:`values_equal`), and the value is
  JSON-representable (None, bool, int, finite float, str, list, dict with str keys).
  Banned modules, forks, files, time and memory are the sandbox's business: their
  status (``error``, ``timeout``, ...) is what the proposal is marked with.
* Answers are compared with the executor's :func:`values_equal` on decoded built-ins in
  this process; a program's ``__eq__`` never takes part.

All executor work of a phase goes out as one :meth:`Executor.run_batch` per executor.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import math
import random
import re
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from lmselfplay.games.text import visible_answer_text
from lmselfplay.tasks.programs import program_output_prompt, program_write_prompt, python_program
from lmselfplay.verifiers.executor import (
    STATUSES,
    ExecResult,
    Executor,
    ExecutorConfig,
    Program,
    parse_literal_args,
    values_equal,
)

TASK_TYPES = ("deduction", "abduction", "induction")
ENTRY = "f"
MAX_PROGRAM_CHARS = 2000
MAX_ANSWER_CHARS = 1000
MAX_MESSAGE_CHARS = 300
BUILTIN_NAMES = frozenset(dir(builtins))

# --- prompts (every prompt text of the recipe lives here) ----------------------------

PROPOSE_HEADER = {
    "deduction": "Propose a new Python program f and one input for it. "
                 "Another model will predict the output.",
    "abduction": "Propose a new Python program f and one input for it. "
                 "Another model will find an input from the output.",
    "induction": "Propose a new Python program f, {n} inputs and a one-line message. "
                 "Another model will write f from half of the input/output pairs.",
}
PROPOSE_FORMAT = "Answer with the program, then one line 'input: ARGS' per input{message}."
ABDUCTION_PROMPT = "Give an input x with repr(f(x)) == {output}.\n{program}"
INDUCTION_PROMPT = "Write a Python function f with {pairs}.\n{message}"
ANSWER_TAGS = {
    "deduction": "Put only the output, as a Python literal, inside <answer></answer>.",
    "abduction": "Put only the input (the arguments of f, as Python literals) inside <answer></answer>.",
    "induction": "Put only the program defining f inside <answer></answer>.",
}


def reference_text(task: CodeTask) -> str:
    """A buffer task as a proposal example: the same format a proposal is written in."""
    lines = [task.program.rstrip("\n")] + [f"input: {i}" for i in task.inputs]
    if task.message:
        lines.append(f"message: {task.message}")
    return "\n".join(lines)


def propose_prompt(task_type: str, references: Sequence[CodeTask], n_inputs: int = 1,
                   style: str = "paper") -> str:
    """Step 1's prompt. ``paper``: header, K reference tasks of the type (program + inputs),
    the answer format; the proposer writes program and inputs. ``io``: the first reference's
    first input/output pair in the embedded model's pre-training format
    (:func:`~lmselfplay.tasks.programs.program_write_prompt`); the proposer writes only the
    program and the task takes the reference's inputs (:func:`parse_proposal` ``given_inputs``)."""
    if style == "io":
        if not references:
            raise ValueError("the io proposal style needs a reference task")
        r = references[0]
        return program_write_prompt({"input": r.inputs[0], "output": repr(r.outputs[0])})
    if style != "paper":
        raise ValueError(f"unknown proposal style {style!r}: use paper or io")
    head = PROPOSE_HEADER[task_type].format(n=n_inputs)
    refs = "\n".join(f"Example {k + 1}:\n{reference_text(t)}" for k, t in enumerate(references))
    fmt = PROPOSE_FORMAT.format(message=", then 'message: TEXT'" if task_type == "induction" else "")
    return f"{head}\n{refs}\n{fmt}" if refs else f"{head}\n{fmt}"


def solve_prompt(task: CodeTask, answer_tags: bool = False) -> str:
    """Step 3's prompt. Deduction is the embedded model's pre-training format
    (:func:`~lmselfplay.tasks.programs.program_output_prompt`), so it starts in-distribution.
    ``answer_tags`` (real models, which explain before answering) asks for the answer
    inside ``<answer></answer>``, where :func:`parse_answer` looks first."""
    if task.task_type == "deduction":
        text = program_output_prompt({"code": task.program, "input": task.inputs[0]})
    elif task.task_type == "abduction":
        text = ABDUCTION_PROMPT.format(output=repr(task.outputs[0]), program=task.program.rstrip("\n"))
    else:
        pairs = ", ".join(f"f({i}) == {o!r}" for i, o in task.shown_pairs())
        text = INDUCTION_PROMPT.format(pairs=pairs, message=task.message).rstrip("\n")
    return f"{text}\n{ANSWER_TAGS[task.task_type]}" if answer_tags else text


# --- the task --------------------------------------------------------------------------

@dataclass
class CodeTask:
    """A validated (program, inputs, outputs) triple of one task type. JSON round-trips
    exactly: inputs are literal texts, outputs are JSON-representable by validation."""

    task_type: str
    program: str
    inputs: list[str]
    outputs: list[Any] = field(default_factory=list)
    message: str = ""
    source: str = "proposed"  # "seed" (identity / generated) or "proposed"

    def shown_pairs(self) -> list[tuple[str, Any]]:
        """Induction: the first half of the pairs (at least one) is shown to the solver."""
        k = max(1, len(self.inputs) // 2)
        return list(zip(self.inputs[:k], self.outputs[:k]))

    def held_out_pairs(self) -> list[tuple[str, Any]]:
        k = max(1, len(self.inputs) // 2)
        return list(zip(self.inputs[k:], self.outputs[k:]))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CodeTask:
        return cls(**d)


@dataclass
class Proposal:
    """A parsed proposer output; ``error`` says why it is invalid (None: parsed)."""

    program: str = ""
    inputs: list[str] = field(default_factory=list)
    message: str = ""
    error: str | None = None


# --- parsing (never raises) ------------------------------------------------------------

FENCE = re.compile(r"```([A-Za-z]*)[ \t]*\n(.*?)```", re.S)


def _safe_parse(code: str) -> ast.Module | str:
    """``ast.parse`` or the reason it failed (syntax, NUL byte, too deep, too long)."""
    if len(code) > MAX_PROGRAM_CHARS:
        return f"program longer than {MAX_PROGRAM_CHARS} characters"
    try:
        with warnings.catch_warnings():  # model text: invalid escapes are its problem, not a warning
            warnings.simplefilter("ignore")
            return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as e:
        return f"program does not parse: {type(e).__name__}"


def check_program(code: str) -> str | None:
    """None when ``code`` parses and defines ``f`` exactly once at top level, else why not."""
    tree = _safe_parse(code)
    if isinstance(tree, str):
        return tree
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == ENTRY]
    if not defs:
        return "no program: nothing defines f"
    if len(defs) > 1:
        return "two programs: f is defined more than once"
    if isinstance(defs[0], ast.AsyncFunctionDef):
        return "f is async"
    return None


def check_input(text: str) -> tuple[tuple, str | None]:
    """(args, None) when ``text`` is a literal argument list, else ((), reason)."""
    if len(text) > MAX_ANSWER_CHARS:
        return (), "input too long"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return parse_literal_args(text), None
    except (ValueError, RecursionError, MemoryError, OverflowError):
        return (), f"input is not a literal argument list: {text[:60]!r}"


def parse_proposal(text: str, n_inputs: int, need_message: bool = False,
                   given_inputs: Sequence[str] | None = None) -> Proposal:
    """The program, inputs and message of a proposer's output (see the module rules).
    With ``given_inputs`` (the ``io`` proposal style) the inputs are those, not the text's."""
    if not isinstance(text, str):
        return Proposal(error="not text")
    fences = FENCE.findall(text)
    if fences:
        programs = [b for lang, b in fences if lang.lower() in ("python", "py", "")]
        inputs = [b.strip() for lang, b in fences if lang.lower() == "input"]
        messages = [b.strip() for lang, b in fences if lang.lower() == "message"]
        inputs += _tagged_lines(text, "input")
        messages += _tagged_lines(text, "message")
    else:
        body, inputs, messages = _split_bare(text)
        programs = [body] if re.search(r"^\s*(def|async def)\s", body, re.M) else []
    if given_inputs is not None:
        inputs = list(given_inputs)
    if not programs:
        return Proposal(error="no program")
    if len(programs) > 1:
        return Proposal(error="two programs")
    prop = Proposal(program=programs[0].strip("\n") + "\n", inputs=inputs,
                    message=(messages[0] if messages else "")[:MAX_MESSAGE_CHARS])
    prop.error = check_program(prop.program)
    if prop.error is None and len(inputs) != n_inputs:
        prop.error = f"{len(inputs)} inputs, expected {n_inputs}" if inputs else "no input"
    if prop.error is None:
        prop.error = next((e for _, e in map(check_input, inputs) if e), None)
    if prop.error is None and need_message and not prop.message:
        prop.error = "no message"
    return prop


def _tagged_lines(text: str, tag: str) -> list[str]:
    return [ln.split(":", 1)[1].strip() for ln in text.splitlines()
            if ln.strip().lower().startswith(f"{tag}:")]


def _split_bare(text: str) -> tuple[str, list[str], list[str]]:
    """Bare format: code lines, then ``input:`` / ``message:`` lines (anywhere)."""
    code = [ln for ln in text.splitlines() if not re.match(r"\s*(input|message)\s*:", ln, re.I)]
    return "\n".join(code), _tagged_lines(text, "input"), _tagged_lines(text, "message")


ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def _strip_fence(text: str) -> str | None:
    """The answer after any think block (None while it is open): inside the LAST
    ``<answer>...</answer>`` (AZR's tags), else the last fence, else the whole text."""
    text = visible_answer_text(text)
    if text is None:
        return None
    tagged = ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1]
    fences = FENCE.findall(text)
    return fences[-1][1] if fences else text


def parse_answer(task_type: str, text: str) -> tuple[Any, str | None]:
    """The solver's answer: (value, None) or (None, format error), read from
    ``<answer>`` tags or a fence when present. Deduction: a literal
    (parsed here, literals only); abduction: a literal argument list; induction: a program."""
    if not isinstance(text, str):
        return None, "not text"
    body = _strip_fence(text)
    if body is None:
        return None, "the think block never closed"
    body = body.strip()
    if not body:
        return None, "empty answer"
    if task_type == "induction":
        err = check_program(body + "\n")
        return (None, err) if err else (body + "\n", None)
    if len(body) > MAX_ANSWER_CHARS:
        return None, "answer too long"
    if task_type == "abduction":
        args, err = check_input(body)
        return (None, err) if err else (args, None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.literal_eval(body), None
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError, OverflowError):
        return None, "answer is not a Python literal"


# --- values ----------------------------------------------------------------------------

def json_representable(v: Any, depth: int = 0) -> bool:
    """Exact JSON types only (tuples, sets, bytes, nan/inf are not)."""
    if depth > 50:
        return False
    if v is None or type(v) in (bool, int, str):
        return True
    if type(v) is float:
        return math.isfinite(v)
    if type(v) is list:
        return all(json_representable(x, depth + 1) for x in v)
    if type(v) is dict:
        return all(type(k) is str and json_representable(x, depth + 1) for k, x in v.items())
    return False


# --- normalized AST (dedup and diversity) ---------------------------------------------

class _Normalize(ast.NodeTransformer):
    """Rename every argument and local name to v0, v1, ... in order of first appearance
    (builtins and ``f`` keep their names) and drop docstrings: renamings and comments
    do not make a new program."""

    def __init__(self):
        self.names: dict[str, str] = {}

    def _rename(self, name: str) -> str:
        if name == ENTRY or name in BUILTIN_NAMES:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node):
        node.id = self._rename(node.id)
        return node

    def visit_arg(self, node):
        node.arg = self._rename(node.arg)
        node.annotation = None
        return node

    def visit_FunctionDef(self, node):
        if node.name != ENTRY:
            node.name = self._rename(node.name)
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str) and len(body) > 1:
            node.body = body[1:]
        node.returns = None
        self.generic_visit(node)
        return node


def normalized_program(code: str) -> str:
    """Canonical text of a program: ``ast.dump`` after :class:`_Normalize`; the raw text
    when it does not parse (never raises)."""
    tree = _safe_parse(code)
    if isinstance(tree, str):
        return code
    try:
        return ast.dump(_Normalize().visit(tree), annotate_fields=False)
    except (RecursionError, MemoryError):
        return code


def task_key(task: CodeTask) -> str:
    """Dedup key: normalized program + the inputs as parsed values."""
    args = [repr(check_input(i)[0]) for i in task.inputs]
    return normalized_program(task.program) + "|" + "|".join(args)


def diversity(programs: Sequence[str], max_pairs: int = 500, seed: int = 0) -> dict[str, float]:
    """``distinct_ast``: distinct normalized programs / programs; ``edit_distance``: mean
    pairwise ``1 - difflib ratio`` of the normalized programs (a sample of pairs)."""
    if not programs:
        return {"distinct_ast": 0.0, "edit_distance": 0.0}
    norm = [normalized_program(p) for p in programs]
    pairs = [(i, j) for i in range(len(norm)) for j in range(i + 1, len(norm))]
    if len(pairs) > max_pairs:
        pairs = random.Random(seed).sample(pairs, max_pairs)
    dist = [1.0 - difflib.SequenceMatcher(None, norm[i], norm[j], autojunk=False).ratio() for i, j in pairs]
    return {"distinct_ast": len(set(norm)) / len(norm),
            "edit_distance": sum(dist) / len(dist) if dist else 0.0}


# --- buffers ---------------------------------------------------------------------------

class TaskBuffer:
    """Valid tasks of one type, deduplicated by :func:`task_key`; sampled uniformly.
    Keys in ``forbidden`` (the held-out evaluation set) are never admitted."""

    def __init__(self, task_type: str, forbidden: set[str] | frozenset[str] = frozenset()):
        self.task_type = task_type
        self.forbidden = forbidden
        self.tasks: list[CodeTask] = []
        self._keys: set[str] = set()

    def __len__(self) -> int:
        return len(self.tasks)

    def is_forbidden(self, task: CodeTask) -> bool:
        return task_key(task) in self.forbidden

    def add(self, task: CodeTask) -> bool:
        """Add unless a task with the same key is in (or forbidden); True when added."""
        key = task_key(task)
        if key in self._keys or key in self.forbidden:
            return False
        self._keys.add(key)
        self.tasks.append(task)
        return True

    def sample(self, rng: random.Random, k: int, exclude: Sequence[CodeTask] = ()) -> list[CodeTask]:
        """``k`` distinct tasks (fewer when the buffer is small), none of ``exclude``."""
        skip = {id(t) for t in exclude}
        pool = [t for t in self.tasks if id(t) not in skip]
        return rng.sample(pool, min(k, len(pool)))

    def state_dict(self) -> list[dict[str, Any]]:
        return [t.to_dict() for t in self.tasks]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self.tasks, self._keys = [], set()
        for d in state:
            self.add(CodeTask.from_dict(d))


IDENTITY = "def f(x):\n    return x\n"


def seed_tasks(task_type: str, rng: random.Random, n_generated: int, n_inputs: int = 1) -> list[CodeTask]:
    """Unvalidated seeds: the identity (as in the paper) and ``n_generated`` of the project's
    generated programs (:func:`~lmselfplay.tasks.programs.python_program`). Induction seeds
    get ``n_inputs`` inputs each (the program's own plus inputs of other programs of the
    same kind: an int program gets ints)."""
    out = [CodeTask(task_type, IDENTITY, inputs_like(rng, "1", n_inputs), source="seed")]
    for _ in range(n_generated):
        p = python_program(rng)
        out.append(CodeTask(task_type, p["code"], inputs_like(rng, p["input"], n_inputs), source="seed"))
    return out


def inputs_like(rng: random.Random, first: str, n: int) -> list[str]:
    """``first`` plus ``n - 1`` fresh generated inputs of the same Python type."""
    kind = type(ast.literal_eval(first))
    out = [first]
    while len(out) < n:
        cand = python_program(rng)["input"]
        if type(ast.literal_eval(cand)) is kind and cand not in out:
            out.append(cand)
    return out


# --- the referee: two executors with different hash seeds ----------------------------

@dataclass
class Validation:
    """Why a proposal is (in)valid: ``status`` is an executor status, or ``format`` /
    ``nondeterministic`` / ``not-json`` for failures decided here."""

    valid: bool
    status: str
    reason: str = ""
    task: CodeTask | None = None


VALIDATION_STATUSES = (*STATUSES, "format", "nondeterministic", "not-json")


class CodeReferee:
    """Runs every phase's programs as one batch on each of two executors (hash seeds 0
    and 1, in parallel threads) and decides validity / correctness in this process."""

    def __init__(self, config: ExecutorConfig | None = None):
        base = config or ExecutorConfig()
        self.executors = [Executor(_with_seed(base, 0)), Executor(_with_seed(base, 1))]
        self.programs_run = 0
        self.seconds = 0.0

    def close(self) -> None:
        for ex in self.executors:
            ex.close()

    def __enter__(self) -> CodeReferee:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, tasks: list[Program], both: bool) -> list[list[ExecResult]]:
        """``tasks`` on executor 0 (and 1 when ``both``), one ``run_batch`` each, timed."""
        t0 = time.perf_counter()
        out: list[list[ExecResult]] = [[], []]

        def go(k):
            out[k] = self.executors[k].run_batch(tasks, progress=False)

        threads = [threading.Thread(target=go, args=(k,)) for k in range(2 if both else 1)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.seconds += time.perf_counter() - t0
        self.programs_run += len(tasks) * len(threads)
        return out

    def validate(self, proposals: Sequence[tuple[str, Proposal]]) -> list[Validation]:
        """Step 2: every (task type, parsed proposal) -> :class:`Validation`."""
        results: list[Validation | None] = [None] * len(proposals)
        tasks, where = [], []
        for i, (_, p) in enumerate(proposals):
            if p.error:
                results[i] = Validation(False, "format", p.error)
                continue
            for j, text in enumerate(p.inputs):
                tasks.append(Program(p.program, entry=ENTRY, args=check_input(text)[0]))
                where.append((i, j))
        first, second = self._run(tasks, both=True) if tasks else ([], [])
        runs: dict[int, list[tuple[ExecResult, ExecResult]]] = {}
        for (i, _), a, b in zip(where, first, second):
            runs.setdefault(i, []).append((a, b))
        for i, pairs in runs.items():
            tt, p = proposals[i]
            results[i] = _judge(tt, p, pairs)
        return results  # type: ignore[return-value]

    def check(self, items: Sequence[tuple[CodeTask, str]]) -> list[tuple[float, str]]:
        """Step 3: every (task, solver text) -> (1.0 right / 0.0 wrong, status), where
        status is ``format`` for an unparsable answer, else the worst executor status of
        its runs (``ok`` when every run returned). One batch for all answers."""
        out: list[tuple[float, str] | None] = [None] * len(items)
        tasks, where = [], []
        for i, (task, text) in enumerate(items):
            value, err = parse_answer(task.task_type, text)
            if err:
                out[i] = (0.0, "format")
            elif task.task_type == "deduction":
                out[i] = (float(values_equal(value, task.outputs[0])), "ok")
            elif task.task_type == "abduction":
                tasks.append(Program(task.program, entry=ENTRY, args=value))
                where.append((i, task.outputs[0]))
            else:
                for inp, want in task.held_out_pairs():
                    tasks.append(Program(value, entry=ENTRY, args=check_input(inp)[0]))
                    where.append((i, want))
        results = self._run(tasks, both=False)[0] if tasks else []
        verdict: dict[int, list[tuple[bool, str]]] = {}
        for (i, want), r in zip(where, results):
            verdict.setdefault(i, []).append((r.ok and values_equal(r.value, want), r.status))
        for i, v in verdict.items():
            status = next((s for _, s in v if s != "ok"), "ok")
            out[i] = (float(all(ok for ok, _ in v)), status)
        return out  # type: ignore[return-value]


def _with_seed(cfg: ExecutorConfig, seed: int) -> ExecutorConfig:
    return replace(cfg, hash_seed=seed)


def _judge(task_type: str, p: Proposal, pairs: list[tuple[ExecResult, ExecResult]]) -> Validation:
    for a, b in pairs:
        if not a.ok or not b.ok:
            bad = a if not a.ok else b
            return Validation(False, bad.status, (bad.error or bad.status)[:200])
        if not values_equal(a.value, b.value):
            return Validation(False, "nondeterministic", "two runs disagree")
        if not json_representable(a.value):
            return Validation(False, "not-json", f"output {a.value_repr[:60]} is not JSON-representable")
    task = CodeTask(task_type, p.program, list(p.inputs), [a.value for a, _ in pairs], p.message)
    return Validation(True, "ok", task=task)


def status_counts(statuses: Sequence[str]) -> dict[str, int]:
    """Count of each status in :data:`VALIDATION_STATUSES` (zeros included)."""
    return {s: sum(1 for x in statuses if x == s) for s in VALIDATION_STATUSES}
