"""Benchmark-path throughput vs one flat batched ``generate``, and the default suite's time.

A. the benchmark path: ``evaluate_suite`` on the default reasoning suite (prompt building,
   one stream of chunked greedy engine calls, extraction, reasoning-gym scoring);
B. the limit: the same prompt ids through ONE ``engine.generate`` call with the same
   sampling settings (the engine splits it into its own batches), nothing else.
Rounds of A and B alternate so both see the same background load. Prints problems/s and
A/B (goal >= 0.8). Then (unless ``--skip-default``) times the default evaluation: the
reasoning suite plus HumanEval greedy pass@1 (164 programs in the sandbox), and prints
its table (goal: under 5 minutes on 2 cores with the embedded model).

    python benchmarks/bench_eval_throughput.py [--model PATH] [--rounds 3] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from lmselfplay.engines import HFEngine, SamplingParams
from lmselfplay.eval import humaneval
from lmselfplay.eval.reasoning import build_problems, evaluate_suite, load_suite, prompt_text
from lmselfplay.eval.report import render
from lmselfplay.policy import encode_prompt, load_policy
from lmselfplay.verifiers.answers import get_rule

RESULTS = Path(__file__).resolve().parent / "results"


def flat_generate(engine, tok, suite) -> float:
    """Seconds for the suite's prompts through one plain generate call."""
    problems = build_problems(suite)
    prompts = [encode_prompt(tok, prompt_text(p, suite.answer_format)) for p in problems]
    sp = SamplingParams(max_new_tokens=suite.max_new_tokens, temperature=0.0,
                        stop=list(get_rule(suite.answer_format).stop))
    t = time.perf_counter()
    engine.generate(prompts, sp)
    return time.perf_counter() - t


def bench_path(engine, tok, suite) -> float:
    t = time.perf_counter()
    evaluate_suite(engine, tok, suite)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the embedded model")
    ap.add_argument("--suite", default="default")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-default", action="store_true", help="only the throughput ratio")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_policy(model_name_or_path=args.model, device="cpu")
    engine = HFEngine(model, tok, max_batch_size=args.batch_size)
    suite = load_suite(args.suite)
    n = sum(t.size for t in suite.tasks)
    a, b = [], []
    for r in range(args.rounds):
        a.append(bench_path(engine, tok, suite))
        b.append(flat_generate(engine, tok, suite))
        print(f"round {r}: benchmark path {n / a[-1]:.1f} problems/s, flat generate {n / b[-1]:.1f} problems/s")
    pa, pb = n / statistics.median(a), n / statistics.median(b)
    out = {"suite": suite.name, "problems": n, "batch_size": args.batch_size, "threads": args.threads,
           "max_new_tokens": suite.max_new_tokens, "rounds": args.rounds,
           "benchmark_path_problems_per_s": pa, "flat_generate_problems_per_s": pb, "ratio": pa / pb,
           "seconds_path": a, "seconds_flat": b, "machine": platform.machine(),
           "cpu_threads": torch.get_num_threads()}
    print(f"\nA benchmark path {pa:.1f} problems/s | B flat generate {pb:.1f} problems/s | "
          f"A/B = {pa / pb:.2f} (goal >= 0.8)")
    if not args.skip_default:
        t0 = time.perf_counter()
        res = evaluate_suite(engine, tok, suite)
        t1 = time.perf_counter()
        he = humaneval.evaluate_humaneval(engine, tok)
        t2 = time.perf_counter()
        print()
        print(render(res, None, "reasoning"))
        print(render(he, None, "humaneval"))
        print(f"\ndefault evaluation: reasoning {t1 - t0:.1f} s + HumanEval {t2 - t1:.1f} s = "
              f"{t2 - t0:.1f} s (goal < 300 s)")
        out["default_eval"] = {"reasoning_s": t1 - t0, "humaneval_s": t2 - t1, "total_s": t2 - t0,
                               "reasoning": res["greedy"], "humaneval": he["greedy"]}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "eval_throughput.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
