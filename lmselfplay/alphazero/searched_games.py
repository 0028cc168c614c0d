"""Searched games, batched: many self-play games at once, each move chosen by PUCT search.

Every live game whose player to move uses the same network is searched together (one
:class:`BatchedMCTS`, one network batch per simulation wave). Targets are stored for the
player to move at each position: the search policy pi (tau = 1 over the root visits,
exactly 0 on illegal moves) and the final outcome z for *that* player.

Two additions from search-free self-play PPO work:

* random legal resets: a fraction of games starts after a random number (0..D) of
  random legal moves, so rarely reached positions are trained on too;
* a bank of frozen checkpoints: a fraction of games is played against a bank member
  (which searches with its own network); only the learner's moves become targets.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from lmselfplay.alphazero.batched_mcts import BatchedMCTS
from lmselfplay.alphazero.mcts import search_policy
from lmselfplay.alphazero.network import NetEvaluator, PolicyValueNet
from lmselfplay.games.base import random_legal_reset


@dataclass(kw_only=True)
class SelfPlaySettings:
    n_sims: int = 32
    c_puct: float = 1.5
    dirichlet_eps: float = 0.25
    dirichlet_alpha: float = 1.0
    temperature_moves: int = 4  # tau = 1 for this many plies of a game, then greedy
    reset_fraction: float = 0.0
    reset_max_plies: int = 4
    tree_reuse: bool = False  # keep the learner's subtree between moves (AlphaZero practice)
    # Value target z = (1 - w) * outcome + w * tanh(margin / scale) for games that report
    # final score margins (Go): a side that loses every game (White's komi against a weak
    # Black) still learns which moves lose by less, instead of a flat -1 that makes every
    # move, pass included, look the same to its search.
    score_weight: float = 0.0
    score_scale: float = 10.0
    fpu_reduction: float | None = None  # first-play urgency (see mcts.puct_scores)
    # Every self-play root (learner and bank) searches only the game's
    # ``selfplay_actions(state)`` (Go: no pass that hands over the game); deeper nodes and
    # evaluation keep every move.
    prune_root: bool = False
    # Probability that a move is replaced by a pass (games with a ``pass_action``; never one
    # that would end the game). The searched target of that position is still recorded. Why:
    # self-play never shows a position where the opponent passed on an unsettled board, so
    # the raw network had never learned what to answer a random player's early pass with
    # (it passed back while behind, and lost).
    pass_injection: float = 0.0


@dataclass
class Samples:
    """Training targets: encoded position, legal mask, search policy pi, outcome z."""

    x: np.ndarray
    legal: np.ndarray
    pi: np.ndarray
    z: np.ndarray

    def __len__(self) -> int:
        return len(self.z)

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ValueError("no samples")
        return Samples(*(np.concatenate([getattr(p, f) for p in parts])
                         for f in ("x", "legal", "pi", "z")))


@dataclass
class SearchedGame:
    """One game of a batched searched self-play wave (:func:`play_searched`)."""

    pos: Any
    learner: tuple[int, ...]  # seats whose moves the learner's evaluator searches (and trains)
    opponent: Any = None  # the evaluator key of the other seat (unused when both are the learner's)
    ply: int = 0
    result: list[float] | None = None
    target: list[float] | None = None  # value target per player (the result, maybe blended)
    injected: int = 0  # passes played by pass_injection


# on_learner_turn(i, g=game, legal=mask, n=root visits, q=root values)
LearnerTurn = Callable[..., None]


def alpha_for(face: Any, game: Any, n_games: int = 20, seed: int = 0) -> float:
    """Dirichlet alpha scaled inversely to the typical number of legal moves (10 / mean):
    AlphaZero used 0.3 for chess (~35 moves) and 0.03 for Go (~250)."""
    rng = random.Random(seed)
    counts = []
    for _ in range(n_games):
        s = game.new_initial_state()
        while not game.is_terminal(s):
            legal = game.legal_actions(s)
            counts.append(len(legal))
            s = game.apply(s, rng.choice(legal))
    return 10.0 / float(np.mean(counts))


def _prune(search: BatchedMCTS, face: Any, trees: Any, positions: list[Any],
           settings: SelfPlaySettings) -> None:
    """Restrict search roots to the game's ``selfplay_actions`` (``prune_root``)."""
    if not settings.prune_root or not positions:
        return
    masks = np.zeros((len(positions), face.n_actions), dtype=bool)
    for k, pos in enumerate(positions):
        masks[k, face.game.selfplay_actions(pos.state)] = True
    search.restrict_roots(list(trees), masks)


def value_targets(game: Any, final: Any, settings: SelfPlaySettings) -> list[float]:
    """Each player's value target at a finished game: the outcome, blended with the squashed
    score margin when ``settings.score_weight`` > 0 (the game must have ``score_margins``)."""
    result = [float(r) for r in game.returns(final)]
    w = settings.score_weight
    if w <= 0:
        return result
    margins = game.score_margins(final)
    return [(1 - w) * r + w * float(np.tanh(m / settings.score_scale))
            for r, m in zip(result, margins)]


def play_searched(face: Any, games: list[SearchedGame], evaluators: dict[Any, Any], learner_key: Any,
                  settings: SelfPlaySettings, rng: random.Random, on_learner_turn: LearnerTurn,
                  progress: Any = None) -> None:
    """Play ``games`` to the end, every move chosen by batched PUCT: the one self-play loop of
    AlphaZero (network evaluators) and of search distillation (LLM evaluators).

    Each wave groups the live games by whose evaluator moves (``learner_key`` for the learner's
    seats, else ``game.opponent``) and searches each group in one :class:`BatchedMCTS`
    (``n_sims`` simulations, Dirichlet root noise, roots restricted by ``prune_root``); the
    move is sampled from the visits at tau = 1 for the first ``temperature_moves`` plies, then
    the most visited one (then maybe replaced by an injected pass). Before the learner's move
    is played, ``on_learner_turn(i, g=game, legal=mask, n=visits, q=values)`` sees its root. A
    finished game gets ``result`` (the returns) and ``target`` (:func:`value_targets`)."""
    n = len(games)
    reused = None  # one tree per game for the learner, advanced along every move played
    if settings.tree_reuse:
        reused = BatchedMCTS(face, evaluators[learner_key], settings.c_puct, settings.dirichlet_eps,
                             settings.dirichlet_alpha, capacity=n * (settings.n_sims + 1),
                             fpu_reduction=settings.fpu_reduction)
        reused.set_roots([g.pos for g in games])
        _prune(reused, face, range(n), [g.pos for g in games], settings)
    while True:
        live = [i for i, g in enumerate(games) if g.result is None]
        if not live:
            break
        groups: dict[Any, list[int]] = {}
        for i in live:
            g = games[i]
            groups.setdefault(learner_key if g.pos.player in g.learner else g.opponent, []).append(i)
        moves: dict[int, int] = {}
        for who, idx in groups.items():
            N, Q = _search_group(face, games, idx, evaluators[who], settings, rng,
                                 reused if who == learner_key else None)
            for row, i in enumerate(idx):
                record = partial(on_learner_turn, i, n=N[row], q=Q[row]) if who == learner_key else None
                action = _play_move(face, games[i], N[row], settings, rng, record)
                if action is not None:
                    moves[i] = action
        if reused is not None and moves:
            reused.advance(list(moves), list(moves.values()))
            _prune(reused, face, list(moves), [games[i].pos for i in moves], settings)
        if progress is not None:
            progress.update(len(live))


def _search_group(face: Any, games: list[SearchedGame], idx: list[int], evaluate: Any,
                  settings: SelfPlaySettings, rng: random.Random,
                  reused: BatchedMCTS | None) -> tuple[np.ndarray, np.ndarray]:
    """Root visits and values for the games ``idx`` (rows in ``idx`` order)."""
    seeds = [rng.randrange(2**31) for _ in idx]
    if reused is not None:
        active = np.zeros(len(games), dtype=bool)
        active[idx] = True
        all_seeds = np.zeros(len(games), dtype=np.int64)
        all_seeds[idx] = seeds
        N, Q = reused.search(settings.n_sims, all_seeds.tolist(), active)
        return N[idx], Q[idx]
    search = BatchedMCTS(face, evaluate, settings.c_puct, settings.dirichlet_eps, settings.dirichlet_alpha,
                         capacity=len(idx) * (settings.n_sims + 1), fpu_reduction=settings.fpu_reduction)
    search.set_roots([games[i].pos for i in idx])
    # Frozen opponents' roots too: a frozen net that passes anywhere would teach the learner
    # to answer any pass with a pass, a few points behind or not.
    _prune(search, face, range(len(idx)), [games[i].pos for i in idx], settings)
    return search.search(settings.n_sims, seeds)


def _play_move(face: Any, g: SearchedGame, n: np.ndarray, settings: SelfPlaySettings,
               rng: random.Random, record: Callable[..., None] | None) -> int | None:
    """Sample and play ``g``'s move from its root visits ``n``; the action when the game goes
    on, None when it ended (``result`` and ``target`` set)."""
    legal = face.legal(g.pos)
    tau = 1.0 if g.ply < settings.temperature_moves else 0.0
    move_p = search_policy(n, tau, legal)
    action = int(rng.choices(range(face.n_actions), weights=move_p.tolist())[0])
    if record is not None:  # the learner's turn, before the move is played
        record(g=g, legal=legal)
    action = _maybe_pass(face, g, action, settings, rng)
    nxt = face.next_state(g.pos, action)
    g.ply += 1
    g.pos = nxt
    if face.terminal_value(nxt) is None:
        return action
    g.result = list(face.game.returns(nxt.state))
    g.target = value_targets(face.game, nxt.state, settings)
    return None


def play_games(face: Any, net: PolicyValueNet, n_games: int, settings: SelfPlaySettings,
               rng: random.Random, opponents: list[PolicyValueNet] | None = None,
               bank_fraction: float = 0.0) -> tuple[Samples, dict[str, float]]:
    """Play ``n_games`` AlphaZero games (a ``bank_fraction`` of them against a random member
    of ``opponents``, on a random seat); return the learner's targets and summary statistics."""
    game = face.game
    opponents = opponents or []
    games = []
    for _ in range(n_games):
        if settings.reset_fraction > 0 and rng.random() < settings.reset_fraction:
            state = random_legal_reset(game, rng, settings.reset_max_plies)
        else:
            state = game.new_initial_state()
        if opponents and rng.random() < bank_fraction:
            side = rng.randrange(2)
            games.append(SearchedGame(face.position(state), (side,), 1 + rng.randrange(len(opponents))))
        else:
            games.append(SearchedGame(face.position(state), (0, 1)))
    evals = {k: NetEvaluator(m, face) for k, m in enumerate([net, *opponents])}
    records: list[list[tuple[Any, np.ndarray, int]]] = [[] for _ in games]

    def record(i: int, g: SearchedGame, legal: np.ndarray, n: np.ndarray, q: np.ndarray) -> None:
        records[i].append((g.pos, search_policy(n, 1.0, legal), g.pos.player))

    play_searched(face, games, evals, 0, settings, rng, record)
    xs, legals, pis, zs = [], [], [], []
    for g, rec in zip(games, records):
        for pos, pi, player in rec:
            xs.append(face.encode(pos))
            legals.append(face.legal(pos))
            pis.append(pi)
            zs.append(g.target[player])  # outcome for the player to move there
    shape = np.shape(face.encode(face.position(game.new_initial_state())))
    samples = Samples(np.array(xs, dtype=np.float32).reshape(len(zs), *shape),
                      np.array(legals, dtype=bool).reshape(len(zs), face.n_actions),
                      np.array(pis, dtype=np.float32).reshape(len(zs), face.n_actions),
                      np.array(zs, dtype=np.float32))
    return samples, _stats(games, len(zs))


def _maybe_pass(face: Any, g: SearchedGame, action: int, settings: SelfPlaySettings, rng: random.Random) -> int:
    """``action``, or with probability ``pass_injection`` the game's pass when it is legal
    and does not end the game (counted in ``g.injected``)."""
    pass_action = getattr(face.game, "pass_action", None)
    if settings.pass_injection <= 0 or pass_action is None or action == pass_action:
        return action
    if rng.random() >= settings.pass_injection or not face.legal(g.pos)[pass_action]:
        return action
    if face.terminal_value(face.next_state(g.pos, pass_action)) is not None:
        return action
    g.injected += 1
    return pass_action


def _stats(games: list[SearchedGame], n_samples: int) -> dict[str, float]:
    plies = [g.ply for g in games]
    first = [g.result[0] for g in games if g.learner == (0, 1)]
    bank = [g.result[g.learner[0]] for g in games if len(g.learner) == 1]
    out = {"selfplay/games": float(len(games)), "selfplay/samples": float(n_samples),
           "selfplay/mean_plies": float(np.mean(plies)),
           "selfplay/injected_passes": float(sum(g.injected for g in games))}
    if first:
        out["selfplay/first_player_return"] = float(np.mean(first))
    if bank:
        out["selfplay/vs_bank_return"] = float(np.mean(bank))
    return out
