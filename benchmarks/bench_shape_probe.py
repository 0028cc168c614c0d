"""The shape probe: which small causal LM, and which board token format, learns tic-tac-toe.

    python benchmarks/bench_shape_probe.py --rows layers=2,format=fused layers=4 --steps 400,800
    python benchmarks/bench_shape_probe.py --grid formats --name bench_shape_probe_formats
    python benchmarks/bench_shape_probe.py --grid shapes --name bench_shape_probe_shapes
    python benchmarks/bench_shape_probe.py --grid prior --name bench_shape_probe_prior

Each row is a freshly initialised model trained by the representation control: cross-entropy
toward uniform over the minimax-optimal moves at all 4,520 tic-tac-toe decision positions, random
batches, AdamW (no weight decay), with ``P(optimal)`` (mass on the optimal moves, renormalised
over the legal moves, averaged over ALL positions) and ``argmax`` (the most probable legal move
is optimal) measured at every ``--steps`` point. Beside it, ``step_s``: the CPU seconds of one
main-job step with that shape (:func:`main_job_step_seconds`). One torch thread per row, so the
rows are comparable and repeat exactly.

A row is ``key=value`` pairs (defaults in :data:`DEFAULTS`):

* ``arch``: ``llama`` (RoPE, RMSNorm, SwiGLU: the embedded model's), ``gpt2`` (learned absolute
  positions, LayerNorm, GELU), ``mlp`` (the yardstick: an MLP over the flattened token
  embeddings, for which reading the board is free; not a causal LM);
* ``layers``, ``width``, ``heads`` (0: width / 64), ``mlp_ratio`` (intermediate = ratio x width);
* ``lr``, ``warmup`` (linear, steps), ``batch``, ``clip`` (gradient-norm clip, 0: none), ``seed``;
* ``prior_steps``: first train this many steps toward uniform over the LEGAL moves (what the
  embedded model's pre-training teaches: it must start every recipe at the random prior), then
  the optimal targets from a fresh optimizer: can a model at the prior still learn?
* ``legal_list``: 1 adds the game text's legal-move list (``| 2 3 4 ...``, the move tokens
  themselves) after the board, as every game's prompt has it;
* ``format``, the board as tokens: the prompt is ``<bos> side | row \\n row \\n row \\n A``
  (16 tokens for the one-token formats; left-padded with an attention mask when a legal list
  makes lengths differ) with one of

  - ``cells``: one token per cell content (``X``, ``O``, ``.``): where a mark stands is
    only its position in the sequence;
  - ``digits``: the game's own board text (``O 2 3 / 4 X 6 / 7 8 9``): an empty cell is
    its digit, a mark is ``X`` / ``O``;
  - ``named2``: the cell's index, then its content, two tokens (``1 X 2 . 3 O``);
  - ``fused``: one token per (cell, content) (``1X 2. 3O``): every token names its cell.

Reading (docs/embedded_model.md has the measured table): a causal LM reads the board at the
MLP's speed only when each token names its cell (``fused``): uniform attention over the 9 cell
tokens then gives the sum of (cell, content) embeddings, which is the MLP's first layer applied
to the one-hot board. With any format in which a mark's cell is only its position, the model
must first learn position-selective attention, which these sizes do slowly.
"""

from __future__ import annotations

import argparse
import functools
import random
import time

import torch

from lmselfplay.games import make
from lmselfplay.games.solve import optimal_actions
from lmselfplay.lm.batching import pad_batch
from lmselfplay.lm.readout import decision_states
from lmselfplay.utils.results import save_results

DEFAULTS = {"arch": "llama", "layers": 4, "width": 128, "heads": 0, "mlp_ratio": 4, "lr": 1e-3, "warmup": 0,
            "batch": 128, "clip": 0.0, "seed": 0, "format": "cells", "legal_list": 0,
            "prior_steps": 0}
FORMATS = ("cells", "digits", "named2", "fused")
MARK_TEXT = {0: ".", 1: "X", 2: "O"}
GRIDS = {
    # the board's token format, at the embedded shape (4 x 128) and at 2 x 128
    "formats": [
        "format=cells", "format=digits", "format=fused", "layers=2,format=cells", "layers=2,format=digits",
        "layers=2,format=named2", "layers=2,format=fused", "layers=1,format=fused",
        # the legal-move list every game's text carries: the answer can be copied from it
        "layers=2,format=fused,legal_list=1", "layers=2,format=digits,legal_list=1",
    ],
    # shape and optimisation around 2 x 128 on the fused format, and the MLP yardstick
    "shapes": [
        "layers=2,width=64,format=fused", "layers=2,width=256,format=fused", "layers=3,format=fused",
        "layers=2,heads=8,format=fused", "layers=2,mlp_ratio=2,format=fused", "arch=gpt2,layers=2,format=fused",
        "layers=2,lr=3e-3,warmup=50,format=fused", "layers=2,batch=64,format=fused",
        "arch=mlp,layers=2,width=256,format=fused", "arch=mlp,layers=2,width=256,format=cells",
    ],
    # from the random prior (the state every recipe starts the embedded model in)
    "prior": [
        "layers=2,format=fused,prior_steps=300", "layers=2,format=fused,legal_list=1,prior_steps=300",
        "format=digits,legal_list=1,prior_steps=300",
    ],
}


def parse_row(text: str) -> dict:
    """``'layers=2,format=fused'`` over :data:`DEFAULTS`; an unknown key or format is an error."""
    row = dict(DEFAULTS)
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in DEFAULTS:
            raise SystemExit(f"error: unknown row key {key!r} in {text!r}; known: {sorted(DEFAULTS)}")
        row[key] = type(DEFAULTS[key])(value) if not isinstance(DEFAULTS[key], float) else float(value)
    if row["format"] not in FORMATS:
        raise SystemExit(f"error: unknown format {row['format']!r}; known: {list(FORMATS)}")
    if row["arch"] not in ("llama", "gpt2", "mlp"):
        raise SystemExit(f"error: unknown arch {row['arch']!r}; known: llama, gpt2, mlp")
    return row


def vocabulary() -> dict[str, int]:
    """Every token any format uses: specials, marks, digits and the 27 fused cell tokens."""
    words = ["<pad>", "<bos>", "X", "O", ".", "\n", "|", "A"] + [str(d) for d in range(1, 10)]
    words += [f"{k}{MARK_TEXT[c]}" for k in range(1, 10) for c in (0, 1, 2)]
    return {w: i for i, w in enumerate(words)}


def cell_tokens(fmt: str, k: int, content: int) -> list[str]:
    """Cell ``k`` (1-9) holding ``content`` (0 empty, 1 X, 2 O) as the tokens of ``fmt``."""
    mark = MARK_TEXT[content]
    return {"cells": [mark], "digits": [mark if content else str(k)], "named2": [str(k), mark],
            "fused": [f"{k}{mark}"]}[fmt]


def encode(state, fmt: str, vocab: dict[str, int], legal_list: bool = False) -> list[int]:
    """The compact prompt of ``state``: side to move, the board row by row, the answer slot."""
    words = ["<bos>", MARK_TEXT[state.player + 1], "|"]
    for r in range(3):
        for j in range(3):
            k = 3 * r + j
            words += cell_tokens(fmt, k + 1, state.board[k])
        words.append("\n")
    if legal_list:
        words += ["|"] + [str(k + 1) for k in range(9) if not state.board[k]]
    return [vocab[w] for w in words + ["A"]]


@functools.cache
def control_data(fmt: str, legal_list: bool = False):
    """Cached per format: every row of a grid reads the same positions and targets (read-only). (prompt ids, attention mask, legal mask over the 9 moves, target uniform over the
    optimal moves); prompts are left-padded, so the answer slot is always the last column."""
    vocab = vocabulary()
    game = make("tictactoe")
    states = decision_states(game)
    ids, att = pad_batch([encode(s, fmt, vocab, legal_list) for s in states], vocab["<pad>"], side="left")
    legal, target = torch.zeros(len(states), 9, dtype=torch.bool), torch.zeros(len(states), 9)
    for i, s in enumerate(states):
        legal[i, game.legal_actions(s)] = True
        best = optimal_actions(game, s)
        target[i, best] = 1.0 / len(best)
    return ids, att, legal, target


class MLPReference(torch.nn.Module):
    """Token embeddings (16 wide) flattened, then ``layers`` ReLU layers of ``width``: the
    position of every token is in its slot of the flattened vector."""

    def __init__(self, vocab_size: int, seq_len: int, layers: int, width: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, 16)
        dims = [16 * seq_len] + [width] * layers
        blocks = [m for a, b in zip(dims, dims[1:]) for m in (torch.nn.Linear(a, b), torch.nn.ReLU())]
        self.body = torch.nn.Sequential(*blocks, torch.nn.Linear(width, vocab_size))

    def forward(self, input_ids, attention_mask=None):
        return self.body(self.embed(input_ids).flatten(1))[:, None, :]


def make_model(row: dict, vocab_size: int, seq_len: int = 64):
    """A fresh model of ``row``'s shape (``seq_len``: positions the model holds)."""
    heads = row["heads"] or max(1, row["width"] // 64)
    inner = int(row["mlp_ratio"] * row["width"])
    if row["arch"] == "mlp":
        return MLPReference(vocab_size, seq_len, row["layers"], row["width"])
    if row["arch"] == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_embd=row["width"], n_layer=row["layers"],
                                          n_head=heads, n_inner=inner, n_positions=seq_len, resid_pdrop=0.0,
                                          embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                                          bos_token_id=0, eos_token_id=0))
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, hidden_size=row["width"], intermediate_size=inner,
                                        num_hidden_layers=row["layers"], num_attention_heads=heads,
                                        num_key_value_heads=heads, max_position_embeddings=seq_len,
                                        tie_word_embeddings=True))


def move_logits(model, ids: torch.Tensor, att: torch.Tensor, moves: torch.Tensor) -> torch.Tensor:
    out = model(input_ids=ids, attention_mask=att)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return logits[:, -1][:, moves]


@torch.no_grad()
def measure(model, ids, att, legal, target, moves) -> dict:
    """P(optimal) over the legal moves and the argmax-optimal rate, over every position."""
    model.eval()
    p_opt, arg_ok = [], []
    for k in range(0, len(ids), 1024):
        lg = move_logits(model, ids[k:k + 1024], att[k:k + 1024], moves).masked_fill(~legal[k:k + 1024], float("-inf"))
        is_opt = target[k:k + 1024] > 0
        p_opt.append((lg.softmax(-1) * is_opt).sum(-1))
        arg_ok.append(is_opt.gather(1, lg.argmax(-1, keepdim=True)).squeeze(1))
    model.train()
    return {"p_optimal": round(float(torch.cat(p_opt).mean()), 4),
            "argmax_optimal": round(float(torch.cat(arg_ok).float().mean()), 4)}


def train_row(row: dict, points: list[int]) -> list[dict]:
    """Train ``row``'s fresh model to ``max(points)`` steps; the measure at 0 and every point."""
    vocab = vocabulary()
    torch.manual_seed(row["seed"])
    ids, att, legal, target = control_data(row["format"], bool(row["legal_list"]))
    moves = torch.tensor([vocab[str(d)] for d in range(1, 10)])
    model = make_model(row, len(vocab), seq_len=ids.shape[1] if row["arch"] == "mlp" else 64)
    gen = torch.Generator().manual_seed(row["seed"])
    if row["prior_steps"]:
        prior = legal.float() / legal.sum(-1, keepdim=True)
        fit(model, ids, att, prior, moves, row, row["prior_steps"], gen)
    t0, curve = time.time(), [{"step": 0, "seconds": 0.0, **measure(model, ids, att, legal, target, moves)}]
    def at(step):
        if step in points:
            curve.append({"step": step, "seconds": round(time.time() - t0, 1),
                          **measure(model, ids, att, legal, target, moves)})

    fit(model, ids, att, target, moves, row, max(points), gen, at)
    return curve, sum(p.numel() for p in model.parameters())


def fit(model, ids, att, target, moves, row, steps, gen, after_step=lambda step: None) -> None:
    """``steps`` AdamW steps of cross-entropy toward ``target`` (rows: distributions over the
    9 moves) on random batches; ``after_step(step)`` after each."""
    opt = torch.optim.AdamW(model.parameters(), lr=row["lr"], weight_decay=0.0)
    warm = row["warmup"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(ids), (row["batch"],), generator=gen)
        logp = move_logits(model, ids[idx], att[idx], moves).log_softmax(-1)
        loss = -(target[idx] * logp).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if row["clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), row["clip"])
        opt.step()
        sched.step()
        after_step(step)


def main_job_turns(games_per_step: dict[str, int], seed: int = 0) -> list[str]:
    """Every turn's prompt text of one main-job step's games, played uniformly at random
    (the main job's mix: 32 Nim, 16 tic-tac-toe and 64 Kuhn games)."""
    from lmselfplay.games.base import CHANCE, sample_chance

    rng, texts = random.Random(seed), []
    for name, n in games_per_step.items():
        game = make(name)
        for _ in range(n):
            s = game.new_initial_state()
            while not game.is_terminal(s):
                if game.current_player(s) == CHANCE:
                    s = game.apply(s, sample_chance(game, s, rng))
                    continue
                texts.append(game.observation_text(s, game.current_player(s)))
                s = game.apply(s, rng.choice(game.legal_actions(s)))
    return texts


def main_job_step_seconds(row: dict, turns: list[str], answer_tokens: int = 5, passes: int = 2,
                          micro_batch: int = 64) -> float | None:
    """CPU seconds of one main-job step's compute for ``row``'s shape, with the embedded
    tokenizer: every turn generates ``answer_tokens`` tokens (``<move>``, the move, ``</move>``
    and a margin; KV-cached), then the trainer's old-log-prob forward and ``passes`` (the main
    job's ``num_iterations``) forward + backward passes over prompt + answer, and one AdamW
    step. The workload is fixed (random-legal games), so a shape's cost does not depend on
    how well its untrained weights play. ``None`` for the MLP (not a causal LM)."""
    if row["arch"] == "mlp":
        return None
    from transformers import AutoTokenizer

    from lmselfplay.lm.prompt import encode_prompt
    from lmselfplay.models.cache import ensure_tiny_model

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny_model(progress=False)))
    torch.manual_seed(row["seed"])
    model = make_model(row, len(tok), seq_len=512)
    prompts = [encode_prompt(tok, t) for t in turns]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t0 = time.time()
    full = []
    model.eval()
    with torch.no_grad():
        for k in range(0, len(prompts), micro_batch):
            ids, att = pad_batch(prompts[k:k + micro_batch], tok.pad_token_id, side="left")
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=answer_tokens,
                                 min_new_tokens=answer_tokens, do_sample=True, pad_token_id=tok.pad_token_id)
            full += [p + out[i, ids.shape[1]:].tolist() for i, p in enumerate(prompts[k:k + micro_batch])]
        for k in range(0, len(full), micro_batch):  # the behaviour / old log-probs
            ids, att = pad_batch(full[k:k + micro_batch], tok.pad_token_id)
            model(input_ids=ids, attention_mask=att)
    model.train()
    for _ in range(passes):
        for k in range(0, len(full), micro_batch):
            ids, att = pad_batch(full[k:k + micro_batch], tok.pad_token_id)
            logits = model(input_ids=ids, attention_mask=att).logits
            logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).mean().backward()
            del logits
        opt.step()
        opt.zero_grad(set_to_none=True)
    return round(time.time() - t0, 2)


def table_line(row: dict, params: int | None, curve: list[dict], step_s: float | None) -> str:
    """One printed row: name, parameters, P(optimal)/argmax at every point, step seconds."""
    cells = " ".join(f"{c['p_optimal']:.3f}/{c['argmax_optimal']:.3f}" for c in curve[1:]) or "-"
    size = f"{params / 1e6:7.2f}M" if params else f"{'-':>8}"
    return f"{row_name(row):<44} {size} {cells}   {step_s if step_s is not None else '-':>6}"


def row_name(row: dict) -> str:
    changed = [f"{k}={v}" for k, v in row.items() if v != DEFAULTS[k]]
    return ",".join(changed) or "defaults"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="*", default=[], help="rows as key=value,... (see the docstring)")
    ap.add_argument("--grid", choices=sorted(GRIDS), help="a named set of rows")
    ap.add_argument("--steps", default="400", help="measure points, comma list (the issue: 400,800,1600)")
    ap.add_argument("--no_step_time", action="store_true", help="skip the main-job step timing")
    ap.add_argument("--step_time_only", action="store_true",
                    help="only the main-job step timing, every row back to back (comparable on a quiet machine)")
    ap.add_argument("--name", default="bench_shape_probe")
    args = ap.parse_args(argv)
    rows = [parse_row(r) for r in (GRIDS[args.grid] if args.grid else []) + args.rows]
    if not rows:
        ap.error("give --rows or --grid")
    points = sorted({int(s) for s in args.steps.split(",")})
    torch.set_num_threads(1)
    turns = None if args.no_step_time else main_job_turns({"nim": 32, "tictactoe": 16, "kuhn_poker": 64})
    results = []
    print(f"{'row':<44} {'params':>8} " + " ".join(f"{p:>13}" for p in points) + "   step_s")
    for row in rows:
        curve, params = ([], None) if args.step_time_only else train_row(row, points)
        step_s = None if turns is None else main_job_step_seconds(row, turns)
        results.append({"row": row_name(row), "config": row, "params": params, "curve": curve, "step_s": step_s})
        # after every row: a long grid stopped midway keeps the rows it finished
        save_results(args.name, {"steps": points, "main_job_turns": len(turns or []), "rows": results})
        print(table_line(row, params, curve, step_s), flush=True)

if __name__ == "__main__":
    main()
