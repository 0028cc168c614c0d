"""Can the model represent optimal tic-tac-toe at all? A supervised control.

Exact optimal targets (uniform over the minimax-optimal moves) for ALL 4,520 tic-tac-toe
decision positions; cross-entropy on the move token after ``<move>`` (prompt + ``<move>``
is one forward; every move is one token in the embedded tokenizer), AdamW, random
batches. Trained from the embedded model AND from a freshly initialised model of the same
shape, side by side: if both stall, the model (or its input format) is the limit; if only
the embedded one stalls, its pre-training is a trap.

P(optimal) is the probability of an optimal move among the legal move tokens at the move
position (renormalized over legal moves, as ``eval/game_metrics`` does), averaged over all
positions; ``argmax`` is the rate at which the most probable legal move is optimal.

Levers, each a control only (the game's text and the build are unchanged):
``--pretrain_steps N --task_weights ...`` continues the embedded model's pre-training on a
changed corpus mix first (e.g. ``grid_reading``); ``--split_marks`` splits BPE's glued
``' X'`` / ``' O'``; ``--format`` re-renders the board (:func:`render`: ``grid`` one token
per cell with ``.`` for empty, ``named`` ``1X 2. 3O``, ``*_last`` board just before
``Answer:``, ``*_only`` side + board and nothing else); ``--layers/--heads`` reshape the
fresh model and ``--arch`` picks its architecture (:func:`fresh_model`: the embedded Llama,
the same + learned absolute positions, GPT-2); ``--cell_tokens`` makes every ``named`` cell one
token that carries its index (:func:`add_cell_tokens`); ``--loss set`` trains ``-log P(optimal)``; ``--subset N`` trains and measures
on N positions (can it even memorize?); ``--which mlp`` is the yardstick: an MLP on the
board planes, same targets, optimizer and batches, for which reading the board is free.

This is a control only: the search recipe never sees exact answers.

Measured (embedded tiny-e897b38dd6b7; 1 thread, nice 15, load 1-5 on 2 cores, so wall
times are only indicative; lr 1e-3, batch 64, P(optimal) / argmax on all 4,520 positions
at the last step; results/bench_ttt_representation_<name>.json; uniform over the legal
moves is ~0.57; ``A+B`` steps: A steps toward ``--legal_target`` first, then B optimal):

    name                      model     steps  wall s  P(opt)  argmax
    embedded_b64_default      embedded    300     236   0.614   0.672
    embedded_b64_set          embedded    300     410   0.636   0.665   (--loss set)
    embedded_b64_named_last   embedded    300     328   0.616   0.670
    embedded_b64_grid_last    embedded    300     322   0.622   0.688
    embedded_b64_threats300   embedded 300+300 126+133  0.652   0.744   (win/block targets first)
    fresh_named_last          fresh       300     314   0.618   0.680
    fresh_grid_last           fresh       300     260   0.610   0.669   (board without digits + legal list)
    fresh_default_only        fresh       300     182   0.609   0.658   (board with digits, nothing else)
    fresh_named_only          fresh       300     251   0.623   0.693   (1X 2. 3O, nothing else)
    fresh_grid_only           fresh       300      91   0.700   0.793   (board without digits, nothing else)
    fresh_grid_only_legal300  fresh   300+300  92+95   0.615   0.670   (300 steps uniform-over-legal first)
    fresh_default_only_legal300 fresh 300+300 74+88  0.614   0.673   (same, board with digits)
    fresh_grid_only_threats300  fresh 300+300 42+44  0.691   0.793   (win/block targets first)
    fresh_default_only_threats300 fresh 300+300 51+54 0.692  0.805   (same, board with digits)
    fresh_grid_only_1500      fresh      1500     368   0.827   0.937   (still rising)
    fresh_grid_only_8heads    fresh       300     154   0.680   0.781
    fresh_grid_only_6layers   fresh       300     223   0.670   0.767
    fresh_grid_only_set       fresh       300     133   0.688   0.736   (--loss set)
    fresh_grid_only_lr3e-3    fresh       600      89   0.653   0.721   (lr 3e-3, warmup 50)
    overfit500                fresh       300     177   0.835   0.928   (500 positions)
    overfit500_grid_last      fresh       300     173   0.741   0.834   (500 positions)
    overfit500_lr3e-3         fresh       300     219   0.702   0.808   (500 positions, warmup 20)
    mlp_b64                   mlp     300/1500      8   0.796/0.903  0.953/0.992
    mlp_b64_lr1e-2            mlp         600       3   0.909   0.982   (lr 1e-2)
    mlp_b128                  mlp        3000      16   0.941   1.000   (batch 128)
    mlp_b128_lr1e-2           mlp         600       4   0.950   0.999   (batch 128, lr 1e-2)
    mlp_b128_set              mlp     500/600       4   0.951/0.963  0.992/0.996  (batch 128, --loss set)

v4 "cells" tokenizer (``lmselfplay bootstrap --build v4 --train_steps 0 --out DIR``: one token
per cell, digit and move name), a fresh 4 x 128 model on the game's own text, batch 128, lr 1e-3,
P(optimal) / argmax on 1,000 positions (load 6-12 on 2 cores; stopped by its 1,500 s timeout
after step 200; log in results/probe_v4tok_fresh_default.log):

    step 0  0.571 / 0.571    step 100  0.605 / 0.672    step 200  0.604 / 0.652

the same basin as the v3 BPE's fresh model (0.613 at 300): position-stable cell tokens alone do
not get the model out of copying a listed digit.

The v4 build itself (``lmselfplay bootstrap --build v4``, tiny-96358453958d: the cells tokenizer
and 2,400 pre-training steps with board-reading questions), ``--model PATH --which embedded``,
batch 128, lr 1e-3, P(optimal) / argmax (1,000 positions for the curve, all 4,520 at step 400;
two runs side by side on an otherwise idle 2-core machine; docs/embedded_model.md; the v3
rows the same, without ``--model``):

    name (bench_ttt_representation_*)   format      step 0         step 100       step 400
    v4_b128                             default     0.573 / 0.600  0.605 / 0.650  0.617 / 0.677
    v4_b128_grid_only                   grid_only   0.562 / 0.565  0.608 / 0.642  0.627 / 0.692
    v3_b128 (the shipped build)         default     0.564 / 0.526  0.602 / 0.660  0.682 / 0.788
    v3_b128_grid_only                   grid_only   0.560 / 0.562  0.599 / 0.634  0.634 / 0.722

the pre-trained v4 is in the uniform-over-legal basin on both prompts, below v3 on the game's
own text and below the fresh Llama on the board alone (0.739): the board-reading questions did
not carry over to the move.

Earlier, batch 128, 300 steps: embedded 0.630 (argmax 0.700), fresh 0.613 (0.664);
``--split_marks`` 0.611 / 0.611; 100 steps of pre-training at ``grid_reading=20`` first:
0.624 at 150 steps - no lever moved the full-prompt model. A fresh model on
the default prompt at batch 64 was still at 0.597 (argmax 0.638, 1,000 positions) after
500 steps (stopped there).

Reading: (1) the target is a sharpness level: even the MLP, for which reading is free,
needs ~3,000 steps at lr 1e-3 to approach 0.95 (argmax is 0.95 at 300); lr 1e-2 or the
set loss gets it there in ~500-600 steps. (2) The transformer's gap is reading, not
sharpening or shape: at 300 steps its argmax is 0.67 where the MLP's is 0.95, and the set
loss, 6 layers or 8 heads change nothing. (3) What stalls reading is a
uniform-over-legal basin: with the cell digits anywhere in the prompt (the game's own
text, the board moved last, cells named, the board with digits alone, the digit-free
board + the legal list) the fresh model sits at ~0.61, likely by copying a digit from the
context (one attention step to a token whose tied embedding IS the answer's logit), which
gives the uniform-over-legal level at once; only the digit-free board alone learns (0.70 at
300, 0.83 at 1,500, rising: the model CAN represent the game). And training toward
uniform over the legal moves first (what the corpus's game turns teach) puts even that
digit-free model into the basin: 0.615 after 300 + 300 steps, vs 0.700
after 300 from scratch. The embedded model arrives there already (0.61 whatever the format).
(4) Targets that need reading get out of it: 300 steps toward :func:`threat_moves` (win,
else block, else any; no look-ahead) first take the board-with-digits prompt from 0.61 to
0.69 (argmax 0.81) after 300 optimal steps, as good as the digit-free board (the embedded
model on the game's own text: 0.614 -> 0.652, argmax 0.672 -> 0.744); the threat
phase alone reaches only 0.57 (P of a threat move), so it teaches reading, not the answer.
Still, nothing measured gets near 0.95 in a few hundred steps: the best transformer is
0.83 at 1,500 steps. One seed per row; step-to-step noise is about +-0.02.

    nice -n 15 python benchmarks/bench_ttt_representation.py --which fresh --batch 64 \
        --steps 300 --eval_every 100 --format grid_only --name bench_ttt_representation_fresh_grid_only

Architecture and cell identity (the hypothesis: with RoPE, position enters only the
query-key products and the VALUE vectors carry none, so a head that gathers the 9 cells gets
a bag of marks; a residual stream that carries position, or cell tokens that carry their
index, would read the board as the MLP's planes do). Fresh 4 x 128 models, the defaults:
batch 128, 400 steps, lr 1e-3, no warmup; P(optimal) / argmax on all 4,520 positions at step
400; load 6-9 on 2 cores, two or three runs at once, so wall times are only indicative:

    name (bench_ttt_representation_*)   arch          format      seed  wall s  P(opt)  argmax
    b128_llama_grid_only                llama         grid_only      0     860   0.739   0.862
    b128_llama_grid_only_seed1          llama         grid_only      1     864   0.746   0.862
    b128_llama_abspos_grid_only         llama_abspos  grid_only      0    1019   0.627   0.704
    b128_llama_abspos_grid_only_seed1   llama_abspos  grid_only      1     953   0.706   0.817
    b128_gpt2_grid_only                 gpt2          grid_only      0     799   0.657   0.754
    b128_gpt2_grid_only_seed1           gpt2          grid_only      1     766   0.614   0.664
    b128_gpt2_grid_only_lr3e-3          gpt2          grid_only      0     905   0.630   0.678   (lr 3e-3, warmup 50)
    b128_llama_named_only               llama         named_only     0     477   0.686   0.800   ("5", "X": two tokens)
    b128_llama_named_only_cells         llama         named_only     0    1131   0.708   0.816   (--cell_tokens: "5X" one token)
    b128_gpt2_named_only_cells          gpt2          named_only     0     829   0.622   0.701   (--cell_tokens)
    b128_mlp_400                        mlp           (planes)       0       9   0.864   0.988

(``llama_abspos`` is the embedded Llama plus a learned position embedding added to the
token embedding, RoPE kept: 1.25M parameters; ``gpt2`` 0.99M; ``llama`` 1.18M.)

Reading: the hypothesis does not hold at this budget. Position in the residual stream, by
either architecture, reads the board no faster than RoPE alone, and on two seeds each
slower (llama 0.739 / 0.746; + learned positions 0.627 / 0.706; GPT-2 0.657 / 0.614); a
larger lr does not rescue GPT-2 (as it did not the Llama, row ``fresh_grid_only_lr3e-3``);
and a cell token that names its cell (uniform attention over the 9 cell tokens is then a
linear function of the MLP's board planes) is no better than the digit-free grid (llama
0.708, GPT-2 0.622; the same board with the index and mark as two tokens 0.686). Every transformer stays at 0.58-0.65 for its first ~200 steps
(uniform over the legal moves is ~0.57) and climbs slowly after, where the MLP is at 0.77
by step 200. And at this lr and budget the no-reading MLP itself reaches only 0.864
(argmax 0.988): ">= 0.95 in 400 steps" asks for more than free reading. For v4 this points
away from the architecture (keep the Llama) and from cell identity in the tokens (the
digit-free grid is one token per cell already; indexed cell tokens add nothing), toward
what pre-training puts in the residual stream before the control starts (targets that
need the board: the ``threats`` rows are the only lever measured that moved a digit
prompt). That needs a pre-trained v4 build, which this probe does not build; so the issue's
guard (P(optimal) before any recipe within +-0.05 of uniform over the legal moves) is not
tested here: every model above is fresh and starts at 0.56-0.58.

    nice -n 15 python benchmarks/bench_ttt_representation.py --which fresh --arch gpt2 \
        --format grid_only --name bench_ttt_representation_b128_gpt2_grid_only
    # the other rows: --arch llama | llama_abspos, --seed 1, --lr 3e-3 --warmup 50,
    # --format named_only --cell_tokens; --which mlp --steps 400 (each file records its command)
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from lmselfplay.games import make
from lmselfplay.games.solve import optimal_actions
from lmselfplay.games.text import ANSWER_INSTRUCTION, OPEN
from lmselfplay.games.tictactoe import CELL_STRINGS, LINES, MARKS, TicTacToe
from lmselfplay.lm.batching import pad_batch
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.lm.readout import decision_states
from lmselfplay.utils.results import save_results


def mark_splitter(tok, marks=("X", "O")):
    """``ids -> ids`` with every token that is a space glued to a mark (BPE's ``' X'``)
    replaced by the space's token and the mark's token, so every board cell is the same
    number of tokens whatever is on it (``'4', ' X', ' ', '6'`` becomes
    ``'4', ' ', 'X', ' ', '6'``, like ``'4', ' ', '5', ' ', '6'``)."""
    def one(text):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"{text!r} is not one token")
        return ids[0]

    space = one(" ")
    glued = {}
    for m in marks:
        ids = tok(" " + m, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            glued[ids[0]] = [space, one(m)]
    return lambda ids: [t for i in ids for t in glued.get(i, [i])]


def _grid(game, s):
    """Rows of one character per cell ('.' empty): one token per cell in the embedded BPE."""
    cells = [MARKS[c] for c in s.board]
    return ["".join(cells[r * 3 : r * 3 + 3]) for r in range(3)]


def _named(game, s):
    """Every cell names itself whatever is on it: ``1X 2O 3.`` per row."""
    return [" ".join(f"{i + 1}{MARKS[s.board[i]]}" for i in range(r * 3, r * 3 + 3)) for r in range(3)]


def _cells_line(game, s):
    """The cells text's nine named cells on one line: ``1X2_3O4_5X6_7_8_9O``."""
    return ["".join(TicTacToe(board="cells").board_text(s))]


BOARDS = {"default": lambda g, s: g.board_text(s), "grid": _grid, "named": _named,
          "cells": lambda g, s: TicTacToe(board="cells").board_text(s), "cellsline": _cells_line}


def render(game, s, player, fmt="default"):
    """Observation text in format ``fmt`` = BOARD or BOARD_last (BOARD in :data:`BOARDS`).
    ``default`` is the game's own text; ``*_last`` puts the side and board after the legal
    list and instruction, just before ``Answer:``, so the answer-to-cell distances do not
    depend on the list's length; ``*_nolist`` is ``*_last`` without the legal-move list; ``*_only`` is the side and board alone (a diagnostic: no
    other text to read past). A control only: the game's text is unchanged."""
    if fmt == "default":  # the game's own observation, whichever board text it was made with
        return game.observation_text(s, player)
    board, _, where = fmt.partition("_")
    if board not in BOARDS or where not in ("", "last", "only", "nolist"):
        raise ValueError(f"unknown format {fmt!r}; known: {sorted(BOARDS)} (+ '_last', '_only', '_nolist')")
    side = [f"You play {MARKS[player + 1]}.", *BOARDS[board](game, s)]
    legal = "Legal moves: " + " ".join(game.action_text(a) for a in game.legal_actions(s))
    head = f"Game: {game.name}. Get three in a row."
    lines = {"": [head, *side, legal, ANSWER_INSTRUCTION], "last": [head, legal, ANSWER_INSTRUCTION, *side],
             "nolist": [head, ANSWER_INSTRUCTION, *side], "only": side}[where]
    return "\n".join(lines)


def add_cell_tokens(tok, fmt="named"):
    """Add one token per cell and content to ``tok`` (``1X`` .. ``9.`` for the ``named``
    format's cells, the game's cells text's ``1_`` .. ``9O`` for ``cells*``): every cell token
    then carries its cell index in its own embedding, as the MLP's board planes do, whatever
    the architecture does with position."""
    from tokenizers import AddedToken

    strings = CELL_STRINGS if fmt.startswith("cells") else [f"{i}{m}" for i in range(1, 10) for m in MARKS]
    tok.add_tokens([AddedToken(t, normalized=False) for t in strings])


def threat_moves(s):
    """Cells that complete a line of the mover's marks, else cells that block one of the
    opponent's, else every empty cell: reading threats, with no look-ahead."""
    empty = [i for i, c in enumerate(s.board) if not c]
    for mark in (s.player + 1, 2 - s.player):
        hits = [i for i in empty if any(i in line and all(s.board[j] == mark for j in line if j != i)
                                        for line in LINES)]
        if hits:
            return hits
    return empty


def move_token_data(tok, game, split_marks=False, fmt="default"):
    """(prompt + <move> ids, legal token ids, optimal token ids) per decision position;
    with ``split_marks`` the prompt's glued space+mark tokens are split (:func:`mark_splitter`);
    ``fmt`` re-renders the board (:func:`render`)."""
    open_id = tok.convert_tokens_to_ids(OPEN)
    split = mark_splitter(tok) if split_marks else (lambda ids: ids)
    rows = []
    for s in decision_states(game):
        player = game.current_player(s)
        ids = split(encode_prompt(tok, render(game, s, player, fmt))) + [open_id]

        def token(a):
            t = tok(game.action_text(a), add_special_tokens=False)["input_ids"]
            if len(t) != 1:
                raise ValueError(f"move {game.action_text(a)!r} is {len(t)} tokens: this benchmark needs one")
            return t[0]

        rows.append((ids, [token(a) for a in game.legal_actions(s)], [token(a) for a in optimal_actions(game, s)],
                     [token(a) for a in threat_moves(s)]))
    return rows


def target_loss(logits, target, kind="uniform"):
    """Loss toward the optimal moves; ``target`` is uniform over them (rows sum to 1).
    ``uniform``: cross-entropy to that distribution (the mass must also split evenly among
    equal moves); ``set``: ``-log P(optimal)``, only the mass on the set counts, which is
    what the P(optimal) metric measures."""
    logp = torch.log_softmax(logits, -1)
    if kind == "uniform":
        return -(target * logp).sum(-1).mean()
    if kind == "set":
        return -torch.logsumexp(logp.masked_fill(target == 0, float("-inf")), -1).mean()
    raise ValueError(f"unknown loss {kind!r}: uniform or set")


ARCHS = ("llama", "llama_abspos", "gpt2")


class AbsolutePositions(torch.nn.Module):
    """A token embedding plus a learned absolute position embedding (GPT-2's), so every
    residual vector, and so every attention VALUE, carries its position; with RoPE alone
    position enters only the query-key products."""

    def __init__(self, embed, n_positions):
        super().__init__()
        self.embed = embed  # the same module: the tied LM head keeps its weight
        self.positions = torch.nn.Embedding(n_positions, embed.embedding_dim)
        torch.nn.init.normal_(self.positions.weight, std=0.02)

    @property
    def weight(self):  # the token embedding's, as transformers expects of an input embedding
        return self.embed.weight

    def forward(self, ids):
        return self.embed(ids) + self.positions.weight[: ids.shape[1]]


def fresh_model(arch, cfg, tok):
    """A freshly initialised model of ``cfg``'s width, depth and heads: ``llama`` the
    embedded model's own architecture (RoPE); ``llama_abspos`` the same plus
    :class:`AbsolutePositions` (RoPE kept: the one change is position in the residual
    stream); ``gpt2`` transformers' GPT-2 (learned absolute positions, LayerNorm, GELU MLP
    of ``intermediate_size``, no dropout, tied embeddings)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from lmselfplay.models.pretrain import make_model

    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {list(ARCHS)}")
    if arch == "gpt2":
        return GPT2LMHeadModel(GPT2Config(
            vocab_size=len(tok), n_embd=cfg.hidden_size, n_layer=cfg.num_layers, n_head=cfg.num_heads,
            n_positions=cfg.max_seq_len, n_inner=cfg.intermediate_size, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model = make_model(cfg, tok)
    if arch == "llama_abspos":
        model.model.embed_tokens = AbsolutePositions(model.model.embed_tokens, cfg.max_seq_len)
    return model


def move_logits(model, rows, pad_id):
    ids, att = pad_batch([r[0] for r in rows], pad_id)
    hidden = model.base_model(input_ids=ids, attention_mask=att).last_hidden_state
    last = att.sum(1) - 1  # right padding: the last real token predicts the move
    return model.lm_head(hidden[torch.arange(len(rows)), last]).float()


@torch.no_grad()
def measure(model, rows, pad_id, chunk=512):
    model.eval()
    p_opt, arg_ok = [], []
    for i in range(0, len(rows), chunk):
        part = rows[i : i + chunk]
        logits = move_logits(model, part, pad_id)
        for lg, (_, legal, opt, *_) in zip(logits, part):
            p = torch.softmax(lg[legal], 0)
            is_opt = torch.tensor([t in opt for t in legal])
            p_opt.append(float(p[is_opt].sum()))
            arg_ok.append(bool(is_opt[int(p.argmax())]))
    n = len(rows)
    return {"p_optimal": sum(p_opt) / n, "argmax_optimal": sum(arg_ok) / n, "min_p_optimal": min(p_opt)}


def supervised(model, rows, pad_id, steps, lr, batch, eval_every, seed, label, eval_positions=0, warmup=0,
               loss_kind="uniform"):
    """Cross-entropy to the uniform distribution over the optimal move tokens. Curves are
    measured on ``eval_positions`` fixed positions (0: all); the last point on all."""
    rng = random.Random(seed)
    probe = random.Random(seed + 1).sample(rows, eval_positions) if 0 < eval_positions < len(rows) else rows
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / warmup) if warmup else 1.0)
    curve, losses, t0 = [], [], time.time()
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            m = measure(model, rows if step == steps else probe, pad_id)
            loss = sum(losses) / len(losses) if losses else float("nan")  # training loss since the last point
            curve.append({"step": step, "seconds": round(time.time() - t0, 1),
                          "positions": len(rows if step == steps else probe), "train_loss": loss, **m})
            losses = []
            print(f"  [{label}] step {step:4d} {curve[-1]['seconds']:7.1f}s  loss {loss:.3f}  P(optimal) "
                  f"{m['p_optimal']:.3f}  argmax {m['argmax_optimal']:.3f}  min {m['min_p_optimal']:.3f}", flush=True)
        if step == steps:
            break
        model.train()
        part = rng.sample(rows, batch)
        logits = move_logits(model, part, pad_id)
        target = torch.zeros_like(logits)
        for k, (_, _, o, *_) in enumerate(part):
            target[k, o] = 1.0 / len(o)
        loss = target_loss(logits, target, loss_kind)
        losses.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return curve


def mlp_reference(game, steps, lr, batch, eval_every, seed, subset=0, loss_kind="uniform"):
    """The same targets, optimizer and budget for an MLP (27 -> 256 -> 256 -> 9) on the
    board planes (X, O, side to move): a network that need not READ the board. Its curve
    is the ceiling the text model could reach if reading were free."""
    states = list(decision_states(game))
    if subset:
        states = random.Random(seed + 2).sample(states, subset)
    x = torch.tensor([[float(c == m) for m in (1, 2) for c in s.board] + [float(s.player == 0)] * 9 for s in states])
    legal, target = torch.zeros(len(states), 9, dtype=torch.bool), torch.zeros(len(states), 9)
    for i, s in enumerate(states):
        legal[i, game.legal_actions(s)] = True
        best = optimal_actions(game, s)
        target[i, best] = 1.0 / len(best)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(27, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 9))
    opt, rng, curve, t0 = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0), random.Random(seed), [], time.time()
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            with torch.no_grad():
                p = torch.softmax(net(x).masked_fill(~legal, -1e9), -1)
                p_opt = (p * (target > 0)).sum(-1)
                arg_ok = target.gather(1, p.argmax(-1, keepdim=True)).squeeze(1) > 0
            curve.append({"step": step, "seconds": round(time.time() - t0, 1), "positions": len(states),
                          "p_optimal": float(p_opt.mean()), "argmax_optimal": float(arg_ok.float().mean()),
                          "min_p_optimal": float(p_opt.min())})
            print(f"  [mlp] step {step:4d}  P(optimal) {curve[-1]['p_optimal']:.3f}  "
                  f"argmax {curve[-1]['argmax_optimal']:.3f}", flush=True)
        if step == steps:
            break
        part = rng.sample(range(len(states)), batch)
        loss = target_loss(net(x[part]), target[part], loss_kind)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return curve


def continue_pretraining(model, tok, steps, task_weights, lr, seed):
    """Continue the tiny model's own pre-training loss on a changed corpus mix."""
    from lmselfplay.models import pretrain, tiny

    cfg = tiny.TinyConfig(task_weights=task_weights, seed=seed)
    stream = pretrain.batches(cfg, tok, pretrain.Corpus(cfg, random.Random(seed)), random.Random(seed + 1))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    model.train()
    t0 = time.time()
    for step in range(steps):
        ids, att, w, soft = next(stream)
        loss = pretrain.weighted_lm_loss(model, ids, att, w, soft)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            print(f"  [pretrain] step {step} loss {loss.item():.3f} {time.time() - t0:.0f}s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--eval_every", type=int, default=100)
    ap.add_argument("--eval_positions", type=int, default=1000, help="positions for the curve (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--which", default="embedded,fresh", help="comma list of embedded, fresh, mlp (board-plane MLP: the no-reading ceiling)")
    ap.add_argument("--pretrain_steps", type=int, default=0, help="continue pre-training first (lever test)")
    ap.add_argument("--pretrain_lr", type=float, default=1e-3)
    ap.add_argument("--task_weights", default="", help="corpus mix for --pretrain_steps")
    ap.add_argument("--split_marks", action="store_true",
                    help="lever: split BPE's glued ' X' / ' O' tokens so every board cell has a fixed width")
    ap.add_argument("--format", default="default",
                    help="lever: board text (default, grid, named; +_last: board just before Answer:, +_only: nothing else)")
    ap.add_argument("--subset", type=int, default=0,
                    help="train and measure on this many random positions only (0: all): can it even memorize?")
    ap.add_argument("--loss", default="uniform", choices=("uniform", "set"),
                    help="uniform: cross-entropy to uniform over the optimal moves; set: -log P(optimal)")
    ap.add_argument("--legal_steps", type=int, default=0,
                    help="first train this many steps toward uniform over the LEGAL moves (the corpus's target)")
    ap.add_argument("--legal_target", default="legal", choices=("legal", "threats"),
                    help="--legal_steps target: uniform over the legal moves, or over threat_moves")
    ap.add_argument("--warmup", type=int, default=0, help="linear lr warmup steps")
    ap.add_argument("--layers", type=int, default=0, help="fresh model's layers (0: the embedded shape)")
    ap.add_argument("--heads", type=int, default=0, help="fresh model's heads (0: the embedded shape)")
    ap.add_argument("--intermediate", type=int, default=0, help="fresh model's MLP size (0: the embedded shape)")
    ap.add_argument("--arch", default="llama", choices=ARCHS,
                    help="fresh model's architecture (llama: the embedded one's; llama_abspos: + learned "
                         "absolute positions; gpt2)")
    ap.add_argument("--cell_tokens", action="store_true",
                    help="lever (fresh only): one token per cell and mark ('5X'; see add_cell_tokens), for --format named*")
    ap.add_argument("--name", default="bench_ttt_representation")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmselfplay.games.model_texts import make_game_for
    from lmselfplay.models.cache import ensure_tiny_model
    from lmselfplay.models.tiny import TinyConfig

    path = args.model or str(ensure_tiny_model())
    tok = AutoTokenizer.from_pretrained(path)
    if args.cell_tokens:
        if "embedded" in args.which.split(","):
            ap.error("--cell_tokens changes the vocabulary: fresh models only (--which fresh)")
        add_cell_tokens(tok, args.format)
    rows = move_token_data(tok, make_game_for("tictactoe", path), args.split_marks, args.format)
    if args.subset:
        rows = random.Random(args.seed + 2).sample(rows, args.subset)
    print(f"{len(rows)} positions; model {path}", flush=True)
    results = {"positions": len(rows), "args": vars(args), "curves": {}}
    for which in args.which.split(","):
        torch.manual_seed(args.seed)
        if which == "mlp":
            results["curves"][which] = mlp_reference(make("tictactoe"), args.steps, args.lr, args.batch,
                                                     args.eval_every, args.seed, args.subset, args.loss)
            continue
        if which == "embedded":
            model = AutoModelForCausalLM.from_pretrained(path)
            if args.pretrain_steps:
                continue_pretraining(model, tok, args.pretrain_steps, args.task_weights, args.pretrain_lr, args.seed)
        else:
            shape = {k: v for k, v in (("num_layers", args.layers), ("num_heads", args.heads),
                                       ("intermediate_size", args.intermediate)) if v}
            model = fresh_model(args.arch, TinyConfig(**shape), tok)  # same shape unless --layers/--heads
        print(f"  [{which}] {sum(p.numel() for p in model.parameters()):,} parameters", flush=True)
        if args.legal_steps:  # uniform over the legal moves (the corpus's own target) or over threat_moves
            first = [(r[0], r[1], r[3] if args.legal_target == "threats" else r[1]) for r in rows]
            results["curves"][which + "_legal"] = supervised(
                model, first, tok.pad_token_id, args.legal_steps, args.lr,
                args.batch, args.legal_steps, args.seed, which + " legal", args.eval_positions, args.warmup)
        results["curves"][which] = supervised(model, rows, tok.pad_token_id, args.steps, args.lr, args.batch,
                                              args.eval_every, args.seed, which, args.eval_positions, args.warmup, args.loss)
    optimal = {w: c for w, c in results["curves"].items() if not w.endswith("_legal")}
    print("\nstep  " + "  ".join(f"{w:>18}" for w in optimal))
    for i, row in enumerate(next(iter(optimal.values()))):
        print(f"{row['step']:4d}  " + "  ".join(f"{c[i]['p_optimal']:8.3f} ({c[i]['argmax_optimal']:.3f})"
                                               for c in optimal.values()))
    save_results(args.name, results)


if __name__ == "__main__":
    main()
