"""Search self-play: AlphaZero's ratchet with the language model as the network (the algorithm of
``recipes/search_selfplay.py``, whose docstring is its box, steps 1-8).

The LLM's prior is its next-token distribution over the legal move tokens after ``<move>``, its
value a small head on the hidden state at the end of the prompt
(:class:`~lmselfplay.lm.search_eval.LLMEvaluator`); PUCT self-play with it
(:mod:`lmselfplay.search_selfplay.search_targets`: steps 2-3) makes visit-distribution targets that
the policy trainer distils back. What the loop works on is one :class:`SearchSelfPlay` (made by
:func:`make_search_selfplay`, restored by :func:`restore`, saved by :func:`save`); the steps are functions of it:

* step 1, opponents: :func:`opponent_name` (mirror or a league snapshot), :func:`opponent_evaluators`;
* step 4, distillation: :func:`distill`; step 5, the value (or Q) head: :func:`train_head`;
* step 6, the league: :func:`snapshot` (weights + head), :func:`snapshot_engines` (frozen evaluators).

Its configs are :mod:`lmselfplay.search_selfplay.config`, its evaluation (step 7)
:mod:`lmselfplay.search_selfplay.metrics`: the steps never import evaluation. The policy trainer and
the league are rl's, the search is alphazero's.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from lmselfplay.alphazero.adapter import CachedGame, SearchGame
from lmselfplay.games.model_texts import make_game_for
from lmselfplay.lm.prompt import thinks
from lmselfplay.lm.search_eval import LLMEvaluator, QHead, ValueHead, hidden_size
from lmselfplay.models.policy import (
    frozen_policy,
    load_policy,
    policy_weights,
    resolve_model_path,
)
from lmselfplay.rl.league import League
from lmselfplay.rl.trainer import PolicyTrainer
from lmselfplay.search_selfplay.config import SearchSelfPlayArgs, SearchSelfPlayConfigs
from lmselfplay.search_selfplay.search_targets import LEARNER, Record, distill_samples, q_loss
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.run import Run

HEAD_PREFIX = "head."  # the value / Q head's entries in a league snapshot


def make_head(args: SearchSelfPlayArgs, model: Any, game: Any) -> ValueHead | QHead:
    """The value head, or with ``q_head`` the Q head, sized for ``model`` and ``game``."""
    if args.q_head:
        return QHead(hidden_size(model), game.n_actions, args.value_width)
    return ValueHead(hidden_size(model), args.value_width)


def snapshot(trainer: PolicyTrainer, head: ValueHead | QHead) -> dict[str, torch.Tensor]:
    """The learner's policy weights (adapters only under LoRA) + its head, on CPU."""
    out = policy_weights(trainer.unwrapped)
    out.update({HEAD_PREFIX + k: v.detach().clone() for k, v in head.state_dict().items()})
    return out


def snapshot_engines(template: Any, tok: Any, game: Any, args: SearchSelfPlayArgs):
    """The league's engine factory: ``frozen_evaluator(weights, version)``, a frozen LLM evaluator."""

    def frozen_evaluator(weights: dict[str, torch.Tensor], version: int) -> LLMEvaluator:
        head = make_head(args, template, game)
        head.load_state_dict({k[len(HEAD_PREFIX):]: v for k, v in weights.items() if k.startswith(HEAD_PREFIX)})
        model = frozen_policy(template, {k: v for k, v in weights.items() if not k.startswith(HEAD_PREFIX)})
        return LLMEvaluator(model, tok, game, head.eval(), args.eval_batch)

    return frozen_evaluator


def train_head(head: ValueHead | QHead, opt: torch.optim.Optimizer, evaluator: LLMEvaluator,
               replay: list[Record], args: SearchSelfPlayArgs, rng: random.Random) -> dict[str, float]:
    """``value_steps`` steps on minibatches of the window: (z - v)^2 for the value head, or
    :func:`~lmselfplay.search_selfplay.search_targets.q_loss` for the Q head. The LLM is frozen
    here, so each distinct prompt's hidden state (and its prior over the move tokens) is computed
    once and reused by every step."""
    index: dict[tuple[int, ...], int] = {}
    for r in replay:
        index.setdefault(tuple(r.prompt_ids), len(index))
    prompts = list(index)
    with torch.no_grad():
        parts = [evaluator.forward([list(p) for p in prompts[i : i + args.eval_batch]])
                 for i in range(0, len(prompts), args.eval_batch)]
    hidden = torch.cat([h.float() for _, h in parts])
    prior = torch.cat([torch.softmax(lg, -1)[:, evaluator.tokens] for lg, _ in parts]) if args.q_head else None
    losses = []
    for _ in range(args.value_steps):
        batch = rng.sample(replay, min(args.batch_size, len(replay)))
        rows = torch.tensor([index[tuple(r.prompt_ids)] for r in batch])
        z = torch.tensor([r.z for r in batch])
        if args.q_head:
            legal = torch.zeros(len(batch), head.n_actions)
            for i, r in enumerate(batch):
                legal[i, r.legal] = 1.0
            target = torch.tensor([r.q_target for r in batch], dtype=torch.float)
            loss = q_loss(head(hidden[rows]), prior[rows], legal, target, z)
        else:
            loss = ((head(hidden[rows]) - z) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {f"train/{'q' if args.q_head else 'value'}_loss": float(np.mean(losses))} if losses else {}


def distill(trainer: PolicyTrainer, replay: list[Record], tok: Any, game: Any, tokens: list[int],
            args: SearchSelfPlayArgs, rng: random.Random) -> dict[str, float]:
    """Step 4: ``distill_steps`` trainer steps on minibatches of the window (the visit
    distribution pi as the move token's target); each metric's mean over the steps."""
    stats: dict[str, list[float]] = {}
    for _ in range(args.distill_steps):
        batch = rng.sample(replay, min(args.batch_size, len(replay)))
        for k, v in trainer.step(distill_samples(batch, tok, game, tokens, trainer.step_count)).items():
            stats.setdefault(k, []).append(v)
    return {f"train/{k}": float(np.mean(v)) for k, v in stats.items()}


@dataclass
class SearchSelfPlay:
    """What the loop works on, built once by :func:`make_search_selfplay` (a resume then restores it)."""

    game: Any
    face: CachedGame
    tok: Any
    trainer: PolicyTrainer
    head: ValueHead | QHead
    head_opt: torch.optim.Optimizer
    evaluator: LLMEvaluator
    league: League
    rng: random.Random
    np_rng: np.random.Generator
    replay: list[list[Record]]


def make_search_selfplay(cfg: SearchSelfPlayConfigs, run: Run) -> SearchSelfPlay:
    """The game, the policy, its trainer, value head, evaluator and league, fresh, each
    component from its own config."""
    args = cfg.search
    game = make_game_for(args.game, resolve_model_path(cfg.policy.model_name_or_path), **json.loads(args.game_args))
    face = CachedGame(SearchGame(game))
    model, tok = load_policy(cfg.policy, device=args.device)
    if thinks(tok):  # a template that thinks by default (Qwen3), which the config alone cannot tell
        raise ConfigError("search self-play reads the LLM's prior right after <move> (no think block), but this "
                          "policy's chat template opens one: set enable_thinking: false")
    trainer = PolicyTrainer(model, tok, cfg.trainer, accelerator=run.acc, total_steps=args.max_steps,
                            target_loss=cfg.target_loss, surrogate=None, temperature=cfg.sampling.temperature,
                            seed=cfg.run.seed)
    head = make_head(args, trainer.unwrapped, game)
    head_opt = torch.optim.Adam(head.parameters(), lr=args.value_lr)
    evaluator = LLMEvaluator(trainer.unwrapped, tok, game, head, args.eval_batch)
    if evaluator.tokens is None:
        raise ConfigError(f"game {args.game!r}: distillation needs every move answer to be one token after <move>")
    league = League(cfg.league, snapshot_engines(trainer.unwrapped, tok, game, args))
    seed = cfg.run.seed
    return SearchSelfPlay(game, face, tok, trainer, head, head_opt, evaluator, league,
                          random.Random(seed), np.random.default_rng(seed), [])


def restore(run: Run, s: SearchSelfPlay) -> int:
    """--resume: trainer, head, replay, league and RNGs from ``run.checkpoint``; else the
    initial policy joins the league's hall of fame (permanent). The iteration to go on from."""
    if run.checkpoint is None:
        s.league.hall.append(s.league.add(0, snapshot(s.trainer, s.head)))
        return 1
    extra = s.trainer.load_checkpoint(run.checkpoint)
    s.head.load_state_dict(extra["head"])
    s.head_opt.load_state_dict(extra["head_opt"])
    s.replay = [[Record(**r) for r in part] for part in extra["replay"]]
    s.league.load_state_dict(extra["league"])
    s.rng.setstate(extra["rng"])
    s.np_rng.bit_generator.state = extra["np_rng"]
    torch.set_rng_state(extra["torch_rng"])
    return extra["iteration"] + 1


def save(s: SearchSelfPlay, cfg: SearchSelfPlayConfigs, it: int) -> None:
    """Step 8: the trainer's atomic checkpoint carries the rest of ``s`` as ``extra`` (what
    :func:`restore` reads back)."""
    extra = {"iteration": it, "head": s.head.state_dict(), "head_opt": s.head_opt.state_dict(),
             "replay": [[asdict(r) for r in part] for part in s.replay], "league": s.league.state_dict(),
             "rng": s.rng.getstate(), "np_rng": s.np_rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
             "config": cfg.as_dict()}
    path = s.trainer.save_checkpoint(cfg.run.output_dir, extra, keep=cfg.search.keep_checkpoints)
    s.head.save(path / "model")


def opponent_evaluators(s: SearchSelfPlay, games: list[Any]) -> dict[str, LLMEvaluator]:
    """The learner's evaluator and one frozen evaluator per league opponent of this round."""
    evaluators = {LEARNER: s.evaluator}
    for g in games:
        if g.opponent != "mirror" and g.opponent not in evaluators:
            evaluators[g.opponent] = s.league.engine_for(next(x for x in s.league.ring + s.league.hall
                                                              if x.name == g.opponent))
    return evaluators


def opponent_name(league: League, rng: random.Random) -> str:
    """Step 1: one game's opponent, drawn by the league: ``mirror`` or a snapshot's name."""
    kind, snap = league.sample_opponent(rng)
    return "mirror" if snap is None else snap.name



def __getattr__(name: str):
    if name == "build":
        raise AttributeError("search_selfplay.steps.build is make_search_selfplay(cfg, run)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
