"""What a corpus mix teaches a built model: continue its pre-training on one mix and measure.

    python benchmarks/bench_corpus_mix.py --weights arithmetic=1 --steps 600 --measure arith
    python benchmarks/bench_corpus_mix.py --weights go9=1 --steps 200 --measure go9
    python benchmarks/bench_corpus_mix.py --model PATH --weights ... --save DIR

The short probe behind a build's mix (``lmselfplay/models/tiny.py`` BUILDS): the model
(default: the embedded one) trains ``--steps`` more steps of the build's own loss on the
corpus mix ``--weights`` (every task kind not named weighs 0; constant lr, AdamW as the
build), and every ``--every`` steps it is measured as ``bench_tiny_legal.py`` measures it,
on ``--n`` items: legal answers at temperature 1 of any game named in ``--measure``,
``arith`` (word problems solved, greedy) and ``prog`` (program outputs predicted, greedy).

Measured on the v3 build (e897b38dd6b7), 1 thread, batch 64, lr 1e-3, 256 positions / 128
problems (two probes side by side on 2 cores):

    mix (--weights)            step:    0      100/200     400      600
    go9=1 (legal, 9x9)               0.430   0.461/0.434     -        -
    arithmetic=1 (greedy)            0.117     -/0.227     0.289    0.398
    programs=1 (greedy)              0.047     -/0.125     0.125    0.125

Go turns alone do not teach a legal Go move: 12,800 of them leave the rate at the level of a
point drawn from the whole board (31.9 legal of 82 on average in these positions: 0.39). A
fresh model with the v4 "cells" tokenizer, where every point is one token in the legal list
and in the answer (``--model`` a ``--train_steps 0`` v4 build, lr 3e-3), reached 0.410 / 0.414
after 150 / 300 Go-only steps. Arithmetic rises steadily; programs stop at 0.125. With the
games kept in the mix (38% arithmetic) arithmetic stays at 0.10 for 500 steps, then rises
(0.266 at 750, 0.250 at 1,000): so v5 and v6 run 2,000 and 2,400 steps.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tiny_legal import arithmetic_solved, outputs_predicted, random_positions, sample  # noqa: E402

from lmselfplay import games  # noqa: E402
from lmselfplay.models.tiny import Corpus, TinyConfig, batches, ensure_tiny_model, weighted_lm_loss  # noqa: E402
from lmselfplay.tasks.arithmetic import arithmetic_problem  # noqa: E402
from lmselfplay.tasks.programs import python_program  # noqa: E402
from lmselfplay.utils.results import save_results  # noqa: E402


def only(weights: str) -> str:
    """``weights`` with every other task kind of the corpus at 0."""
    kinds = list(TinyConfig().weights())
    return ",".join([f"{k}=0" for k in kinds] + [weights])


@torch.no_grad()
def measure(model, tok, what: list[str], n: int) -> dict[str, float]:
    """Legal answers at temperature 1 per named game, ``arith`` and ``prog`` solved greedily."""
    model.eval()
    rng, out = random.Random(1234), {}
    torch.manual_seed(0)
    for m in what:
        if m == "arith":
            out[m], _ = arithmetic_solved(model, tok, [arithmetic_problem(rng) for _ in range(n // 2)], do_sample=False)
        elif m == "prog":
            out[m] = outputs_predicted(model, tok, [python_program(rng) for _ in range(n // 2)], do_sample=False)
        else:
            game = games.make(m)
            states = random_positions(game, n, rng)
            got = sample(model, tok, [game.observation_text(s, game.current_player(s)) for s in states])
            out[m] = sum(not isinstance(game.parse_action(s, g), games.Invalid) for s, g in zip(states, got)) / n
    model.train()
    return out


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a built model folder (default: the embedded model)")
    ap.add_argument("--weights", required=True, help="the corpus mix, TinyConfig.task_weights syntax")
    ap.add_argument("--measure", default="go9,arith,prog", help="games (legal rate), arith, prog")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--n", type=int, default=256, help="positions per game; problems = n / 2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save", default=None, help="write the trained model here")
    ap.add_argument("--name", default="bench_corpus_mix")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = args.model or ensure_tiny_model()
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    cfg = TinyConfig(batch_size=args.batch, task_weights=only(args.weights))
    stream = batches(cfg, tok, Corpus(cfg, random.Random(1)), random.Random(2))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    what, t0 = args.measure.split(","), time.time()
    rows = [{"step": 0, **measure(model, tok, what, args.n)}]
    print(json.dumps(rows[-1]), flush=True)
    model.train()
    for step in range(1, args.steps + 1):
        loss = weighted_lm_loss(model, *next(stream))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.every == 0:
            rows.append({"step": step, "seconds": round(time.time() - t0, 1), "loss": loss.item(),
                         **measure(model, tok, what, args.n)})
            print(json.dumps(rows[-1]), flush=True)
    if args.save:
        model.save_pretrained(args.save)
        tok.save_pretrained(args.save)
    save_results(args.name, {"model": str(path), "weights": args.weights, "rows": rows})


if __name__ == "__main__":
    main()
