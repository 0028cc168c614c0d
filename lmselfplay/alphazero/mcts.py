"""PUCT Monte-Carlo tree search, exactly as specified (the reference for the batched search).

The ``game`` argument only needs the "search face":

* ``n_actions`` — size of the action space;
* ``legal(s)`` — boolean mask of length ``n_actions``;
* ``next_state(s, a)`` — the state after action ``a``;
* ``terminal_value(s)`` — exact value for the player to move at a terminal ``s``, or ``None``
  when ``s`` is not terminal.

:mod:`lmselfplay.alphazero.adapter` gives every project game this face; :class:`NimPosition` and
:class:`MisereNimPosition` below have it natively (a state is the number of stones left).

Rules (tests check them down to the last simulation):

* one tree node per path (no transpositions); the root is expanded before the first
  simulation; an unvisited edge has Q = 0 (or, with ``fpu_reduction`` r, first-play
  urgency as in Leela Zero: the node's mean Q so far minus r, and ``sqrt(max(N(s), 1))`` so
  that the first simulation follows the prior);
* selection: argmax over legal moves of ``Q + c_puct * P * sqrt(N(s)) / (1 + N(s, a))``
  where ``N(s)`` is the sum of the node's edge visits; ties go to the first legal move;
* a terminal state gets its exact value and is never expanded; a new non-terminal leaf is
  expanded with ``prior_fn`` and valued with ``value_fn``; the value is negated once per
  edge on the way up (values are always for the player to move);
* priors are masked to legal moves and renormalised (all-zero -> uniform over legal);
* ``eps > 0`` mixes Dirichlet noise ``rng(seed).dirichlet([alpha] * k)`` into the root
  priors only, placed on the ``k`` legal root moves in order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np


class NimPosition:
    """One-pile Nim in the search face: state = stones left, take 1..max_take; last stone wins."""

    misere = False

    def __init__(self, max_take: int = 3):
        self.max_take = int(max_take)
        self.n_actions = self.max_take  # action a takes a + 1 stones

    def legal(self, s: int) -> np.ndarray:
        return np.arange(self.n_actions) < min(s, self.max_take)

    def next_state(self, s: int, a: int) -> int:
        if not 0 <= a < min(s, self.max_take):
            raise ValueError(f"illegal nim action {a} with {s} stones")
        return s - (a + 1)

    def terminal_value(self, s: int) -> float | None:
        if s > 0:
            return None
        # The previous mover took the last stone: the player to move lost (misere: won).
        return 1.0 if self.misere else -1.0


class MisereNimPosition(NimPosition):
    """One-pile Nim where whoever takes the last stone loses."""

    misere = True


def uniform_prior(s: Any) -> float:
    """Equal weight on every action (masking to legal moves happens in the search)."""
    return 1.0


def zero_value(s: Any) -> float:
    return 0.0


def legal_prior(weights: Any, legal: np.ndarray) -> np.ndarray:
    """Nonnegative weights over all actions -> distribution over the legal ones.

    Works row-wise on ``(..., n_actions)``; a row with no weight on a legal move becomes
    uniform over its legal moves. The batched search calls this same function.
    """
    w = np.broadcast_to(np.asarray(weights, dtype=np.float64), legal.shape)
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"prior weights must be finite and nonnegative, got {w}")
    p = np.where(legal, w, 0.0)
    total = p.sum(axis=-1, keepdims=True)
    empty = total[..., 0] <= 0
    if np.any(empty):
        p[empty] = legal[empty]
        total = p.sum(axis=-1, keepdims=True)
    return p / total


def root_noise(p: np.ndarray, legal: np.ndarray, eps: float, alpha: float, seed: int) -> np.ndarray:
    """(1 - eps) P + eps eta on the legal moves, eta ~ Dirichlet([alpha] * k) from ``seed``."""
    if eps <= 0:
        return p
    k = int(legal.sum())
    eta = np.random.default_rng(seed).dirichlet([alpha] * k)
    out = (1.0 - eps) * p
    out[np.flatnonzero(legal)] += eps * eta
    return out


def puct_scores(n: np.ndarray, w: np.ndarray, p: np.ndarray, legal: np.ndarray,
                c_puct: float, fpu_reduction: float | None = None) -> np.ndarray:
    """Q + U per action (-inf on illegal moves). Shared with the batched search so that both
    compute bit-identical floats, hence identical argmax choices.

    ``fpu_reduction`` None: an unvisited edge has Q = 0. That is neutral only where values
    straddle 0: a side that is behind everywhere (Black against komi in Go) sees every
    visited move below 0, so the search visits a new move each simulation and its visit
    targets stay flat. With a reduction r an unvisited edge is worth the node's mean Q - r.
    """
    total = n.sum(axis=-1, keepdims=True)
    if fpu_reduction is None:
        q = np.divide(w, n, out=np.zeros_like(w), where=n > 0)
        u = c_puct * p * np.sqrt(total) / (1.0 + n)
    else:
        mean = np.divide(w.sum(axis=-1, keepdims=True), total, out=np.zeros_like(total),
                         where=total > 0)
        q = np.where(n > 0, np.divide(w, n, out=np.zeros_like(w), where=n > 0),
                     mean - fpu_reduction)
        u = c_puct * p * np.sqrt(np.maximum(total, 1.0)) / (1.0 + n)
    return np.where(legal, q + u, -np.inf)


def _prior(weights: Any, legal: np.ndarray) -> np.ndarray:
    w = np.broadcast_to(np.asarray(weights, dtype=np.float64), legal.shape)
    return legal_prior(w[None], legal[None])[0]


class _Node:
    __slots__ = ("state", "legal", "prior", "n", "w", "children", "terminal")

    def __init__(self, state: Any, legal: np.ndarray, prior: np.ndarray):
        self.state, self.legal, self.prior = state, legal, prior
        self.n = np.zeros(legal.shape, dtype=np.float64)
        self.w = np.zeros(legal.shape, dtype=np.float64)
        self.children: dict[int, _Node | float] = {}  # child node, or exact terminal value


def mcts(game: Any, root: Any, prior_fn: Callable[[Any], Any], value_fn: Callable[[Any], float],
         n_sims: int, c_puct: float = 1.5, eps: float = 0.0, alpha: float = 0.3,
         seed: int = 0, fpu_reduction: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Run ``n_sims`` simulations from ``root``; return the root's (N, Q) over all actions."""
    if game.terminal_value(root) is not None:
        raise ValueError("mcts needs a non-terminal root")
    legal = np.asarray(game.legal(root), dtype=bool)
    if not legal.any():
        raise ValueError("mcts root has no legal move")
    node = _Node(root, legal, _prior(prior_fn(root), legal))
    node.prior = root_noise(node.prior, legal, eps, alpha, seed)
    top = node
    for _ in range(n_sims):
        node, path = top, []
        while True:
            a = int(np.argmax(puct_scores(node.n[None], node.w[None], node.prior[None],
                                          node.legal[None], c_puct, fpu_reduction)[0]))
            path.append((node, a))
            child = node.children.get(a)
            if child is None:  # a new edge: create its node (or terminal value)
                s = game.next_state(node.state, a)
                tv = game.terminal_value(s)
                if tv is not None:
                    node.children[a] = value = float(tv)
                else:
                    cl = np.asarray(game.legal(s), dtype=bool)
                    node.children[a] = _Node(s, cl, _prior(prior_fn(s), cl))
                    value = float(value_fn(s))
                break
            if isinstance(child, float):  # terminal: exact value, never expanded
                value = child
                break
            node = child
        for parent, a in reversed(path):  # value is for the player to move at the leaf
            value = -value
            parent.n[a] += 1.0
            parent.w[a] += value
    q = np.divide(top.w, top.n, out=np.zeros_like(top.w), where=top.n > 0)
    return top.n.copy(), q


def search_policy(visits: Any, tau: float, legal: Any) -> np.ndarray:
    """Target pi ~ N^(1/tau) over legal moves (exactly 0 on illegal ones), in log space.

    ``tau == 0``: the most-visited legal moves share the mass evenly. No visited legal
    move: uniform over the legal moves.
    """
    n = np.asarray(visits, dtype=np.float64)
    legal = np.asarray(legal, dtype=bool)
    if n.shape != legal.shape:
        raise ValueError(f"visits {n.shape} and legal {legal.shape} differ in shape")
    if not legal.any():
        raise ValueError("search_policy needs at least one legal move")
    if tau < 0 or not math.isfinite(tau):
        raise ValueError(f"temperature must be finite and >= 0, got {tau}")
    if np.any(n < 0) or not np.all(np.isfinite(n)):
        raise ValueError("visit counts must be finite and nonnegative")
    pi = np.zeros_like(n)
    visited = legal & (n > 0)
    if not visited.any():
        pi[legal] = 1.0 / legal.sum()
        return pi
    if tau == 0:
        best = visited & (n == n[visited].max())
        pi[best] = 1.0 / best.sum()
        return pi
    logits = np.full_like(n, -np.inf)
    logits[visited] = np.log(n[visited]) / tau
    logits -= logits[visited].max()
    with np.errstate(under="ignore"):  # a probability below ~1e-308 is exactly 0
        pi[visited] = np.exp(logits[visited])
        return pi / pi.sum()
