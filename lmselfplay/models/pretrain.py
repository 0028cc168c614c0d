"""The embedded model's pre-training: the corpus stream in the build's mix (:class:`Corpus`),
its batches with the random prior as soft targets at a game turn's move (:class:`batches`,
:func:`soft_target`), the loss (:func:`weighted_lm_loss`) and the resumable loop
(:func:`build_tiny_model`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from lmselfplay.games.model_texts import GAME_PARAMS_ATTR
from lmselfplay.games.text import format_answer
from lmselfplay.lm.batching import pad_batch
from lmselfplay.lm.prompt import encode_completion, encode_prompt, format_prompt
from lmselfplay.models import corpus as st
from lmselfplay.models.tiny import INFO_FILE, TinyConfig
from lmselfplay.models.tokenizer import move_names, train_tokenizer, whole_strings
from lmselfplay.tasks.arithmetic import QUESTION_WRITE_PROMPT, arithmetic_problem, arithmetic_prompt
from lmselfplay.tasks.programs import program_output_prompt, program_write_prompt, python_program
from lmselfplay.tasks.sums import SUM_WRITE_PROMPT, chain_sum_expression, sum_question
from lmselfplay.tasks.task_sets import is_heldout, suite_training_item


class Corpus:
    """An endless, seeded stream of (prompt, answer, alternatives) in the configured mix.

    ``alternatives`` are the answers of every legal move for a game turn (the uniform
    random prior the model is meant to learn: see :func:`soft_target`), else ``None``.
    Games whose moves are free text (Taboo) have no random legal move: their turns are
    the game's own scripted players' (``game.scripted_action``), with hard targets.
    """

    def __init__(self, cfg: TinyConfig, rng: random.Random):
        self.cfg, self.rng = cfg, rng
        w = cfg.weights()
        self.kinds = [k for k, v in w.items() if v > 0]
        self.probs = [w[k] for k in self.kinds]
        self.games = {g: cfg.make_game(g) for g in cfg.game_names()}
        # Games with a start size (Nim) are also played from random starts 1..nim_max_start.
        self.variants: dict[str, list[Any]] = {}
        for g in self.games:
            try:
                self.variants[g] = [cfg.make_game(g, start=s) for s in range(1, cfg.nim_max_start + 1)]
            except (ValueError, TypeError):
                self.variants[g] = [self.games[g]]
        self.buffers: dict[str, list[tuple[str, str, list[str] | None]]] = {g: [] for g in self.games}
        self.move_games = sorted(g for g, game in self.games.items()
                                 if getattr(game, "action_space", "discrete") != "text")

    def sample(self) -> tuple[str, str, list[str] | None]:
        kind = self.rng.choices(self.kinds, weights=self.probs, k=1)[0]
        if kind == "arithmetic":
            p = arithmetic_problem(self.rng)
            while self.cfg.exclude_heldout and is_heldout(p["prompt"]):
                p = arithmetic_problem(self.rng)
            if self.rng.random() < 0.8:
                return arithmetic_prompt(p), p["answer"], None
            return QUESTION_WRITE_PROMPT, p["prompt"], None  # R-Zero's challenger asks
        if kind == "sum_writing":  # R-Zero's challenger asks for a sum (task_form: sum)
            expression = chain_sum_expression(self.rng)
            while self.cfg.exclude_heldout and is_heldout(sum_question(expression)):
                expression = chain_sum_expression(self.rng)
            return SUM_WRITE_PROMPT, expression, None
        if kind == "reasoning_gym":
            item = suite_training_item(self.rng)
            return item.prompt, f"<answer>{item.answer}</answer>", None
        if kind == "programs":
            t = python_program(self.rng)
            while self.cfg.exclude_heldout and is_heldout(t["code"] + t["input"]):
                t = python_program(self.rng)
            if self.rng.random() < 0.75:
                return program_output_prompt(t), t["output"], None
            return program_write_prompt(t), t["code"].rstrip("\n"), None
        if kind == "two_option":
            prompt, label = st.two_option_task(self.rng)
            return prompt, label, None
        if kind == "grid_reading":  # board games only: retry until a game shows a square board
            for _ in range(1000):
                game = self.rng.choice(self.variants[self.rng.choice(self.move_games)])
                task = st.grid_reading_task(game, self.rng)
                if task is not None:
                    return task[0], task[1], None
            raise ValueError("grid_reading: no corpus game shows a square board")
        if kind == "reading":  # random legal play needs enumerable moves (not Taboo's text)
            game = self.rng.choice(self.variants[self.rng.choice(self.move_games)])
            prompt, answer = st.reading_task(game, self.rng)
            return prompt, answer, None
        buf = self.buffers[kind]
        if not buf:  # 16 turns at a time, shuffled so batches mix positions
            game = self.rng.choice(self.variants[kind])
            if getattr(game, "action_space", "discrete") == "text":
                buf.extend((p, a, None) for p, a in st.scripted_turns(game, self.rng, 16))
            else:
                for state, player, action in st.game_decisions(game, self.rng, 16, st.reset_plies(game)):
                    legal = [format_answer(game.action_text(a)) for a in game.legal_actions(state)]
                    buf.append((game.observation_text(state, player),
                                format_answer(game.action_text(action)), legal))
            self.rng.shuffle(buf)
        return buf.pop()


def make_model(cfg: TinyConfig, tok: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    mc = LlamaConfig(
        vocab_size=len(tok), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads, max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if cfg.game_params:  # only then: the config.json of every earlier build stays as it was
        setattr(mc, GAME_PARAMS_ATTR, cfg.game_params)
    model = LlamaForCausalLM(mc)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def encode_example(tok: Any, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """Token ids via THE formatter, and 1 where a token belongs to the answer (+EOS)."""
    p, c = encode_prompt(tok, prompt), encode_completion(tok, answer)
    return p + c, [0] * len(p) + [1] * len(c)


def soft_target(tok: Any, prompt: str, answer: str,
                alternatives: list[str] | None) -> list[tuple[int, list[int], list[float]]]:
    """The random prior along ``answer``'s tokens: every position where the legal answers
    that share ``answer``'s tokens so far go different ways, as (position, next token ids,
    their probabilities under the uniform distribution over the legal answers).

    At those positions the loss is the cross-entropy to that distribution — the expectation
    of the sampled-move loss under the random prior, without its sampling noise (every
    example teaches the whole legal set). A move named by one token (tic-tac-toe, Nim,
    Kuhn) gives one position, uniform over the legal moves; a Go move "D4" gives two: the
    column (weighted by its legal rows) and, after the sampled column, its legal rows.
    """
    if not alternatives or len(alternatives) < 2:
        return []
    encoded = [encode_completion(tok, a) for a in alternatives]
    own = encode_completion(tok, answer)
    start, out = len(encode_prompt(tok, prompt)), []
    live = encoded
    for j in range(len(own)):
        counts: dict[int, int] = {}
        for e in live:
            if len(e) > j:
                counts[e[j]] = counts.get(e[j], 0) + 1
        if len(counts) > 1:
            n = sum(counts.values())
            toks = sorted(counts)
            out.append((start + j, toks, [counts[t] / n for t in toks]))
        live = [e for e in live if len(e) > j and e[j] == own[j]]
        if len(live) < 2:
            break
    return out


SoftTarget = tuple[int, int, list[int], list[float]]  # (row, position, token ids, probabilities)
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[SoftTarget]]


class batches:  # noqa: N801 - an iterator used like the generator function it replaces
    """(input_ids, attention_mask, loss_weight, soft targets) batches, right-padded,
    length-bucketed; soft targets are (row, position, token ids, probabilities).

    ``chunk`` batches worth of examples are sorted by length and cut into batches (then
    shuffled), so that short game turns and long programs are rarely padded together.
    ``state_dict()`` / ``load_state_dict()`` hold everything the next batches depend on
    (both random streams, the corpus's turn buffers, the batches not yet served), so a
    resumed build sees exactly the batches an uninterrupted one would.
    """

    def __init__(self, cfg: TinyConfig, tok: Any, corpus: Any, rng: random.Random, chunk: int = 8):
        self.cfg, self.tok, self.corpus, self.rng, self.chunk = cfg, tok, corpus, rng, chunk
        self.pending: list[list[Any]] = []

    def __iter__(self) -> batches:
        return self

    def __next__(self) -> Batch:
        if not self.pending:
            self.pending = self._group()
        return self._collate(self.pending.pop(0))

    def _group(self) -> list[list[Any]]:
        cfg, examples = self.cfg, []
        while len(examples) < self.chunk * cfg.batch_size:
            prompt, answer, alternatives = self.corpus.sample()
            ids, is_answer = encode_example(self.tok, prompt, answer)
            if len(ids) <= cfg.max_seq_len:
                examples.append((ids, is_answer, soft_target(self.tok, prompt, answer, alternatives)))
        examples.sort(key=lambda e: len(e[0]))
        group = [examples[i : i + cfg.batch_size] for i in range(0, len(examples), cfg.batch_size)]
        self.rng.shuffle(group)
        return group

    def _collate(self, b: list[Any]) -> Batch:
        ids_t, att = pad_batch([ids for ids, _, _ in b], self.tok.pad_token_id)
        w = torch.zeros(ids_t.shape, dtype=torch.float32)
        soft = []
        for i, (ids, is_answer, st_) in enumerate(b):
            w[i, : len(ids)] = torch.tensor([1.0 if a else self.cfg.prompt_loss_weight for a in is_answer])
            for pos, toks, probs in st_:
                w[i, pos] = 0.0  # replaced by the soft target below
                soft.append((i, pos, toks, probs))
        return ids_t, att, w, soft

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "corpus_rng": self.corpus.rng.getstate(),
                "buffers": self.corpus.buffers, "pending": self.pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self.corpus.rng.setstate(state["corpus_rng"])
        self.corpus.buffers = state["buffers"]
        self.pending = state["pending"]


def weighted_lm_loss(model: Any, ids: torch.Tensor, att: torch.Tensor, weight: torch.Tensor,
                     soft: list[SoftTarget] = ()) -> torch.Tensor:
    """Next-token cross-entropy, each target token weighted (0 on padding), plus at each
    ``soft`` (row, position, tokens, probabilities) the cross-entropy to that distribution
    over ``tokens`` (weight 1).

    The LM head runs only where a target has weight > 0: with the default answer-only
    loss that skips ~90% of the positions (game prompts are long, answers 4 tokens).
    """
    hidden = model.model(input_ids=ids, attention_mask=att).last_hidden_state
    w = weight[:, 1:]
    keep = w > 0
    logits = model.lm_head(hidden[:, :-1][keep])
    nll = torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][keep], reduction="none")
    total, count = (nll * w[keep]).sum(), w[keep].sum()
    if soft:
        rows = torch.tensor([r for r, _, _, _ in soft])
        pos = torch.tensor([p - 1 for _, p, _, _ in soft])  # the state that predicts position p
        logp = torch.log_softmax(model.lm_head(hidden[rows, pos]).float(), dim=-1)
        target = torch.zeros_like(logp)
        for k, (_, _, toks, probs) in enumerate(soft):
            target[k, toks] = torch.tensor(probs)
        total = total - (target * logp).sum()
        count = count + len(soft)
    return total / count.clamp_min(1e-8)


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


RESUME_FILE = "build_state.pt"


def save_build_state(resume_dir: Path, state: dict[str, Any]) -> None:
    """Write the build's state atomically (a kill mid-write keeps the previous one)."""
    resume_dir.mkdir(parents=True, exist_ok=True)
    tmp = resume_dir / f".{RESUME_FILE}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, resume_dir / RESUME_FILE)


def load_build_state(resume_dir: Path | None, key: str) -> dict[str, Any] | None:
    """The saved state of a killed build of ``key``, or None (none saved, another key's,
    or unreadable: then the build starts from step 0)."""
    if resume_dir is None or not (resume_dir / RESUME_FILE).is_file():
        return None
    try:
        state = torch.load(resume_dir / RESUME_FILE, weights_only=False)
    except Exception:  # noqa: BLE001 - a damaged state file only costs the steps it held
        return None
    return state if isinstance(state, dict) and state.get("key") == key else None


def starting_point(cfg: TinyConfig, rng: random.Random, base: Path | None = None) -> tuple[Any, Any]:
    """(tokenizer, model) a build trains from: a tokenizer trained on ``cfg``'s corpus (drawn
    from ``rng``) and fresh weights from ``cfg.seed``; or, with ``cfg.continue_from``, that
    build's own tokenizer and weights, from its folder ``base``
    (:func:`lmselfplay.models.cache.ensure_tiny_model` of ``cfg.base_config()``)."""
    if cfg.continue_from:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if base is None:
            raise ValueError(f"a build continuing {cfg.continue_from!r} starts from that build's folder: give base=")
        return AutoTokenizer.from_pretrained(base), AutoModelForCausalLM.from_pretrained(base)
    tok_corpus = Corpus(cfg, rng)
    texts = [format_prompt(None, p) + a
             for p, a, _ in (tok_corpus.sample() for _ in range(cfg.tokenizer_texts))]
    tok = train_tokenizer(cfg, texts, move_names(cfg), whole_strings(cfg))
    torch.manual_seed(cfg.seed)
    return tok, make_model(cfg, tok)


def lr_factor(cfg: TinyConfig, step: int) -> float:
    """The builds' learning-rate factor at ``step``: linear warm-up, cosine decay to 10%."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.train_steps - cfg.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))


def train_step(model: Any, opt: Any, sched: Any, batch: Batch) -> float:
    """One pre-training step on ``batch`` (clipped to grad norm 1); the loss."""
    loss = weighted_lm_loss(model, *batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return loss.item()


def build_tiny_model(cfg: TinyConfig, out_dir: str | Path, progress: bool = True,
                     resume_dir: str | Path | None = None, stop_after: int | None = None,
                     base: Path | None = None) -> dict[str, Any]:
    """Build tokenizer + model into ``out_dir`` (written as is: callers make it atomic).

    Deterministic from ``cfg.seed`` for a given thread count and library versions. With
    ``resume_dir``, the training state (weights, optimizer, schedule, data stream) is saved
    there every ``cfg.checkpoint_every`` steps and a build that finds a state of its own key
    continues from it, so a killed build loses at most that many steps and ends with the
    same weights as an uninterrupted one; the state is deleted when the build is done.
    ``stop_after`` ends the run after that many steps WITHOUT writing the model (saving
    the state first): what a kill at that step leaves. ``base``: the folder of the build
    ``cfg.continue_from`` names (:func:`starting_point`).
    Returns the build info that is also saved as ``tiny_build.json``.
    """
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    resume_dir = Path(resume_dir) if resume_dir is not None else None
    t0 = time.time()
    rng = random.Random(cfg.seed)
    with _torch_threads(cfg.num_threads):
        tok, model = starting_point(cfg, random.Random(rng.random()), base)
        model.train()
        n_params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                weight_decay=cfg.weight_decay)

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(cfg, step))
        stream = batches(cfg, tok, Corpus(cfg, random.Random(rng.random())), random.Random(rng.random()))
        start, tokens, ema, spent = 0, 0, None, 0.0
        saved = load_build_state(resume_dir, cfg.key())
        if saved is not None:
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["optimizer"])
            sched.load_state_dict(saved["scheduler"])
            stream.load_state_dict(saved["stream"])
            start, tokens, ema, spent = saved["step"], saved["tokens"], saved["ema"], saved["seconds"]
        t_run = time.time()
        last = cfg.train_steps if stop_after is None else min(cfg.train_steps, stop_after)
        bar = tqdm(range(start, last), desc="tiny model", disable=not progress, unit="step",
                   initial=start, total=cfg.train_steps)
        for step in bar:
            ids, att, w, soft = next(stream)
            loss = train_step(model, opt, sched, (ids, att, w, soft))
            tokens += int(att.sum())
            ema = loss if ema is None else 0.95 * ema + 0.05 * loss
            bar.set_postfix(loss=f"{ema:.3f}", tok_s=f"{(tokens) / (spent + time.time() - t_run + 1e-9):.0f}")
            done = step + 1
            if resume_dir is not None and (done % max(1, cfg.checkpoint_every) == 0 or done == last):
                save_build_state(resume_dir, {
                    "key": cfg.key(), "step": done, "tokens": tokens, "ema": ema,
                    "seconds": spent + time.time() - t_run, "model": model.state_dict(),
                    "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                    "stream": stream.state_dict()})
        bar.close()
    if last < cfg.train_steps:
        return {"key": cfg.key(), "stopped_at": last}
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    info = {"config": dataclasses.asdict(cfg), "key": cfg.key(), "games": cfg.game_names(),
            "n_params": n_params, "tokens_seen": tokens, "final_loss_ema": ema,
            "build_seconds": round(time.time() - t0, 1), "torch_threads": cfg.num_threads,
            "torch": torch.__version__}
    if saved is not None:
        info["resumed_at_step"] = start
    (out_dir / INFO_FILE).write_text(json.dumps(info, indent=1))
    if resume_dir is not None:
        shutil.rmtree(resume_dir, ignore_errors=True)
    return info
