"""Benchmark-path throughput vs one flat batched ``generate``, and the default suite's time.

A. the benchmark path: ``evaluate_suite`` on the default reasoning suite (prompt building,
   one stream of chunked greedy engine calls, extraction, reasoning-gym scoring);
B. the limit: the same prompt ids through ONE ``engine.generate`` call with the same
   sampling settings (the engine splits it into its own batches), nothing else.
Rounds of A and B alternate so both see the same background load. Prints problems/s and
A/B (goal >= 0.8) in wall time and in CPU time (the latter does not depend on what else a
shared machine runs). Then (unless ``--skip-default``) times the default evaluation: the
reasoning suite plus HumanEval greedy pass@1 (164 programs in the sandbox), and prints
its table (goal: under 5 minutes on 2 cores with the embedded model).

    python benchmarks/bench_eval_throughput.py [--model PATH] [--rounds 3] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import time

import torch

from lmselfplay.eval import humaneval
from lmselfplay.eval.reasoning import build_problems, evaluate_suite, load_suite, prompt_text
from lmselfplay.eval.report import render
from lmselfplay.lm.engines import HFEngine, SamplingParams
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.models.policy import load_policy
from lmselfplay.utils.results import results_dir
from lmselfplay.verifiers.answers import get_rule

RESULTS = results_dir()  # benchmarks/results unless LMSELFPLAY_RESULTS_DIR says otherwise


def clock() -> tuple[float, float]:
    """(wall, CPU) seconds: CPU of this process (all threads) and of reaped children (the
    sandbox), which does not depend on what else the shared machine runs."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), time.process_time() + ru.ru_utime + ru.ru_stime


def since(t0: tuple[float, float]) -> tuple[float, float]:
    t1 = clock()
    return t1[0] - t0[0], t1[1] - t0[1]


def flat_generate(engine, tok, suite) -> tuple[float, float]:
    """(wall, CPU) seconds for the suite's prompts through one plain generate call."""
    problems = build_problems(suite)
    prompts = [encode_prompt(tok, prompt_text(p, suite.answer_format)) for p in problems]
    sp = SamplingParams(max_new_tokens=suite.max_new_tokens, temperature=0.0,
                        stop=list(get_rule(suite.answer_format).stop))
    t = clock()
    engine.generate(prompts, sp)
    return since(t)


def bench_path(engine, tok, suite) -> tuple[float, float]:
    t = clock()
    evaluate_suite(engine, tok, suite)
    return since(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the embedded model")
    ap.add_argument("--suite", default="default")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU time = one core's time)")
    ap.add_argument("--skip-default", action="store_true", help="only the throughput ratio")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_policy(model_name_or_path=args.model, device="cpu")
    engine = HFEngine(model, tok, max_batch_size=args.batch_size)
    suite = load_suite(args.suite)
    n = sum(t.size for t in suite.tasks)
    build_problems(suite)  # reasoning-gym datasets are built once per process (cached)
    a, b = [], []
    for r in range(args.rounds):
        a.append(bench_path(engine, tok, suite))
        b.append(flat_generate(engine, tok, suite))
        print(f"round {r}: benchmark path {a[-1][0]:.1f} s wall / {a[-1][1]:.1f} s CPU, "
              f"flat generate {b[-1][0]:.1f} s wall / {b[-1][1]:.1f} s CPU")
    wa, wb = (statistics.median(x[0] for x in v) for v in (a, b))
    ca, cb = (statistics.median(x[1] for x in v) for v in (a, b))
    out = {"suite": suite.name, "problems": n, "batch_size": args.batch_size, "threads": args.threads,
           "max_new_tokens": suite.max_new_tokens, "rounds": args.rounds,
           "path_problems_per_s": n / wa, "flat_problems_per_s": n / wb, "ratio_wall": wb / wa,
           "path_problems_per_cpu_s": n / ca, "flat_problems_per_cpu_s": n / cb, "ratio_cpu": cb / ca,
           "seconds_path": a, "seconds_flat": b, "machine": platform.machine(),
           "load_average": os.getloadavg()}
    print(f"\nproblems/s   A benchmark path {n / wa:.2f} | B flat generate {n / wb:.2f} | "
          f"A/B = {wb / wa:.2f} (goal >= 0.8)")
    print(f"problems/CPU-s A {n / ca:.2f} | B {n / cb:.2f} | A/B = {cb / ca:.2f}   "
          f"(load average {os.getloadavg()[0]:.1f})")
    if not args.skip_default:
        t0 = clock()
        res = evaluate_suite(engine, tok, suite)
        r_wall, r_cpu = since(t0)
        t1 = clock()
        he = humaneval.evaluate_humaneval(engine, tok)
        h_wall, h_cpu = since(t1)
        print()
        print(render(res, None, "reasoning"))
        print(render(he, None, "humaneval"))
        print(f"\ndefault evaluation: reasoning {r_wall:.1f} s wall / {r_cpu:.1f} s CPU + HumanEval "
              f"{h_wall:.1f} s wall / {h_cpu:.1f} s CPU = {r_wall + h_wall:.1f} s wall / "
              f"{r_cpu + h_cpu:.1f} s CPU (goal < 300 s on 2 cores)")
        out["default_eval"] = {"reasoning_wall_s": r_wall, "reasoning_cpu_s": r_cpu,
                               "humaneval_wall_s": h_wall, "humaneval_cpu_s": h_cpu,
                               "reasoning": res["greedy"], "humaneval": he["greedy"]}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "eval_throughput.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
