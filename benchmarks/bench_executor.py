"""Executions per second of trivial programs: the sandbox vs a naive subprocess per task.

    .venv/bin/python benchmarks/bench_executor.py [--n 3000] [--naive-n 300] [--workers 2]
        [--modes namespaces,bwrap,unsafe-hooks-only]

Every sandbox mode this machine has (namespaces as root, bwrap where bubblewrap works, and
unsafe-hooks-only) and the naive side run the same trivial program with the same concurrency, in one run, interleaved
in rounds so that both see the same background load, and the script prints both rates and
their ratio (the goal: >= 200 executions/s on 2 cores, >= 5x naive). It also prints the
CPU time each execution costs (all processes involved), which does not depend on what else
the machine is doing, and the rate that cost allows on the CPUs given.
The naive side is what most code-RL repos do: ``subprocess.run([python, "-I", "-c", code])``
per task, the value read back from stdout; it has none of the sandbox's protections.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

from lmselfplay.utils.results import save_results
from lmselfplay.verifiers.executor import Executor, ExecutorConfig, Program

PROGRAM = "def f(x):\n    return [x * 2, str(x)]\n"


def zygote_cpu(ex: Executor) -> float:
    """CPU seconds of the zygote plus every child it reaped (utime, stime, cutime, cstime)."""
    with open(f"/proc/{ex.zygote_pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def host_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def naive_one(i: int) -> str:
    code = PROGRAM + f"print(repr(f({i})))"
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=30).stdout.strip()


class Side:
    def __init__(self):
        self.n, self.wall, self.cpu = 0, 0.0, 0.0


def sandbox_round(ex: Executor, lo: int, hi: int, side: Side, bar) -> None:
    tasks = [Program(PROGRAM, "f", (i,)) for i in range(lo, hi)]
    c0, h0, t0 = zygote_cpu(ex), host_cpu(), time.perf_counter()
    results = ex.run_batch(tasks, progress=False)
    side.wall += time.perf_counter() - t0
    side.cpu += zygote_cpu(ex) - c0 + host_cpu() - h0
    side.n += len(tasks)
    bad = [r for i, r in zip(range(lo, hi), results) if r.status != "ok" or r.value != [i * 2, str(i)]]
    assert not bad, f"wrong results: {bad[0]}"
    bar.update(len(tasks))


def naive_round(pool: ThreadPoolExecutor, lo: int, hi: int, side: Side, bar) -> None:
    def children_cpu():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    c0, h0, t0 = children_cpu(), host_cpu(), time.perf_counter()
    outs = list(pool.map(naive_one, range(lo, hi)))
    side.wall += time.perf_counter() - t0
    side.cpu += children_cpu() - c0 + host_cpu() - h0
    side.n += hi - lo
    assert outs == [repr([i * 2, str(i)]) for i in range(lo, hi)]
    bar.update(hi - lo)


def modes_here() -> list[str]:
    """Every sandbox mode this machine can run: namespaces needs root, bwrap bubblewrap."""
    from lmselfplay.verifiers.executor import bwrap_problem

    return (["namespaces"] if os.geteuid() == 0 else []) + ([] if bwrap_problem() else ["bwrap"]) + [
        "unsafe-hooks-only"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3000, help="tasks for the sandbox, per mode")
    ap.add_argument("--naive-n", type=int, default=300, help="tasks for the naive baseline")
    ap.add_argument("--workers", type=int, default=2, help="concurrency on both sides")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    ap.add_argument("--modes", default=",".join(modes_here()), help="comma-separated sandbox modes")
    args = ap.parse_args()

    load_before = os.getloadavg()[0]
    modes = [m for m in args.modes.split(",") if m]
    exs, startup = {}, {}
    for m in modes:
        t0 = time.perf_counter()
        exs[m] = Executor(ExecutorConfig(sandbox=m, max_workers=args.workers))
        startup[m] = time.perf_counter() - t0
    sides = {**{m: Side() for m in modes}, "naive": Side()}
    total = len(modes) * args.n + args.naive_n
    try:
        for e in exs.values():
            e.run_batch([Program(PROGRAM, "f", (i,)) for i in range(20)], progress=False)  # warm
        with ThreadPoolExecutor(args.workers) as pool, tqdm(total=total, desc="bench") as bar:
            for k in range(args.rounds):
                lo, hi = args.n * k // args.rounds, args.n * (k + 1) // args.rounds
                for m, e in exs.items():
                    sandbox_round(e, lo, hi, sides[m], bar)
                nlo = args.naive_n * k // args.rounds
                naive_round(pool, nlo, args.naive_n * (k + 1) // args.rounds, sides["naive"], bar)
    finally:
        for e in exs.values():
            e.close()

    cpus, load_after = os.cpu_count() or 1, os.getloadavg()[0]
    print(f"\nconcurrency {args.workers}, trivial program, {args.n} sandbox tasks per mode, "
          f"{args.naive_n} naive tasks, {args.rounds} interleaved rounds, {cpus} CPUs, load "
          f"average {load_before:.1f} before / {load_after:.1f} after")
    rates, cpu_per = {}, {}
    for name, s in sides.items():
        rates[name] = s.n / s.wall
        cpu_per[name] = s.cpu / s.n
        print(f"{name:18s}: {rates[name]:7.1f} exec/s measured   {1000 * cpu_per[name]:6.2f} CPU-ms/exec"
              f"   -> {cpus / cpu_per[name]:7.1f} exec/s if the {cpus} CPUs were free")
    out = {"exec_per_s": rates, "cpu_ms_per_exec": {k: 1000 * v for k, v in cpu_per.items()},
           "exec_per_s_if_cpus_free": {k: cpus / v for k, v in cpu_per.items()},
           "startup_s": startup, "modes": {}, "load_average_before": load_before,
           "load_average_after": load_after, "args": vars(args)}
    for m in modes:
        ratio, cpu_ratio = rates[m] / rates["naive"], cpu_per["naive"] / cpu_per[m]
        print(f"{m:18s}: {ratio:.1f}x naive measured exec/s, {cpu_ratio:.1f}x less CPU per exec; "
              f"startup {startup[m] * 1000:.0f} ms; protections: {', '.join(exs[m].protections)}")
        out["modes"][m] = {"over_naive": ratio, "cpu_ratio_naive_over_mode": cpu_ratio,
                           "protections": list(exs[m].protections)}
    print("goal: >= 200 exec/s and >= 5x naive in every mode")
    save_results("bench_executor", out)


if __name__ == "__main__":
    main()
