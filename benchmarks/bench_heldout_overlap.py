"""Is a positive-control gain measured on questions the model was pre-trained on? Held-out accuracy
of each model, split by whether the embedded model's corpus can hold the question.

A reasoning-gym task set's held-out items are the dataset of ``--heldout-seed``; the embedded
model's corpus draws the same task (in the default suite's settings, which can produce the same
questions) from training chunks of other seeds, minus the held-out bucket
(:func:`lmselfplay.tasks.task_sets.corpus_questions`). This prints, per model, greedy accuracy
with 95% Wilson intervals on all held-out items, on those no corpus chunk holds, and on those one
does, and writes them to ``benchmarks/results/NAME.json``.

    python benchmarks/bench_heldout_overlap.py --models embedded:v8 runs/rlvr/final_model
        [--task chain_sum] [--task-config '{"min_terms": 3, ...}'] [--heldout-size 500]
        [--max-new-tokens 16] [--name NAME]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from lmselfplay.lm.engines import SamplingParams, make_engine
from lmselfplay.lm.engines.factory import EngineConfig
from lmselfplay.models.policy import PolicyConfig, load_policy
from lmselfplay.rlvr.steps import generate
from lmselfplay.tasks.task_sets import SUITE_TASKS, TaskSet, corpus_questions
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.results import save_results
from lmselfplay.utils.stats import wilson
from lmselfplay.verifiers.task_referee import TaskReferee

RLVR_CHAIN_SUM = '{"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}'


def accuracy_parts(right: np.ndarray, in_corpus: np.ndarray) -> dict[str, dict[str, float]]:
    """Accuracy [95% CI] and n on all items, those the corpus cannot hold, those it can."""
    out = {}
    for part, mask in (("all", np.ones_like(in_corpus)), ("not_in_corpus", ~in_corpus), ("in_corpus", in_corpus)):
        k, n = int(right[mask].sum()), int(mask.sum())
        lo, hi = wilson(k, n) if n else (float("nan"), float("nan"))
        out[part] = {"accuracy": k / n if n else float("nan"), "ci_low": lo, "ci_high": hi, "n": n}
    return out


def greedy_right(model_path: str, items: list, max_new_tokens: int, referee: TaskReferee) -> np.ndarray:
    model, tok = load_policy(PolicyConfig(model_name_or_path=model_path), device="cpu")
    engine = make_engine(EngineConfig(), model, tok, answer_budget=max_new_tokens, temperature=1.0, top_p=1.0, seed=0)
    completions = generate(engine, tok, items, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, seed=0))
    return np.array([v.reward >= 1 for v in referee.score(items, [c.text for c in completions])])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["embedded:v8"])
    p.add_argument("--task", default="chain_sum", choices=sorted(SUITE_TASKS))
    p.add_argument("--task-config", default=RLVR_CHAIN_SUM)
    p.add_argument("--heldout-size", type=int, default=500)
    p.add_argument("--heldout-seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--name", default="heldout_overlap")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    items = TaskSet(f"reasoning_gym:{args.task}", args.heldout_size, task_config=json.loads(args.task_config),
                    heldout_seed=args.heldout_seed).heldout
    reachable = corpus_questions(args.task)
    in_corpus = np.array([t.question in reachable for t in items])
    print(f"{args.task}: {int(in_corpus.sum())} of {len(items)} held-out items are questions the corpus can hold")
    referee = TaskReferee(timeout_s=2.0)
    models = {}
    for path in args.models:
        models[path] = accuracy_parts(greedy_right(path, items, args.max_new_tokens, referee), in_corpus)
        print(f"{path}: " + "; ".join(f"{part} {r['accuracy']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] (n={r['n']})"
                                      for part, r in models[path].items()))
    referee.close()
    save_results(args.name, {"task": args.task, "task_config": json.loads(args.task_config),
                             "heldout_size": args.heldout_size, "in_corpus": int(in_corpus.sum()), "models": models})
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
