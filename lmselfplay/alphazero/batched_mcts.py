"""Many PUCT searches at once: one network batch per simulation wave.

Each wave runs exactly one simulation in every tree, so every tree follows the rules of
:func:`lmselfplay.alphazero.mcts.mcts` to the letter (a batch of one gives identical N and
Q, and so does any batch: trees never interact). All trees live in flat arrays
(``N``, ``W``, ``P``, ``legal``, ``child`` indexed by node), so selection at each depth is a
handful of numpy operations over all trees together; the only per-tree Python work is
stepping the game rules at the new leaf.

``evaluate(states) -> (prior_weights[L, n_actions], values[L])`` is called once per wave
with every new non-terminal leaf (and once for the roots). Values are for the player to
move at each state. An evaluator may also offer ``evaluate_ids(table, ids)``, which gets
the :class:`~lmselfplay.alphazero.adapter.StateTable` ids instead (and its cached
encodings), as :class:`~lmselfplay.alphazero.network.NetEvaluator` does.

Tree reuse: after :meth:`BatchedMCTS.search`, :meth:`BatchedMCTS.advance` moves a root to
the chosen child, keeping its subtree for the next search (AlphaZero's practice).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lmselfplay.alphazero.adapter import StateTable
from lmselfplay.alphazero.mcts import legal_prior, puct_scores, root_noise

Evaluate = Callable[[list[Any]], tuple[np.ndarray, np.ndarray]]

NO_CHILD = -1
TERMINAL_CHILD = -2


class BatchedMCTS:
    """Search trees for a batch of roots in the search face of ``game``."""

    def __init__(self, game: Any, evaluate: Evaluate, c_puct: float = 1.5, eps: float = 0.0,
                 alpha: float = 0.3, capacity: int = 1024, fpu_reduction: float | None = None):
        self.game, self.evaluate = game, evaluate
        self.c_puct, self.eps, self.alpha = float(c_puct), float(eps), float(alpha)
        self.fpu_reduction = fpu_reduction  # see puct_scores
        self.A = int(game.n_actions)
        self._alloc(max(int(capacity), 1))
        self.size = 0
        self.table = self._table()
        self.roots = np.zeros(0, dtype=np.int64)
        self.root_prior = np.zeros((0, self.A))

    def _table(self) -> StateTable:
        # A CachedGame shares its table across searches; any other face gets a private one.
        fresh = getattr(self.game, "fresh_table", None)
        return fresh() if fresh is not None else StateTable(self.game)

    # --- storage ----------------------------------------------------------------------
    def _alloc(self, cap: int) -> None:
        A = self.A
        self.N = np.zeros((cap, A))
        self.W = np.zeros((cap, A))
        self.P = np.zeros((cap, A))
        self.legal = np.zeros((cap, A), dtype=bool)
        self.child = np.full((cap, A), NO_CHILD, dtype=np.int64)
        self.tval = np.zeros((cap, A))
        self.sid = np.zeros(cap, dtype=np.int64)  # state id (in ``self.table``) per node

    def _reserve(self, extra: int) -> None:
        cap = self.N.shape[0]
        if self.size + extra <= cap:
            return
        names = ("N", "W", "P", "legal", "child", "tval", "sid")
        old = [getattr(self, k) for k in names]
        self._alloc(max(2 * cap, self.size + extra))
        for k, arr in zip(names, old):
            getattr(self, k)[: self.size] = arr[: self.size]

    def _new_nodes(self, sids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Expand non-terminal states ``sids`` with one evaluate call; return (ids, values)."""
        by_ids = getattr(self.evaluate, "evaluate_ids", None)  # skips re-encoding states
        if by_ids is not None:
            weights, values = by_ids(self.table, sids)
        else:
            weights, values = self.evaluate([self.table.states[i] for i in sids.tolist()])
        n = len(sids)
        weights = np.asarray(weights, dtype=np.float64).reshape(n, self.A)
        values = np.asarray(values, dtype=np.float64).reshape(n)
        self._reserve(n)
        ids = np.arange(self.size, self.size + n)
        self.size += n
        legal = self.table.legal[sids]
        self.P[ids] = legal_prior(weights, legal)
        self.legal[ids] = legal
        self.sid[ids] = sids
        return ids, values

    # --- public API -------------------------------------------------------------------
    def set_roots(self, roots: Sequence[Any]) -> None:
        """Start fresh trees at ``roots`` (non-terminal search states)."""
        self.size = 0
        self.table = self._table()
        sids = np.array([self.table.add(r) for r in roots], dtype=np.int64)
        if len(sids) and (not np.all(np.isnan(self.table.tv[sids]))
                          or not self.table.legal[sids].any(axis=1).all()):
            raise ValueError("every search root must be non-terminal with a legal move")
        self.roots = self._new_nodes(sids)[0] if len(sids) else np.zeros(0, dtype=np.int64)

    def restrict_roots(self, trees: Sequence[int], masks: np.ndarray) -> None:
        """Search only the moves in ``masks[k]`` at the root of ``trees[k]`` (the prior is
        renormalised over them); call before :meth:`search`. Deeper nodes keep every move."""
        r = self.roots[np.asarray(trees, dtype=np.int64)]
        keep = self.legal[r] & np.asarray(masks, dtype=bool)
        if not keep.any(axis=1).all():
            raise ValueError("a root restriction must leave a legal move")
        self.legal[r] = keep
        self.P[r] = legal_prior(self.P[r], keep)

    def advance(self, trees: Sequence[int] | int, actions: Sequence[int] | int) -> None:
        """Move each tree's root along its action, keeping the subtree (tree reuse).

        Children never expanded are created with one evaluate call for all of them. A move
        that ends the game cannot be advanced into: drop that tree instead.
        """
        trees = np.atleast_1d(np.asarray(trees, dtype=np.int64))
        actions = np.atleast_1d(np.asarray(actions, dtype=np.int64))
        r = self.roots[trees]
        c = self.child[r, actions]
        self.roots[trees[c >= 0]] = c[c >= 0]
        new = c < 0
        if new.any():
            sids = self.table.step(self.sid[r[new]], actions[new])
            if not np.all(np.isnan(self.table.tv[sids])):
                raise ValueError("advance reached a terminal state; drop that tree instead")
            self.roots[trees[new]] = self._new_nodes(sids)[0]

    def search(self, n_sims: int, seeds: Sequence[int] | None = None,
               active: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Run ``n_sims`` simulations in every (active) tree; return root N and Q [B, A]."""
        B = len(self.roots)
        active = np.ones(B, dtype=bool) if active is None else np.asarray(active, dtype=bool)
        seeds = list(range(B)) if seeds is None else list(seeds)
        self.root_prior = self.P[self.roots].copy()
        if self.eps > 0:
            for i in np.flatnonzero(active):
                r = self.roots[i]
                self.root_prior[i] = root_noise(self.P[r].copy(), self.legal[r], self.eps,
                                                self.alpha, seeds[i])
        trees = np.flatnonzero(active)
        for _ in range(int(n_sims)):
            if len(trees):
                self._wave(trees)
        N = self.N[self.roots].copy()
        W = self.W[self.roots]
        Q = np.divide(W, N, out=np.zeros_like(W), where=N > 0)
        return N, Q

    # --- one simulation in every tree ----------------------------------------------------
    def _wave(self, trees: np.ndarray) -> None:
        cur = self.roots[trees].copy()
        rows = np.arange(len(trees))  # trees still descending (indices into ``trees``)
        path = []
        value = np.zeros(len(trees))
        leaves = []  # (rows, child state ids, parent nodes, actions) of new non-terminal leaves
        depth = 0
        while len(rows):
            nodes = cur[rows]
            prior = self.root_prior[trees[rows]] if depth == 0 else self.P[nodes]
            scores = puct_scores(self.N[nodes], self.W[nodes], prior, self.legal[nodes],
                                 self.c_puct, self.fpu_reduction)
            acts = np.argmax(scores, axis=1)
            path.append((nodes, acts, rows))
            ch = self.child[nodes, acts]
            term = ch == TERMINAL_CHILD
            value[rows[term]] = self.tval[nodes[term], acts[term]]
            new = ch == NO_CHILD
            if new.any():  # new edges: step the rules (memoised in the state table)
                nn, na, nr = nodes[new], acts[new], rows[new]
                cs = self.table.step(self.sid[nn], na)
                tv = self.table.tv[cs]
                t = ~np.isnan(tv)
                self.child[nn[t], na[t]] = TERMINAL_CHILD
                self.tval[nn[t], na[t]] = tv[t]
                value[nr[t]] = tv[t]
                leaves.append((nr[~t], cs[~t], nn[~t], na[~t]))
            go = ch >= 0
            cur[rows[go]] = ch[go]
            rows = rows[go]
            depth += 1
        if leaves:
            lr, ls, lp, la = (np.concatenate(x) for x in zip(*leaves))
            if len(lr):
                ids, v = self._new_nodes(ls)
                self.child[lp, la] = ids
                value[lr] = v
        # Backup: deepest edges first, negating once per edge (values are for the mover).
        for nodes, acts, rows in reversed(path):
            value[rows] = -value[rows]
            self.N[nodes, acts] += 1.0
            self.W[nodes, acts] += value[rows]


def batched_mcts(game: Any, roots: Sequence[Any], evaluate: Evaluate, n_sims: int,
                 c_puct: float = 1.5, eps: float = 0.0, alpha: float = 0.3,
                 seeds: Sequence[int] | None = None,
                 fpu_reduction: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Search every root with fresh trees; root (N, Q) as [len(roots), n_actions] arrays.

    ``seeds[i]`` seeds tree ``i``'s root noise exactly as ``mcts(..., seed=seeds[i])``.
    """
    search = BatchedMCTS(game, evaluate, c_puct, eps, alpha,
                         capacity=len(roots) * (int(n_sims) + 1), fpu_reduction=fpu_reduction)
    search.set_roots(roots)
    return search.search(n_sims, seeds)


def from_fns(prior_fn: Callable[[Any], Any], value_fn: Callable[[Any], float],
             n_actions: int) -> Evaluate:
    """An ``evaluate`` built from the per-state functions that ``mcts`` takes."""

    def evaluate(states: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        w = np.array([np.broadcast_to(np.asarray(prior_fn(s), dtype=np.float64), (n_actions,))
                      for s in states]).reshape(len(states), n_actions)
        return w, np.array([float(value_fn(s)) for s in states])

    return evaluate
