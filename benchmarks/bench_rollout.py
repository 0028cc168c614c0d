"""Rollout throughput, measured side by side in one run (no timed tests).

Generated tokens per second of:
  A. concurrent multi-game self-play (Nim + tic-tac-toe + Kuhn, both seats the policy,
     every pending turn of every live game in ONE engine call per ply);
  B. the limit: the same engine calls replayed as plain batched `generate` (the same
     prompt ids in each call, every row forced to that call's longest completion) — what
     the rollout would cost with zero game / parsing / scheduling overhead;
  C. sequential per-game play (concurrency 1: one engine call per turn of one game).
Prints A/B (goal >= 0.8) and A/C (goal >= 10).

    python benchmarks/bench_rollout.py [--games 64] [--max-new-tokens 12] [--model PATH]
"""

from __future__ import annotations

import argparse
import time

import torch

from lmselfplay.games import make
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm.engines import HFEngine, SamplingParams
from lmselfplay.lm.rollout import Episode, LLMPlayer, RolloutStats, collect_episodes
from lmselfplay.models.policy import load_policy
from lmselfplay.utils.results import save_results


def rollout_tps(engine, tok, n_games, concurrency, sp, seed=0):
    """Tokens/s of self-play on a mix of games (both seats the same engine)."""
    me = LLMPlayer(engine, tok)
    names = ["nim", "tictactoe", "kuhn_poker"]
    eps = [Episode(make(names[i % 3]), (me, me), seed=seed + i) for i in range(n_games)]
    stats = RolloutStats()
    t = time.perf_counter()
    collect_episodes(eps, sp, concurrency=concurrency, stats=stats)
    dt = time.perf_counter() - t
    return stats.generated_tokens / dt, stats


class Recorder:
    """Wraps an engine and records every call's prompts and completion lengths."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []
        self.version = engine.version

    def generate(self, prompts, sampling):
        outs = self.engine.generate(prompts, sampling)
        self.calls.append((prompts, max(len(o.token_ids) for o in outs)))
        return outs


def replay_tps(engine, tok, calls):
    """B: the recorded calls as plain HF generate with left padding, same shapes."""
    model, total = engine.model, 0
    t = time.perf_counter()
    with torch.no_grad():
        for prompts, n_new in calls:
            width = max(len(p) for p in prompts)
            ids = torch.full((len(prompts), width), tok.pad_token_id)
            mask = torch.zeros_like(ids)
            for r, p in enumerate(prompts):
                ids[r, width - len(p):] = torch.tensor(p)
                mask[r, width - len(p):] = 1
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0,
                                 max_new_tokens=n_new, min_new_tokens=n_new, pad_token_id=tok.pad_token_id)
            total += (out.shape[1] - width) * len(prompts)
    return total / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--games", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--sequential-games", type=int, default=6)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    model, tok = load_policy(model_name_or_path=args.model)
    engine = HFEngine(model, tok)
    sp = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0, stop=MOVE_STOP)
    rollout_tps(engine, tok, 6, 6, sp)  # warm-up
    rec = Recorder(engine)
    a, stats = rollout_tps(rec, tok, args.games, args.games, sp)
    b = replay_tps(engine, tok, rec.calls)
    c, _ = rollout_tps(engine, tok, args.sequential_games, 1, sp, seed=10_000)
    print(f"model params: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M, threads {torch.get_num_threads()}")
    print(f"A concurrent self-play rollouts : {a:8.0f} tok/s  ({stats.episodes} games, {stats.llm_turns} turns, "
          f"{stats.engine_calls} engine calls, invalid {stats.as_dict()['invalid_rate']:.3f})")
    print(f"B same calls as plain generate  : {b:8.0f} tok/s  ({len(rec.calls)} calls replayed, rows forced "
          f"to each call's longest answer)")
    print(f"C sequential per-game play      : {c:8.0f} tok/s  ({args.sequential_games} games, one at a time)")
    print(f"A/B = {a / b:.2f} (goal >= 0.8)   A/C = {a / c:.1f} (goal >= 10)")
    save_results("bench_rollout", {"concurrent_tok_s": a, "plain_generate_tok_s": b, "sequential_tok_s": c,
                                   "concurrent_over_plain": a / b, "concurrent_over_sequential": a / c,
                                   "games": stats.episodes, "engine_calls": stats.engine_calls})


if __name__ == "__main__":
    main()
