"""Probe: pretrain a fresh tiny model on a language mix; held-out arithmetic greedy accuracy every K steps."""
import argparse, json, math, random, time
import numpy as np, torch
from lmselfplay.models import tiny
from lmselfplay.lm.engines import SamplingParams, generate_fitting
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.tasks.arithmetic import arithmetic_problem, arithmetic_prompt
from lmselfplay.verifiers.referees import AnswerMatcher

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=2); ap.add_argument("--hidden", type=int, default=128)
ap.add_argument("--heads", type=int, default=8); ap.add_argument("--inter", type=int, default=256)
ap.add_argument("--steps", type=int, default=400); ap.add_argument("--eval_every", type=int, default=100)
ap.add_argument("--lr", type=float, default=3e-3); ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--weights", default="arithmetic=20,programs=4,two_option=2,reading=1,nim=1,kuhn_poker=1")
ap.add_argument("--games", default="nim,kuhn_poker")
ap.add_argument("--heldout", type=int, default=200); ap.add_argument("--out", default=None)
ap.add_argument("--save", default=None)
ap.add_argument("--whole_numbers", action="store_true")
ap.add_argument("--warmup", type=int, default=50)
a = ap.parse_args()
if a.whole_numbers:
    import tokenizers.pre_tokenizers as _pt
    _orig = _pt.Digits
    _pt.Digits = lambda individual_digits=True: _orig(individual_digits=False)
cfg = tiny.TinyConfig(num_layers=a.layers, hidden_size=a.hidden, num_heads=a.heads, intermediate_size=a.inter,
                      train_steps=a.steps, batch_size=a.batch, lr=a.lr, warmup_steps=a.warmup, games=a.games, task_weights=a.weights)
torch.set_num_threads(1)
rng = random.Random(cfg.seed)
tok, model = tiny.starting_point(cfg, random.Random(rng.random()), False)
print("params", sum(p.numel() for p in model.parameters()), flush=True)
opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
def lr_at(step):
    if step < cfg.warmup_steps: return (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.train_steps - cfg.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
stream = tiny.batches(cfg, tok, tiny.Corpus(cfg, random.Random(rng.random())), random.Random(rng.random()))
m = AnswerMatcher(timeout_s=2.0)
hrng = random.Random("heldout/0"); held = [arithmetic_problem(hrng) for _ in range(a.heldout)]
def evaluate():
    model.eval()
    eng = HFEngine(model, tok)
    comps = generate_fitting(eng, [encode_prompt(tok, arithmetic_prompt(p)) for p in held], SamplingParams(max_new_tokens=40, temperature=0.0, seed=1))
    model.train()
    r = [m.matches("arithmetic", m.final("arithmetic", c.text)[0], p["final"]) for c, p in zip(comps, held)]
    kinds = {}
    for p, x in zip(held, r):
        kinds.setdefault(p["kind"], []).append(x)
    print({k: round(float(np.mean(v)), 2) for k, v in kinds.items()}, flush=True)
    return float(np.mean(r))
log = []; t0 = time.time(); ema = None
model.train()
for step in range(cfg.train_steps):
    ids, att, w, soft = next(stream)
    loss = tiny.weighted_lm_loss(model, ids, att, w, soft)
    opt.zero_grad(set_to_none=True); loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step(); sched.step()
    ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
    if (step + 1) % a.eval_every == 0:
        acc = evaluate(); log.append((step + 1, acc, ema, time.time() - t0))
        print(f"step {step+1} acc {acc:.3f} loss {ema:.3f} t {time.time()-t0:.0f}", flush=True)
if a.out: json.dump({"args": vars(a), "log": log}, open(a.out, "w"))
if a.save:
    model.save_pretrained(a.save); tok.save_pretrained(a.save)
