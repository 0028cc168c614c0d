"""The search self-play recipe's evaluation (``recipes/search_selfplay.py``, step 7):

* :func:`strength_per_budget` — budget 0 is the raw LLM (the exact metrics its game declares,
  greedy games vs the reference bots, :func:`illegal_mass`), then every search budget from the
  fixed :func:`openings` vs a random player and (if solvable) the exact solver;
* :func:`search_agent` — deterministic play: no noise, argmax of the root visits, or at budget 0
  the raw LLM's most probable next token after ``<move>``; :func:`play_match` — its games from
  every start, once as each player (an answer that is not a legal move loses the game);
* :func:`plot_run` — ``budgets.png`` and ``raw_policy.png``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lmselfplay.alphazero.batched_mcts import BatchedMCTS
from lmselfplay.alphazero.net_strength import exact_agent, random_agent
from lmselfplay.eval import game_metrics
from lmselfplay.games import make
from lmselfplay.games.base import OPTIMAL_MOVES, random_legal_reset
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm import readout as policy_readout
from lmselfplay.lm.engines import HFEngine, SamplingParams
from lmselfplay.lm.search_eval import LLMEvaluator
from lmselfplay.search_selfplay.config import SearchSelfPlayArgs, SearchSelfPlayConfigs
from lmselfplay.utils.stats import wilson


def openings(face: Any, cfg: SearchSelfPlayConfigs) -> list[Any]:
    """Fixed evaluation starts: the initial position and random legal openings (seeded)."""
    args = cfg.search
    rng = random.Random(f"{cfg.run.seed}/openings")
    starts = [face.game.new_initial_state()]
    starts += [random_legal_reset(face.game, rng, args.opening_plies) for _ in range(args.eval_openings - 1)]
    return [face.position(s) for s in starts]


def strength_per_budget(face: Any, evaluator: LLMEvaluator, model: Any, tok: Any, cfg: SearchSelfPlayConfigs,
                        it: int) -> dict[str, float]:
    """Step 7: budget 0 = the raw LLM (exact metrics + greedy games vs the game's reference
    bots), then every budget from the fixed openings vs random and (if solvable) exact."""
    game, args, seed = face.game, cfg.search, cfg.run.seed
    out: dict[str, float] = {}
    greedy = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0, stop=MOVE_STOP, seed=seed)
    positions = None
    if game.exact_metric == OPTIMAL_MOVES and args.eval_positions > 0:
        positions = policy_readout.sampled_decision_states(game, args.eval_positions, f"{seed}/positions")
    raw = game_metrics.policy_metrics(HFEngine(model, tok), tok, game, positions, n_games=args.eval_games,
                                sampling=greedy, seed=cfg.run.seed, max_new_tokens=args.max_new_tokens)
    out.update({f"eval/raw_{k}": v for k, v in raw.items()})
    if game.exact_metric == OPTIMAL_MOVES:
        out["eval/raw_illegal_mass"] = illegal_mass(evaluator, face)
    starts = openings(face, cfg)
    opponents = {"random": random_agent(face, seed)}
    if game.exact_metric == OPTIMAL_MOVES:
        opponents["exact"] = exact_agent(face, seed)
    for k in args.eval_budgets:
        me = search_agent(face, evaluator, k, cfg.puct.c_puct)
        for name, opp in opponents.items():
            r = play_match(face, me, opp, starts)
            out[f"eval/sims{k}_vs_{name}_win"], out[f"eval/sims{k}_vs_{name}_loss"] = r["win"], r["loss"]
            out[f"eval/sims{k}_vs_{name}_draw"] = r["draw"]
            out[f"eval/sims{k}_vs_{name}_loss_ci_high"] = r["loss_ci"][1]
    return out


def search_agent(face: Any, evaluator: Any, n_sims: int, c_puct: float = 1.5) -> Callable[[list[Any]], list[int]]:
    """Deterministic play: argmax root visits after ``n_sims`` simulations (no noise); at
    ``n_sims = 0`` the raw LLM's most probable token after ``<move>`` over the WHOLE
    vocabulary (-1 when it is not a legal move: the caller scores that as a loss)."""

    def act(positions: list[Any]) -> list[int]:
        if n_sims > 0:
            search = BatchedMCTS(face, evaluator, c_puct, capacity=len(positions) * (n_sims + 1))
            search.set_roots(positions)
            N, _ = search.search(n_sims)
            return [int(a) for a in np.argmax(N, axis=1)]
        out = []
        with torch.no_grad():
            logits, _ = evaluator.forward([evaluator.prompt_ids(p.state) for p in positions])
        for p, tok in zip(positions, logits.argmax(-1).tolist()):
            a = evaluator.tokens.index(tok) if tok in evaluator.tokens else -1
            out.append(a if a >= 0 and face.legal(p)[a] else -1)
        return out

    return act


def play_match(face: Any, me: Callable, other: Callable, starts: list[Any]) -> dict[str, Any]:
    """``me`` against ``other`` from every start, once as each player. Results for ``me``
    with 95% Wilson intervals; an action of -1 (an illegal answer) loses for its author."""
    results = []
    for seat in (0, 1):
        agents = (me, other) if seat == 0 else (other, me)
        pos = list(starts)
        res: list[float | None] = [None] * len(starts)
        while True:
            live = [i for i in range(len(pos)) if res[i] is None]
            if not live:
                break
            for player in (0, 1):
                idx = [i for i in live if res[i] is None and pos[i].player == player]
                if not idx:
                    continue
                for i, a in zip(idx, agents[player]([pos[i] for i in idx])):
                    if a < 0:
                        res[i] = -1.0 if player == seat else 1.0
                        continue
                    pos[i] = face.next_state(pos[i], a)
                    if face.terminal_value(pos[i]) is not None:
                        res[i] = float(face.game.returns(pos[i].state)[seat])
        results += res
    n = len(results)
    w, d = sum(r > 0 for r in results), sum(r == 0 for r in results)
    return {"games": n, "win": w / n, "draw": d / n, "loss": (n - w - d) / n,
            "win_ci": wilson(w, n), "loss_ci": wilson(n - w - d, n), "losses": n - w - d}


def illegal_mass(evaluator: LLMEvaluator, face: Any) -> float:
    """Mean probability of a token that is not a legal move, after ``<move>``, over all positions."""
    states = policy_readout.decision_states(face.game)
    total = 0.0
    for i in range(0, len(states), evaluator.batch_size):
        part = states[i : i + evaluator.batch_size]
        logits, _ = evaluator.forward([evaluator.prompt_ids(s) for s in part])
        p = torch.softmax(logits, -1)
        for row, s in enumerate(part):
            legal = [evaluator.tokens[a] for a in face.game.legal_actions(s)]
            total += 1.0 - float(p[row, legal].sum())
    return total / max(1, len(states))


def plot_run(args: SearchSelfPlayArgs, logger: Any) -> None:
    """``budgets.png`` (win / loss per search budget and opponent) and ``raw_policy.png`` (the
    raw LLM's optimal-move rates, with the game's reference lines, and its illegal mass)."""
    rows = logger.rows()
    keys = sorted({k for r in rows for k in r if k.startswith("eval/sims") and k.endswith(("_win", "_loss"))})
    logger.plot(keys, "budgets.png", title=f"search self-play on {args.game}: strength per budget")
    refs = game_metrics.reference_lines(make(args.game, **json.loads(args.game_args)))  # what the game declares
    references = {f"eval/raw_{m}": refs.get(m, []) for m in ("optimal_move_prob", "greedy_optimal_rate")}
    logger.plot(["eval/raw_optimal_move_prob", "eval/raw_greedy_optimal_rate", "eval/raw_illegal_mass"],
                "raw_policy.png", title="raw LLM (budget 0)", references=references)

