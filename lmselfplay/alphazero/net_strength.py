"""Evaluation that tells real progress apart from noise.

* strength at search budgets (0 = raw policy, then 16/32/64 simulations) against a uniform
  random player and an exact player (minimax; Nim by its formula), as both sides;
* a win-rate matrix between checkpoints (each new one against ALL earlier ones);
* the fraction of positions where the raw policy's argmax is an optimal move;
* exact checks for small games: the raw net against every optimal reply of minimax
  (does it ever lose?) and its exact expected score against a uniform random player.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from lmselfplay.alphazero.batched_mcts import BatchedMCTS
from lmselfplay.alphazero.network import NetEvaluator, PolicyValueNet, raw_policy
from lmselfplay.games.base import all_states, random_legal_reset
from lmselfplay.games.solve import minimax_for, optimal_actions

Agent = Callable[[list[Any]], list[int]]  # search positions -> actions


def net_agent(face: Any, net: PolicyValueNet, n_sims: int = 0, c_puct: float = 1.5,
              fpu_reduction: float | None = None) -> Agent:
    """Greedy play: argmax of the raw policy (n_sims = 0) or of root visits (no noise)."""

    def act(positions: list[Any]) -> list[int]:
        if n_sims <= 0:
            return [int(a) for a in np.argmax(raw_policy(net, face, positions), axis=1)]
        search = BatchedMCTS(face, NetEvaluator(net, face), c_puct,
                             capacity=len(positions) * (n_sims + 1), fpu_reduction=fpu_reduction)
        search.set_roots(positions)
        N, _ = search.search(n_sims)
        return [int(a) for a in np.argmax(N, axis=1)]

    return act


def random_agent(face: Any, seed: int = 0) -> Agent:
    rng = random.Random(seed)
    return lambda positions: [rng.choice(np.flatnonzero(face.legal(p)).tolist())
                              for p in positions]


def exact_agent(face: Any, seed: int = 0) -> Agent:
    """Plays a uniformly chosen optimal move (so its games vary)."""
    rng = random.Random(seed)
    return lambda positions: [rng.choice(optimal_actions(face.game, p.state)) for p in positions]


def play_from_starts(face: Any, agents: tuple[Agent, Agent], starts: list[Any]) -> np.ndarray:
    """Play one game from each start (search positions); agents[k] moves for player k.
    Returns player 0's return per game. All games advance together (batched agents)."""
    pos = list(starts)
    result = np.zeros(len(starts))
    live = list(range(len(starts)))
    while live:
        for player in (0, 1):
            idx = [i for i in live
                   if pos[i].player == player and face.terminal_value(pos[i]) is None]
            if idx:
                for i, a in zip(idx, agents[player]([pos[i] for i in idx])):
                    pos[i] = face.next_state(pos[i], a)
        still = []
        for i in live:
            if face.terminal_value(pos[i]) is None:
                still.append(i)
            else:
                result[i] = face.game.returns(pos[i].state)[0]
        live = still
    return result


def score(returns: np.ndarray) -> float:
    """Win = 1, draw = 0.5, loss = 0."""
    return float(np.mean((np.asarray(returns) + 1.0) / 2.0)) if len(returns) else float("nan")


def match(face: Any, a: Agent, b: Agent, n_games: int, seed: int = 0,
          opening_plies: int = 0) -> dict[str, float]:
    """``a`` against ``b``, half the games as each player; scores for ``a``."""
    rng = random.Random(seed)
    half = max(n_games // 2, 1)
    starts = [face.position(random_legal_reset(face.game, rng, opening_plies)
                            if opening_plies else face.game.new_initial_state())
              for _ in range(half)]
    as_first = play_from_starts(face, (a, b), starts)
    as_second = -play_from_starts(face, (b, a), starts)
    return {"first": score(as_first), "second": score(as_second),
            "all": score(np.concatenate([as_first, as_second])),
            "losses": float(np.sum(as_first < 0) + np.sum(as_second < 0))}


def strength(face: Any, net: PolicyValueNet, budgets: list[int], n_games: int, seed: int = 0,
             c_puct: float = 1.5, exact: bool = True,
             fpu_reduction: float | None = None) -> dict[str, float]:
    """Scores against random and (if ``exact``, for games small enough to solve) exact
    opponents at each search budget."""
    out = {}
    for k in budgets:
        me = net_agent(face, net, k, c_puct, fpu_reduction)
        opponents = [("random", random_agent(face, seed))]
        if exact:
            opponents.append(("exact", exact_agent(face, seed)))
        for name, opp in opponents:
            r = match(face, me, opp, n_games, seed)
            out[f"eval/sims{k}_vs_{name}"] = r["all"]
            out[f"eval/sims{k}_vs_{name}_losses"] = r["losses"]
    return out


def winrate_row(face: Any, net: PolicyValueNet, past: list[PolicyValueNet], n_games: int,
                seed: int = 0, opening_plies: int = 2) -> list[float]:
    """Raw-policy score of ``net`` against each past checkpoint (random openings so that
    deterministic policies still play different games)."""
    me = net_agent(face, net, 0)
    return [match(face, me, net_agent(face, old, 0), n_games, seed, opening_plies)["all"]
            for old in past]


def optimal_argmax_fraction(face: Any, net: PolicyValueNet) -> dict[str, float]:
    """Fraction of non-terminal positions whose raw-policy argmax is an optimal move, over
    all positions and over the winning ones (where only some moves keep the win)."""
    game = face.game
    solver = None if hasattr(game, "optimal_actions") else minimax_for(game)
    states = [s for s in all_states(game) if not game.is_terminal(s)]
    positions = [face.position(s) for s in states]
    best = np.argmax(raw_policy(net, face, positions), axis=1)
    ok, win_ok, wins = 0, 0, 0
    for s, a in zip(states, best):
        good = int(a) in optimal_actions(game, s)
        ok += good
        value = game.value(s) if solver is None else solver.value(s)
        if value > 0:
            wins += 1
            win_ok += good
    return {"eval/raw_optimal_fraction": ok / len(states),
            "eval/raw_optimal_fraction_winning": win_ok / wins if wins else float("nan")}


def raw_vs_minimax(face: Any, net: PolicyValueNet, side: int) -> dict[str, float]:
    """The raw net (argmax) as ``side`` against EVERY optimal reply of minimax: the number of
    lines it loses, draws and wins (so "never loses" is exact, not sampled)."""
    game = face.game
    act = net_agent(face, net, 0)
    counts = {"lost": 0, "drawn": 0, "won": 0}

    def walk(pos: Any) -> None:
        if face.terminal_value(pos) is not None:
            r = game.returns(pos.state)[side]
            counts["lost" if r < 0 else "won" if r > 0 else "drawn"] += 1
            return
        moves = act([pos]) if pos.player == side else optimal_actions(game, pos.state)
        for a in moves:
            walk(face.next_state(pos, a))

    walk(face.position(game.new_initial_state()))
    return {k: float(v) for k, v in counts.items()}


def raw_vs_random_exact(face: Any, net: PolicyValueNet, side: int) -> float:
    """Exact expected score (win 1, draw 0.5) of the raw net as ``side`` against a uniformly
    random player: the random player's moves are enumerated with their probabilities."""
    game = face.game
    act = net_agent(face, net, 0)

    @cache
    def value(pos: Any) -> float:
        if face.terminal_value(pos) is not None:
            return (game.returns(pos.state)[side] + 1.0) / 2.0
        if pos.player == side:
            return value(face.next_state(pos, act([pos])[0]))
        moves = np.flatnonzero(face.legal(pos)).tolist()
        return sum(value(face.next_state(pos, a)) for a in moves) / len(moves)

    return value(face.position(game.new_initial_state()))


def best_vs_random_exact(game: Any, side: int) -> float:
    """The ceiling for :func:`raw_vs_random_exact`: expectimax score of the best possible
    player as ``side`` against a uniformly random one (tic-tac-toe: X 0.9974, O 0.9624)."""

    @cache
    def value(s: Any) -> float:
        if game.is_terminal(s):
            return (game.returns(s)[side] + 1.0) / 2.0
        vals = [value(game.apply(s, a)) for a in game.legal_actions(s)]
        return max(vals) if game.current_player(s) == side else sum(vals) / len(vals)

    return value(game.new_initial_state())
