"""Search self-play's targets: PUCT games with the LLM as the network, and what they teach.

* :func:`plan_games`, :func:`collect` — batched games where every move is chosen by
  :class:`~lmselfplay.alphazero.BatchedMCTS` with an LLM evaluator
  (:class:`~lmselfplay.lm.search_eval.LLMEvaluator`): Dirichlet root noise and tau = 1 for
  the first ``temperature_moves`` plies, then the most visited move. Each game is mirror
  play (the learner on both seats) or the learner against a frozen opponent (its own
  evaluator, searched the same way). Frozen seats change which states are reached but
  never give labels: only the learner's searched turns become :class:`Record` s.
* :func:`blended_q_target` — with the optional Q head, the per-move Q target
  ``c(a) Q_PUCT(a) + (1 - c(a)) Q_prior(a)``, ``c(a) = N(a) / (N(a) + lambda_Q)``;
  :func:`q_loss` — the Q head's loss.
* :func:`distill_samples` — trainer samples whose target is the visit distribution pi on
  the move token (the supervised-target term of :class:`~lmselfplay.rl.trainer.PolicyTrainer`).

Deterministic play for evaluation (``search_agent``, ``play_match``) is in
:mod:`lmselfplay.search_selfplay.metrics`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmselfplay.alphazero.mcts import search_policy
from lmselfplay.alphazero.searched_games import SearchedGame, SelfPlaySettings, play_searched
from lmselfplay.games.base import random_legal_reset
from lmselfplay.games.text import format_answer
from lmselfplay.lm.prompt import encode_completion
from lmselfplay.lm.trajectory import Sample

LEARNER = "learner"


@dataclass
class Record:
    """One learner turn: the prompt, the search's visit distribution pi over all actions
    (0 off the legal moves), root Q per action, z = the final result for the mover, and
    (Q head only) the blended Q target per action (empty without a Q head)."""

    prompt_ids: list[int]
    legal: list[int]
    pi: list[float]
    q: list[float]
    z: float = 0.0
    opponent: str = "mirror"
    q_target: list[float] = field(default_factory=list)


def blended_q_target(n: np.ndarray, q_search: np.ndarray, q_prior: np.ndarray, legal: np.ndarray,
                     lam: float) -> np.ndarray:
    """``Q_target(a) = c(a) Q_PUCT(a) + (1 - c(a)) Q_prior(a)``, ``c(a) = N(a) / (N(a) + lam)``,
    0 off the ``legal`` mask. ``Q_PUCT`` is the root's mean backed-up value of each move
    (for the mover), ``Q_prior`` the network's own Q before the search. A move the search
    never visited (N = 0) keeps its prior Q exactly: it was not evaluated, so its target is
    a low-weight anchor, not a backed-up 0; the more visits, the more the search's value
    counts (lam visits weigh as much as the prior)."""
    if not lam > 0:
        raise ValueError(f"lambda_Q must be > 0, got {lam}")
    c = n / (n + lam)
    return np.where(legal, c * q_search + (1 - c) * q_prior, 0.0)


def q_loss(q: Any, prior: Any, legal: Any, q_target: Any, z: Any) -> Any:
    """The Q head's loss on a batch (torch tensors; rows are positions): the mean over legal
    moves of ``(Q(s, a) - Q_target(a))^2``, plus ``(z - V(s))^2`` with
    ``V(s) = sum_a pi(a|s) Q(s, a)`` (pi = the LLM's prior renormalized over legal moves).
    The z term grounds Q in real game results: the blended targets alone are bootstrapped
    from the head's own estimates (in the tree and as the anchor) and could drift together."""
    from lmselfplay.lm.search_eval import q_value

    per_move = ((q - q_target) ** 2 * legal).sum(-1) / legal.sum(-1).clamp_min(1)
    return (per_move + (z - q_value(q, prior, legal)) ** 2).mean()


def plan_games(face: Any, n_games: int, rng: random.Random, opponents: Callable[[random.Random], str],
               reset_fraction: float = 0.0, reset_max_plies: int = 4) -> list[SearchedGame]:
    """``n_games`` starts: a fraction from random legal resets; the opponent of each from
    ``opponents(rng)`` ("mirror" or a frozen snapshot's name, which takes a random seat)."""
    out = []
    for _ in range(n_games):
        state = random_legal_reset(face.game, rng, reset_max_plies) if rng.random() < reset_fraction \
            else face.game.new_initial_state()
        opp = opponents(rng)
        seats = (0, 1) if opp == "mirror" else (rng.randrange(2),)
        out.append(SearchedGame(face.position(state), seats, opp))
    return out


def collect(face: Any, games: list[SearchedGame], evaluators: dict[str, Any], n_sims: int, rng: random.Random,
            c_puct: float = 1.5, eps: float = 0.25, alpha: float = 0.3,
            temperature_moves: int = 4, progress: Any = None,
            target_tau: float = 1.0, q_lambda: float = 4.0) -> tuple[list[Record], dict[str, float]]:
    """Play ``games`` to the end through the one searched self-play loop
    (:func:`lmselfplay.alphazero.searched_games.play_searched`); ``evaluators[LEARNER]`` and one per
    frozen opponent name. Returns the learner's records (z filled in) and summary statistics.
    A record's pi is the root visit distribution at temperature ``target_tau`` (1: AlphaZero's
    N / sum N; below 1 sharper, so a policy that matches it puts more mass on the most visited
    move). When the learner's evaluator has a Q head, a record also holds the blended Q target
    (:func:`blended_q_target` with ``lam = q_lambda``; Q_prior: the head's Q at the root)."""
    records: list[list[tuple[Record, int]]] = [[] for _ in games]
    ev = evaluators[LEARNER]

    def record(i: int, g: SearchedGame, legal: np.ndarray, n: np.ndarray, q: np.ndarray) -> None:
        q_target = blended_q_target(n, q, ev.q_values([g.pos])[0], legal, q_lambda) \
            if getattr(ev, "has_q", False) else np.zeros(0)
        records[i].append((Record(ev.prompt_ids(g.pos.state), np.flatnonzero(legal).tolist(),
                                  search_policy(n, target_tau, legal).tolist(), q.tolist(),
                                  opponent=g.opponent, q_target=q_target.tolist()), g.pos.player))

    settings = SelfPlaySettings(n_sims=n_sims, c_puct=c_puct, dirichlet_eps=eps, dirichlet_alpha=alpha,
                                temperature_moves=temperature_moves)
    play_searched(face, games, evaluators, LEARNER, settings, rng, record, progress)
    out = []
    for g, recs in zip(games, records):
        for r, player in recs:
            r.z = float(g.result[player])
            out.append(r)
    mirror = [g.result[0] for g in games if g.opponent == "mirror"]
    frozen = [g.result[g.learner[0]] for g in games if g.opponent != "mirror"]
    stats = {"selfplay/games": float(len(games)), "selfplay/records": float(len(out)),
             "selfplay/mean_plies": float(np.mean([g.ply for g in games]))}
    if mirror:
        stats["selfplay/first_player_return"] = float(np.mean(mirror))
    if frozen:
        stats["selfplay/vs_frozen_return"] = float(np.mean(frozen))
    return out, stats


def distill_samples(records: list[Record], tokenizer: Any, game: Any, move_tokens: list[int],
                    version: int = 0) -> list[Sample]:
    """One trainer sample per distinct prompt: target = the mean visit distribution pi of
    its records over the legal move tokens at the move token (index after ``<move>``),
    weight = the number of records (the cross-entropy is linear in the target, so this
    is exactly the sum of the records' losses, at one forward per position); completion =
    the most visited move's answer. The softmax is over the whole vocabulary, so the
    cross-entropy also pushes probability off every non-move token: illegal answers stay
    improbable without renormalizing."""
    groups: dict[tuple[int, ...], list[Record]] = {}
    for r in records:
        groups.setdefault(tuple(r.prompt_ids), []).append(r)
    prefix = len(encode_completion(tokenizer, "<move>", eos=False))
    out = []
    for prompt, recs in groups.items():
        pi = np.mean([r.pi for r in recs], axis=0)
        legal = recs[0].legal
        completion = encode_completion(tokenizer, format_answer(game.action_text(int(np.argmax(pi)))), eos=False)
        target = (prefix, [move_tokens[a] for a in legal], [float(pi[a]) for a in legal])
        out.append(Sample(list(prompt), completion, [0.0] * len(completion), 0.0,
                          float(np.mean([r.z for r in recs])), "search", game.name, version,
                          weight=float(len(recs)), target=target))
    return out
