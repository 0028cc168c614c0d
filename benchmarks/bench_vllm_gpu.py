"""The vLLM path on one GPU, measured side by side (no timed tests). Installs nothing itself:

    pip install -e ".[vllm]"            # on the GPU machine, once
    python benchmarks/bench_vllm_gpu.py [--layers 33] [--prompts 256] [--new_tokens 64] [--syncs 20]

On a small real architecture built from config (no hub): Qwen2-0.5B's shape (hidden 896,
14 query / 2 KV heads, MLP 4864, biases on q/k/v, tied embeddings) with random bfloat16
weights and the embedded model's tokenizer recipe (byte-level BPE, ~1k tokens, trained here
in seconds). The small vocabulary drops ~135M embedding parameters, so the default 33 layers
(Qwen2-0.5B has 24) bring the count back to ~0.5B. It measures:

  1. generated tokens/s of the colocated vLLM engine vs the HF engine on the SAME batch
     (same prompts, same sampling, same max length)                          goal >= 10x
  2. a few real self-play steps (rollout with vLLM -> advantages -> PPO step -> weight push)
  3. weight-sync time per step (bucketed push + prefix-cache reset), 0.5B params  goal < 1 s
  4. the weight-sync check over ``--syncs`` steps with a push after each (should stay
     low), then ``--stale_steps`` steps whose push is skipped (should jump: the negative control)
  5. every step is TIS-corrected (``--tis_cap``, lmselfplay/rl/importance.py): ``tis/weight`` and
     ``tis/capped`` against the bf16 engine's log-probs, per step
  6. peak GPU memory (trainer + colocated engine), and whether sleep mode (``--sleep_mode``)
     slept once per step

Prints the ratios and writes JSON to ``benchmarks/results/vllm_gpu.json``. Without CUDA it
stops with a clear message; ``--allow_cpu`` runs the same flow on vLLM's CPU build with tiny
sizes to check the script's logic (its numbers mean nothing); ``--dry_run`` runs it on CPU with
tiny sizes and an HF engine holding its own copy of the weights in vLLM's place (no vLLM needed:
the tests run it so the script cannot rot).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from lmselfplay.lm.engines import HFEngine, SamplingParams, WeightSyncCheck
from lmselfplay.lm.trajectory import Sample

RESULTS = Path(__file__).resolve().parent / "results" / "vllm_gpu.json"


DRY_SIZES = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "mlp": 128, "prompts": 8, "new_tokens": 8,
             "selfplay_steps": 1, "episodes": 4, "syncs": 2, "sync_prompts": 4, "stale_steps": 1}


class DryRunEngine(HFEngine):
    """``--dry_run``: an HF engine on its own copy of the weights, pushed like vLLM's (timed)."""

    def __init__(self, model, tok):
        import copy

        from lmselfplay.lm.engines.weight_sync import SyncStats

        super().__init__(copy.deepcopy(model), tok)
        self.last_sync = SyncStats()

    def update_weights(self, model, version=None):
        from lmselfplay.lm.engines.weight_sync import SyncStats

        t = time.perf_counter()
        super().update_weights(model, version)
        self.last_sync = SyncStats(tensors=len(self.model.state_dict()), seconds=time.perf_counter() - t,
                                   bytes=sum(v.numel() * v.element_size() for v in self.model.state_dict().values()))

    def close(self):
        pass


def count_sleeps(engine) -> list[int]:
    """A live count of the engine's ``sleep`` calls that put it to sleep (sleep mode)."""
    count = [0]
    sleep = getattr(engine, "sleep", None)
    if sleep is None:
        return count

    def counted():
        count[0] += int(getattr(engine, "enable_sleep_mode", False) and not getattr(engine, "_asleep", True))
        sleep()
    engine.sleep = counted
    return count


def peak_memory_bytes(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def build_tokenizer(n_texts: int = 3000):
    """The embedded model's tokenizer recipe on a sample of its corpus (seconds, offline)."""
    from lmselfplay.models.pretrain import Corpus
    from lmselfplay.models.tiny import TinyConfig
    from lmselfplay.models.tokenizer import train_tokenizer

    cfg = TinyConfig()
    corpus = Corpus(cfg, random.Random(0))
    texts = []
    for _ in range(n_texts):
        prompt, answer, _ = corpus.sample()
        texts.append(prompt + "\n" + answer)
    return train_tokenizer(cfg, texts)


def build_model(tok, layers: int, hidden: int, heads: int, kv_heads: int, mlp: int, device: str, dtype):
    """Qwen2-0.5B-shaped causal LM with random weights (vocab: the tokenizer's, padded to 64)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab = (len(tok) + 63) // 64 * 64
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def game_prompts(tok, n: int, seed: int = 0) -> list[list[int]]:
    """Formatted observation prompts of random positions of the three text games."""
    from lmselfplay.games import make
    from lmselfplay.games.base import random_legal_reset
    from lmselfplay.lm.prompt import encode_prompt

    rng = random.Random(seed)
    games = [make(g) for g in ("nim", "tictactoe", "kuhn_poker")]
    out = []
    while len(out) < n:
        g = games[len(out) % 3]
        s = random_legal_reset(g, rng, 4)
        if not g.is_terminal(s) and g.current_player(s) >= 0:
            out.append(encode_prompt(tok, g.observation_text(s, g.current_player(s))))
    return out


def tokens_per_second(engine, prompts, sp, repeats: int = 2) -> tuple[float, int]:
    """Best of ``repeats`` timed calls (after one warm-up call on a slice)."""
    engine.generate(prompts[:8], sp)
    best, n = 0.0, 0
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        outs = engine.generate(prompts, sp)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        n = sum(len(o.token_ids) for o in outs)
        best = max(best, n / (time.perf_counter() - t))
    return best, n


def selfplay_steps(engine, trainer, tok, steps: int, episodes: int, max_new_tokens: int) -> list[dict]:
    """Steps 1-6 of recipes/selfplay_games.py with the vLLM engine (mirror self-play)."""
    from lmselfplay.games import make
    from lmselfplay.games.text import MOVE_STOP
    from lmselfplay.lm.rollout import Episode, LLMPlayer, RolloutStats, play_episodes
    from lmselfplay.rl.advantages import RoleBaselines

    me = LLMPlayer(engine, tok, learner=True)
    baselines = RoleBaselines(0.9)
    games = [make(g) for g in ("nim", "tictactoe", "kuhn_poker")]
    rows = []
    for step in range(steps):
        sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, stop=MOVE_STOP, seed=1000 + step)
        eps = [Episode(games[i % 3], (me, me), seed=step * 10_000 + i) for i in range(episodes)]
        stats = RolloutStats()
        t = time.perf_counter()
        finished = list(play_episodes(eps, sp, concurrency=episodes, stats=stats))
        t_roll = time.perf_counter() - t
        trajs = [tr for f in finished for tr in f.trajectories]
        adv = baselines.advantages([tr.role for tr in trajs], [tr.reward for tr in trajs])
        samples = [s for tr, a in zip(trajs, adv) for s in tr.samples(float(a))]
        t = time.perf_counter()
        metrics = trainer.step(samples, engine=engine)
        t_train = time.perf_counter() - t
        engine.update_weights(trainer.unwrapped, version=trainer.step_count)
        rows.append({"step": step + 1, "rollout_s": t_roll, "train_s": t_train, "sync_s": engine.last_sync.seconds,
                     "generated_tokens": stats.generated_tokens, "invalid_rate": stats.as_dict()["invalid_rate"],
                     "samples": len(samples), "logprob_diff": metrics.get("logprob_diff", float("nan")),
                     "tis_weight": metrics.get("tis/weight", float("nan")),
                     "tis_capped": metrics.get("tis/capped", float("nan"))})
        print(f"  self-play step {step + 1}: {stats.generated_tokens} tokens in {t_roll:.2f} s, "
              f"train {t_train:.2f} s, sync {engine.last_sync.seconds:.3f} s, "
              f"logprob_diff {rows[-1]['logprob_diff']:.4f}", flush=True)
    return rows


def sync_series(engine, trainer, prompts, syncs: int, new_tokens: int, threshold: float, stale_steps: int) -> dict:
    """``syncs`` x (generate -> PPO step -> push): the detector and the push time each step;
    then ``stale_steps`` steps without a push, and the rollout after them (the negative control)."""
    detector = WeightSyncCheck(threshold=threshold)

    def rollout(seed):
        outs = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=seed))
        return [Sample(o.prompt_ids, o.token_ids, o.logprobs, advantage=1.0 if i % 2 else -1.0)
                for i, o in enumerate(outs) if o.token_ids]

    diffs, secs, bytes_ = [], [], 0
    for k in range(syncs):
        m = trainer.step(rollout(seed=k), engine=engine)
        diffs.append(m["logprob_diff"])
        detector.check(m["logprob_diff"], k)
        engine.update_weights(trainer.unwrapped, version=trainer.step_count)
        secs.append(engine.last_sync.seconds)
        bytes_ = engine.last_sync.bytes
    for k in range(stale_steps):  # ... and these pushes are skipped
        trainer.step(rollout(seed=syncs + k), engine=engine)
    stale = trainer.step(rollout(seed=syncs + stale_steps), engine=engine)["logprob_diff"]
    engine.update_weights(trainer.unwrapped, version=trainer.step_count)
    return {"logprob_diff": diffs, "sync_s": secs, "sync_bytes": bytes_, "stale_logprob_diff": stale,
            "stale_steps": stale_steps,
            "threshold": threshold, "max_synced": max(diffs), "stale_over_threshold": stale > threshold}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=33)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv_heads", type=int, default=2)
    ap.add_argument("--mlp", type=int, default=4864)
    ap.add_argument("--prompts", type=int, default=256, help="batch for the tokens/s comparison")
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--selfplay_steps", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=96)
    ap.add_argument("--syncs", type=int, default=20)
    ap.add_argument("--sync_prompts", type=int, default=64)
    ap.add_argument("--learning_rate", type=float, default=1e-4,
                    help="large enough that one Adam step moves bf16 weights (ulp ~1e-4 at 0.02)")
    ap.add_argument("--stale_steps", type=int, default=4, help="negative control: steps without a push")
    ap.add_argument("--threshold", type=float, default=0.1, help="weight_sync_threshold")
    ap.add_argument("--gpu_memory_utilization", type=float, default=0.35)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--allow_cpu", action="store_true", help="logic check on vLLM's CPU build (tiny sizes)")
    ap.add_argument("--dry_run", action="store_true", help="CPU, tiny sizes, an HF engine in vLLM's place")
    ap.add_argument("--tis_cap", type=float, default=2.0, help="truncated importance sampling cap of every step")
    ap.add_argument("--sleep_mode", action="store_true", help="colocated engine with sleep mode on")
    args = ap.parse_args(argv)
    if args.dry_run:
        for k, v in DRY_SIZES.items():
            setattr(args, k, v)

    if not torch.cuda.is_available() and not (args.allow_cpu or args.dry_run):
        print("bench_vllm_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False here); run it on a GPU "
              "machine after `pip install -e \".[vllm]\"` (--allow_cpu only checks the logic on vLLM's CPU build)",
              file=sys.stderr)
        return 2
    from lmselfplay.rl.trainer import PolicyTrainer, SurrogateConfig, TrainerConfig

    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tok = build_tokenizer(300 if args.dry_run else 3000)
    model = build_model(tok, args.layers, args.hidden, args.heads, args.kv_heads, args.mlp, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: Qwen2-0.5B-shaped, {args.layers} layers, vocab {model.config.vocab_size}, "
          f"{n_params / 1e6:.0f}M parameters, {dtype}, {device}", flush=True)
    trainer = PolicyTrainer(model, tok, TrainerConfig(learning_rate=args.learning_rate, beta=0.0, num_iterations=1,
                                                      max_grad_norm=1.0, merge_identical=False),
                            surrogate=SurrogateConfig(tis_cap=args.tis_cap))
    t = time.perf_counter()
    if args.dry_run:
        engine, version = DryRunEngine(trainer.unwrapped, tok), "none (dry run: HF engine with its own weights)"
    else:
        from lmselfplay.lm.engines.vllm import VLLMEngine, require_vllm

        version = require_vllm().__version__
        engine = VLLMEngine(trainer.unwrapped, tok, gpu_memory_utilization=args.gpu_memory_utilization,
                            logprobs_mode="raw_logprobs", max_model_len=1024, enforce_eager=device == "cpu",
                            enable_sleep_mode=args.sleep_mode)
    t_build = time.perf_counter() - t
    sleeps = count_sleeps(engine)
    hf = HFEngine(trainer.unwrapped, tok, max_batch_size=args.prompts)
    print(f"vLLM {version} engine built in {t_build:.1f} s (first push {engine.last_sync.seconds:.3f} s)",
          flush=True)

    # 1. tokens/s on the same batch
    prompts = game_prompts(tok, args.prompts)
    sp = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
    vllm_tps, vllm_n = tokens_per_second(engine, prompts, sp)
    hf_tps, hf_n = tokens_per_second(hf, prompts, sp, repeats=1)
    print(f"tokens/s on {len(prompts)} prompts x {args.new_tokens} new tokens: vLLM {vllm_tps:,.0f} "
          f"({vllm_n} tokens) | HF {hf_tps:,.0f} ({hf_n} tokens) | ratio {vllm_tps / hf_tps:.1f}x (goal >= 10x)",
          flush=True)
    # the protocol's invariant on this model: vLLM's behaviour log-probs vs teacher forcing
    outs = engine.generate(prompts[:32], sp)
    ref = hf.score([o.prompt_ids for o in outs], [o.token_ids for o in outs])
    inv = statistics.fmean(abs(a - b) for o, r in zip(outs, ref) for a, b in zip(o.logprobs, r))
    print(f"mean |vLLM generate - HF score| log-prob: {inv:.4f}", flush=True)

    # 2. self-play steps, 3. sync time, 4. the detector
    rows = selfplay_steps(engine, trainer, tok, args.selfplay_steps, args.episodes, 12)
    series = sync_series(engine, trainer, game_prompts(tok, args.sync_prompts, seed=1), args.syncs, 16,
                         args.threshold, args.stale_steps)
    sync_med = statistics.median(series["sync_s"])
    per_half_b = sync_med * 0.5e9 / n_params
    print(f"weight sync over {args.syncs} steps: median {sync_med:.3f} s, max {max(series['sync_s']):.3f} s for "
          f"{series['sync_bytes'] / 2**20:.0f} MiB ({per_half_b:.3f} s per 0.5B params; goal < 1 s)")
    print(f"detector with a push every step: max {series['max_synced']:.4f}, mean "
          f"{statistics.fmean(series['logprob_diff']):.4f} (threshold {args.threshold}); "
          f"{args.stale_steps} skipped pushes: {series['stale_logprob_diff']:.4f} "
          f"({'tripped' if series['stale_over_threshold'] else 'NOT tripped'}; "
          f"{series['stale_logprob_diff'] / max(statistics.fmean(series['logprob_diff']), 1e-12):.1f}x the synced mean)")
    tis = [r["tis_weight"] for r in rows]
    print(f"TIS (cap {args.tis_cap}) on every step: mean weight per self-play step {[round(x, 4) for x in tis]}, "
          f"capped share {[round(r['tis_capped'], 4) for r in rows]}")
    peak = peak_memory_bytes(device)
    steps_run = args.selfplay_steps + args.syncs + args.stale_steps + 1
    print(f"peak memory ({'GPU allocated' if device == 'cuda' else 'process RSS'}): {peak / 2**30:.2f} GiB; "
          f"sleep mode {'on' if args.sleep_mode else 'off'}: {sleeps[0]} sleeps over {steps_run} trainer steps "
          f"(at most one per step)")

    result = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
        "vllm": version, "torch": torch.__version__, "params": n_params, "layers": args.layers,
        "dtype": str(dtype), "engine_build_s": t_build,
        "throughput": {"prompts": len(prompts), "new_tokens": args.new_tokens, "vllm_tokens_per_s": vllm_tps,
                       "hf_tokens_per_s": hf_tps, "ratio": vllm_tps / hf_tps, "goal": 10.0},
        "invariant_mean_abs_diff": inv, "selfplay": rows,
        "sync": {"median_s": sync_med, "per_0_5b_params_s": per_half_b, "goal_s": 1.0, **series},
        "tis_cap": args.tis_cap, "peak_memory_bytes": peak, "sleep_mode": args.sleep_mode, "sleeps": sleeps[0],
        "trainer_steps": steps_run, "cpu_logic_check": device == "cpu", "dry_run": args.dry_run}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out)
    print(f"results: {out}")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
