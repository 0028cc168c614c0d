"""How fast a fresh embedded-size model learns the word problems, by how its tokenizer writes numbers.

Pre-trains a fresh model (v7's shape by default: 2 layers x 128, 8 heads, MLP 256) from scratch on a
corpus of the project's word problems (weight 20, with programs and reading questions at 1 each) and
measures greedy held-out accuracy every ``--eval_every`` steps (per problem kind printed), with the
tokenizer's digits split one by one (the "bpe" tokenizer of v3-v7) or, with ``--whole_numbers``,
digit runs kept whole (v8's "numbers" tokenizer). Run it once per arm, side by side:

    python benchmarks/bench_number_tokens.py --games nim --weights arithmetic=20,nim=0.01 --steps 400 --out A.json
    python benchmarks/bench_number_tokens.py --games nim --weights arithmetic=20,nim=0.01 --steps 400 --whole_numbers --out B.json

``benchmarks/results/bench_number_tokens.json`` holds the two runs' curves ("split" and "whole").
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np
import torch

from lmselfplay.lm.engines import SamplingParams, generate_fitting
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.models import tiny
from lmselfplay.models.pretrain import Corpus, batches, lr_factor, starting_point, train_step
from lmselfplay.tasks.arithmetic import arithmetic_problem, arithmetic_prompt
from lmselfplay.verifiers.referees import AnswerMatcher


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--eval_every", type=int, default=100)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--weights", default="arithmetic=20,programs=4,two_option=2,reading=1,nim=1,kuhn_poker=1")
    ap.add_argument("--games", default="nim,kuhn_poker")
    ap.add_argument("--heldout", type=int, default=200)
    ap.add_argument("--whole_numbers", action="store_true", help="keep digit runs whole (v8's numbers tokenizer)")
    ap.add_argument("--out", default=None, help="write the curve here as JSON")
    return ap.parse_args()


def heldout_accuracy(model, tok, held, matcher) -> tuple[float, dict[str, float]]:
    model.eval()
    comps = generate_fitting(HFEngine(model, tok), [encode_prompt(tok, arithmetic_prompt(p)) for p in held],
                             SamplingParams(max_new_tokens=40, temperature=0.0, seed=1))
    model.train()
    right = [matcher.matches("arithmetic", matcher.final("arithmetic", c.text)[0], p["final"]) for c, p in zip(comps, held)]
    kinds: dict[str, list[bool]] = {}
    for p, r in zip(held, right):
        kinds.setdefault(p["kind"], []).append(r)
    return float(np.mean(right)), {k: float(np.mean(v)) for k, v in kinds.items()}


def main() -> None:
    a = parse_args()
    cfg = tiny.TinyConfig(num_layers=a.layers, hidden_size=a.hidden, num_heads=a.heads, intermediate_size=a.inter,
                          train_steps=a.steps, batch_size=a.batch, lr=a.lr, warmup_steps=a.warmup, games=a.games,
                          task_weights=a.weights, tokenizer="numbers" if a.whole_numbers else "bpe")
    torch.set_num_threads(1)
    rng = random.Random(cfg.seed)
    tok, model = starting_point(cfg, random.Random(rng.random()))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(cfg, step))
    stream = batches(cfg, tok, Corpus(cfg, random.Random(rng.random())), random.Random(rng.random()))
    matcher = AnswerMatcher(timeout_s=2.0)
    hrng = random.Random("heldout/0")
    held = [arithmetic_problem(hrng) for _ in range(a.heldout)]
    curve, ema, t0 = [], None, time.time()
    model.train()
    for step in range(cfg.train_steps):
        loss = train_step(model, opt, sched, next(stream))
        ema = loss if ema is None else 0.95 * ema + 0.05 * loss
        if (step + 1) % a.eval_every == 0:
            acc, kinds = heldout_accuracy(model, tok, held, matcher)
            curve.append({"step": step + 1, "accuracy": acc, "loss_ema": ema, "seconds": time.time() - t0, "kinds": kinds})
            print(f"step {step + 1} accuracy {acc:.3f} loss {ema:.3f} {kinds}", flush=True)
    matcher.close()
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "curve": curve}, f, indent=1)


if __name__ == "__main__":
    main()
