"""Scaling the rollouts, measured on the client side with simulated servers (this machine has
2 cores): each server (``tests/sim_server.py``, HTTP on 127.0.0.1) answers a
completion after ``token_delay`` seconds per token, burning no CPU, decoding up to
``max_batch`` requests at once like vLLM's batch. Two measurements, side by side in one run:

1. generation throughput with N = 1, 2, 4 servers behind one engine (target: >= 0.9 N times
   one server's);
2. steps/s of a real training loop (PolicyTrainer on the tiny model) with ``max_staleness`` 1 vs
   0 (target >= 1.6x), when the simulated decoding and the training take the same time IN the
   loop: a calibration pass of the same on-policy loop (no delay) times its training step, and
   the per-token delay is sized so that a step's decoding lasts that long; the client's and
   server's own time per generation comes on top. Every loop reports the generation and
   training times it actually had, and the speedup is set against the ideal for the on-policy
   loop's ratio ((gen + train) / max(gen, train): 2.0 at equal times). The same steps, batch and delay both ways, alternated over rounds (the median
   round is reported); also the samples dropped as too stale (0 expected at k = 1).

    python benchmarks/bench_scale.py            # ~2 minutes; benchmarks/results/bench_scale.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from sim_server import ServerProcess  # noqa: E402

from lmselfplay.lm.engines.base import SamplingParams  # noqa: E402
from lmselfplay.lm.engines.vllm_server import VLLMServerEngine  # noqa: E402
from lmselfplay.lm.trajectory import Sample  # noqa: E402
from lmselfplay.rl.overlap import OverlappedRollouts  # noqa: E402
from lmselfplay.utils.results import save_results  # noqa: E402


class _Tok:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def sim_process(token_delay: float, max_batch: int = 256, vocab: int = 997) -> ServerProcess:
    """A simulated server in its own process."""
    return ServerProcess("sim_server", "--token_delay", str(token_delay),
                         "--max_batch", str(max_batch), "--vocab", str(vocab))


class NoWeights:
    """The push's transfer step for a server in another process: nothing sent (the simulated
    answers do not depend on weights there); the protocol's HTTP steps all run."""

    needs_cuda = False

    def open_fns(self, info):
        return {}, lambda: None

    def update_info(self):
        return {}

    def send(self, bucket):
        pass


def engine_on(servers, tok=None) -> VLLMServerEngine:
    return VLLMServerEngine(tok or _Tok(), [s.url for s in servers], timeout=60, backoff=0.05, max_concurrency=256,
                            channel_factory=lambda url, i: NoWeights())


def throughput(n_servers: int, prompts: int, tokens: int, delay: float, batch: int) -> float:
    sims = [sim_process(delay, max_batch=batch) for _ in range(n_servers)]
    try:
        eng = engine_on(sims)
        sp = SamplingParams(max_new_tokens=tokens, temperature=1.0, seed=0)
        eng.generate([[1, 2, 3]] * 4, sp)  # warm the connections and threads
        t0 = time.perf_counter()
        outs = eng.generate([[1, 2, k] for k in range(prompts)], sp)
        dt = time.perf_counter() - t0
        return sum(len(o.token_ids) for o in outs) / dt
    finally:
        for s in sims:
            s.close()


def training_loop(max_staleness: int, steps: int, batch: int, tokens: int, delay: float) -> dict[str, float]:
    """The loop of a recipe (rollouts through OverlappedRollouts, PolicyTrainer.step) on a
    simulated server answering after ``delay`` s per token. Timed from the end of the first step
    (the warm-up, which no setting can overlap) to the end: steps/s, and per step the wall time
    of the training step, of the generation (wherever it ran) and of the wait for it + the push."""
    from lm_fixtures import tiny_model, tiny_tokenizer

    from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig

    tok = tiny_tokenizer()
    trainer = PolicyTrainer(tiny_model(seed=0), tok, TrainerConfig(num_iterations=2, beta=0.0, learning_rate=1e-3,
                                                                   merge_identical=False))
    sim = sim_process(delay, vocab=len(tok))
    gen_s: list[float] = []
    try:
        eng = engine_on([sim], tok)
        sp = SamplingParams(max_new_tokens=tokens, temperature=1.0)

        def generate(step: int) -> list[Sample]:
            t = time.perf_counter()
            sp.seed = step
            outs = eng.generate([[5, 6, 7, k % 50 + 10] for k in range(batch)], sp)
            gen_s.append(time.perf_counter() - t)
            return [Sample(o.prompt_ids, o.token_ids, o.logprobs, advantage=(-1.0) ** k, policy_version=o.version)
                    for k, o in enumerate(outs)]

        eng.update_weights(trainer.unwrapped, version=0)
        rollouts = OverlappedRollouts(lambda step: lambda: generate(step), max_staleness, eng,
                                      serving=lambda: trainer.serving(eng))
        dropped, metrics, train_s, wait_s, t0 = 0.0, {}, [], [], 0.0
        for step in range(steps):
            if step == 1:
                t0 = time.perf_counter()
            t1 = time.perf_counter()
            samples, m = rollouts.next_batch(step, trainer.step_count, last_step=steps - 1)
            wait_s.append(time.perf_counter() - t1)
            dropped += m.get("staleness/dropped", 0.0)
            t1 = time.perf_counter()
            metrics = trainer.step(samples, engine=eng)
            train_s.append(time.perf_counter() - t1)
        dt = time.perf_counter() - t0
        rollouts.close()
        eng.close()
    finally:
        sim.close()
    def steady(xs: list[float]) -> float:  # the first step (warm-up) left out
        return sum(xs[1:]) / len(xs[1:])

    return {"steps_per_s": (steps - 1) / dt, "dropped": dropped, "final_loss": metrics.get("loss", float("nan")),
            "train_s_per_step": steady(train_s), "generation_s_per_step": steady(gen_s),
            "rollout_wait_s_per_step": steady(wait_s), "gen_over_train": steady(gen_s) / steady(train_s)}


def calibrate(steps: int, batch: int, tokens: int) -> tuple[float, dict]:
    """The per-token delay at which the simulated decoding of a step lasts as long as the
    training step does IN the loop: a pass of the same on-policy loop with no delay times its
    training (and the client's and server's own time per generation, which comes on top)."""
    r = training_loop(0, steps, batch, tokens, 0.0)
    return r["train_s_per_step"] / tokens, r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--token_delay", type=float, default=0.01)
    ap.add_argument("--max_batch", type=int, default=8, help="requests one simulated server decodes at once")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--calibration_steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3, help="max_staleness 0 and 1 loops, alternated; the median")
    ap.add_argument("--train_batch", type=int, default=64)
    ap.add_argument("--train_tokens", type=int, default=16)
    ap.add_argument("--out_dir", default=None)
    ap.add_argument("--torch_threads", type=int, default=1,
                    help="intra-op threads of the training (1: a spinning OpenMP pool would fight the client's threads)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.torch_threads)
    tput = {n: throughput(n, args.prompts, args.tokens, args.token_delay, args.max_batch) for n in (1, 2, 4)}
    for n, v in tput.items():
        print(f"{n} server(s): {v:8.0f} tok/s  = {v / tput[1]:.2f} x one server (target >= {0.9 * n:.1f})")
    load_before = list(os.getloadavg())
    delay, cal = calibrate(args.calibration_steps, args.train_batch, args.train_tokens)
    print(f"calibration (on-policy, no delay): train {cal['train_s_per_step']:.3f} s/step, the client's and "
          f"server's own time per generation {cal['generation_s_per_step']:.3f} s")
    print(f"simulated decoding: {delay * 1e3:.2f} ms/token = {delay * args.train_tokens:.3f} s per step (= training)")
    rounds = []
    for _ in range(args.rounds):  # alternated, so that a change of the machine's load hits both settings
        rounds.append({k: training_loop(k, args.steps, args.train_batch, args.train_tokens, delay) for k in (0, 1)})
    for i, loops in enumerate(rounds):
        for k, r in loops.items():
            print(f"round {i} max_staleness {k}: {r['steps_per_s']:.2f} steps/s, train {r['train_s_per_step']:.3f} "
                  f"s/step, generation {r['generation_s_per_step']:.3f} s/step (gen/train "
                  f"{r['gen_over_train']:.2f}), waiting for rollouts + push {r['rollout_wait_s_per_step']:.3f} s/step, "
                  f"dropped {r['dropped']:.0f}, final loss {r['final_loss']:.4f}")
    ratios = [loops[1]["steps_per_s"] / loops[0]["steps_per_s"] for loops in rounds]
    median = sorted(range(len(rounds)), key=lambda i: ratios[i])[len(rounds) // 2]
    med, speedup = rounds[median], ratios[median]
    g, t = med[0]["generation_s_per_step"], med[0]["train_s_per_step"]
    ideal = (g + t) / max(g, t)  # a perfect overlap of the on-policy loop's own generation and training
    print(f"max_staleness 1 / 0 = {speedup:.2f}x steps/s (median of rounds {', '.join(f'{x:.2f}' for x in ratios)}; "
          f"target >= 1.6); ideal at the on-policy gen/train {g / t:.2f}: {ideal:.2f}x -> {speedup / ideal:.0%} of it, "
          f"{speedup / 2:.0%} of 2.0")
    save_results("bench_scale", {
        "throughput_tok_s": {str(n): v for n, v in tput.items()},
        "throughput_over_one": {str(n): v / tput[1] for n, v in tput.items()},
        "token_delay_s": delay, "calibration": cal,
        "rounds": [{str(k): r for k, r in loops.items()} for loops in rounds],
        "max_staleness": {str(k): r for k, r in med.items()}, "staleness1_over_0": speedup,
        "staleness1_over_0_rounds": ratios, "ideal_for_measured_gen_train": ideal,
        "fraction_of_ideal": speedup / ideal, "fraction_of_2x": speedup / 2,
        "load_average_1_5_15_before": load_before, "load_average_1_5_15": list(os.getloadavg()),
        "args": vars(args)}, args.out_dir)


if __name__ == "__main__":
    main()
