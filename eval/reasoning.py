"""Reasoning benchmarks from reasoning-gym, fully offline: suites, batched generation, scoring.

A *suite* is a YAML file (``eval/suites/NAME.yaml``, or any path)::

    name: default
    answer_format: answer        # a rule of lmselfplay.verifiers.answers
    max_new_tokens: 128
    tasks:
      - {name: chain_sum, size: 40, seed: 1302, config: {min_terms: 2, max_terms: 4}}

Every problem is ``reasoning_gym.create_dataset(name, size=, seed=, **config)[i]``, so a
suite is the same problems on every machine. The prompt is the question plus the answer
rule's instruction, encoded by the project's one formatter (``encode_prompt``); the
answer is the rule's extraction, scored by the task's own ``score_answer`` (a problem
counts as correct when its score is 1). Generation is one stream of engine calls over all
problems x samples (chunks of ``chunk_size``, longest prompts first), never one call per
problem. Greedy decoding gives pass@1; ``samples`` > 0 adds sampled pass@k.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmselfplay.lm.engines.base import SamplingParams
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.lm.stream import generate_stream
from lmselfplay.verifiers.answers import get_rule, with_instruction

from .report import summarize

SUITES_DIR = Path(__file__).resolve().parent / "suites"
# Longer extracted answers score 0 without reaching the task's scorer: some scorers are
# superlinear in the answer (propositional_logic parses 100k parentheses in ~11 s), and
# no reasoning-gym answer needs this much (a 30x30 ARC grid is ~1,800 characters).
MAX_ANSWER_CHARS = 4096


@dataclass
class TaskSpec:
    name: str
    size: int
    seed: int
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class Suite:
    name: str
    tasks: list[TaskSpec]
    answer_format: str = "answer"
    max_new_tokens: int = 128


@dataclass
class Problem:
    id: str  # "task/index"
    task: str
    question: str
    entry: dict[str, Any]
    dataset: Any = field(repr=False)

    def score(self, answer: str | None) -> float:
        """The task's own scorer; a scorer that fails on odd input scores 0, and so does an
        answer over ``MAX_ANSWER_CHARS``."""
        if answer is not None and len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        try:
            s = float(self.dataset.score_answer(answer, self.entry))
        except Exception:
            return 0.0
        return s if 0.0 <= s <= 1.0 else 0.0


def _int_field(d: dict, key: str, where: str) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < (1 if key == "size" else 0):
        raise ValueError(f"{where}: '{key}' must be a {'positive' if key == 'size' else 'non-negative'} "
                         f"integer, got {v!r}")
    return v


def load_suite(name_or_path: str | Path) -> Suite:
    """A suite by name (``eval/suites/NAME.yaml``) or by path; clear errors for bad files."""
    import yaml

    p = Path(name_or_path)
    if not p.is_file():
        p = SUITES_DIR / f"{name_or_path}.yaml"
        if not p.is_file():
            known = ", ".join(sorted(q.stem for q in SUITES_DIR.glob("*.yaml")))
            raise FileNotFoundError(f"no suite {str(name_or_path)!r} (a path or one of: {known})")
    try:
        d = yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"suite {p}: not valid YAML: {e}") from None
    if not isinstance(d, dict) or not isinstance(d.get("tasks"), list) or not d["tasks"]:
        raise ValueError(f"suite {p}: needs a non-empty list 'tasks'")
    unknown = set(d) - {f.name for f in dataclasses.fields(Suite)}
    if unknown:
        raise ValueError(f"suite {p}: unknown keys {sorted(unknown)}")
    tasks = []
    for i, t in enumerate(d["tasks"]):
        where = f"suite {p}, task {i}"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ValueError(f"{where}: needs a 'name'")
        extra = set(t) - {"name", "size", "seed", "config"}
        if extra or not isinstance(t.get("config", {}), dict):
            raise ValueError(f"{where}: unknown keys {sorted(extra)} or 'config' not a mapping")
        tasks.append(TaskSpec(t["name"], _int_field(t, "size", where), _int_field(t, "seed", where),
                              dict(t.get("config") or {})))
    suite = Suite(name=str(d.get("name", p.stem)), tasks=tasks,
                  answer_format=str(d.get("answer_format", "answer")),
                  max_new_tokens=_int_field({"m": d.get("max_new_tokens", 128)}, "m", f"suite {p}"))
    get_rule(suite.answer_format)  # unknown rule -> ValueError now, not after generation
    return suite


@functools.lru_cache(maxsize=64)
def _dataset(name: str, size: int, seed: int, config_json: str) -> Any:
    """Datasets are pure functions of their settings: built once per process (some, like
    gsm_symbolic, take seconds), so a callback every K steps does not rebuild them."""
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=size, seed=seed, **json.loads(config_json))


def build_problems(suite: Suite) -> list[Problem]:
    problems = []
    for t in suite.tasks:
        try:
            ds = _dataset(t.name, t.size, t.seed, json.dumps(t.config, sort_keys=True))
        except Exception as e:  # unknown task or bad difficulty settings
            raise ValueError(f"suite {suite.name}: reasoning-gym task {t.name!r}: {e}") from None
        for i in range(t.size):
            entry = ds[i]
            problems.append(Problem(f"{t.name}/{i}", t.name, entry["question"], entry, ds))
    return problems


def prompt_text(problem: Problem, answer_format: str) -> str:
    return with_instruction(problem.question, answer_format)


def score_texts(problems: Sequence[Problem], texts: Sequence[Sequence[str | None]],
                answer_format: str) -> list[dict[str, Any]]:
    """One record per problem (see :mod:`lmselfplay.eval.report`); ``None`` texts fail."""
    rule = get_rule(answer_format)
    records = []
    for p, outs in zip(problems, texts):
        answers = [rule.extract(t) if t is not None else None for t in outs]
        scores = [p.score(a) if a is not None else 0.0 for a in answers]
        records.append({"id": p.id, "task": p.task, "n": len(scores),
                        "correct": sum(s >= 1.0 for s in scores),
                        "mean_score": sum(scores) / max(1, len(scores)),
                        "answer": answers[0], "output": (outs[0] or "")[:2000]})
    return records


def evaluate_suite(engine: Any, tokenizer: Any, suite: Suite | str, samples: int = 0,
                   temperature: float = 0.8, top_p: float = 1.0, ks: Sequence[int] = (1, 5),
                   seed: int = 0, chunk_size: int | None = None,
                   max_new_tokens: int | None = None) -> dict[str, Any]:
    """Greedy pass@1 (always) and sampled pass@k (``samples`` > 0) of ``engine`` on a suite."""
    suite = load_suite(suite) if isinstance(suite, (str, Path)) else suite
    problems = build_problems(suite)
    rule = get_rule(suite.answer_format)
    prompts = [encode_prompt(tokenizer, prompt_text(p, suite.answer_format)) for p in problems]
    mnt = max_new_tokens or suite.max_new_tokens
    greedy = SamplingParams(max_new_tokens=mnt, temperature=0.0, stop=list(rule.stop))
    texts = generate_stream(engine, prompts, greedy, 1, chunk_size, desc=f"{suite.name} greedy")
    records = score_texts(problems, texts, suite.answer_format)
    result: dict[str, Any] = {"suite": suite.name, "answer_format": suite.answer_format,
                              "max_new_tokens": mnt, "greedy": summarize(records, (1,)),
                              "problems": records}
    if samples > 0:
        sp = SamplingParams(max_new_tokens=mnt, temperature=temperature, top_p=top_p,
                            stop=list(rule.stop), seed=seed)
        stexts = generate_stream(engine, prompts, sp, samples, chunk_size, desc=f"{suite.name} sampled")
        srec = score_texts(problems, stexts, suite.answer_format)
        result["sampled"] = summarize(srec, ks) | {"temperature": temperature, "n": samples}
    return result


def score_completions_file(suite: Suite | str, path: str | Path,
                           ks: Sequence[int] = (1, 5)) -> dict[str, Any]:
    """Score a JSONL of ``{"id": "task/index", "completion": ...}`` against a suite
    (rules of :mod:`lmselfplay.eval.completions`); no model involved."""
    from .completions import read_completions

    suite = load_suite(suite) if isinstance(suite, (str, Path)) else suite
    problems = build_problems(suite)
    cf = read_completions(path, [p.id for p in problems], id_key="id")
    records = score_texts(problems, [cf.samples[p.id] for p in problems], suite.answer_format)
    return {"suite": suite.name, "answer_format": suite.answer_format, "source": str(path),
            "completions": summarize(records, ks), "issues": cf.issues, "issue_counts": cf.counts,
            "problems": records}


def eval_callback(step: int, engine: Any, tokenizer: Any, suite: Suite | str | None,
                  eval_every: int, metrics: Any, **kwargs: Any) -> dict[str, float] | None:
    """For recipes (config ``eval_suite``, ``eval_every``; an empty suite or ``eval_every``
    <= 0 turns it off): every ``eval_every`` steps evaluate the
    current engine greedily on ``suite`` and append one row to the run's metrics —
    ``metrics`` is a :class:`lmselfplay.utils.metrics_logger.MetricsLogger` or a path to a JSONL file.
    Row keys: ``eval/<suite>/<task>/pass@1`` per task and ``eval/<suite>/pass@1`` overall."""
    if not suite or eval_every <= 0 or step % eval_every != 0:
        return None
    suite = load_suite(suite) if isinstance(suite, (str, Path)) else suite
    res = evaluate_suite(engine, tokenizer, suite, **kwargs)["greedy"]
    row = {f"eval/{suite.name}/{t}/pass@1": r["pass@1"] for t, r in res["tasks"].items()}
    row[f"eval/{suite.name}/pass@1"] = res["overall"]["pass@1"]
    row[f"eval/{suite.name}/mean_score"] = res["overall"]["mean_score"]
    if hasattr(metrics, "log"):
        metrics.log(step, row)
    else:
        path = Path(metrics)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:  # one whole line per write: a reader never sees half a row
            f.write(json.dumps({"step": int(step), **row}) + "\n")
    return row
