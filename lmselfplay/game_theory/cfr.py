"""Counterfactual regret minimization (CFR, CFR+) for two-player games with chance and
hidden information, over the project's Game protocol (``information_state``).

Same algorithm, step for step, as OpenSpiel's ``open_spiel.python.algorithms.cfr``
(``CFRSolver``: alternating updates, regret matching, uniform averaging;
``CFRPlusSolver``: alternating updates, regret matching+, linear averaging), so that the
average policies agree with OpenSpiel's to rounding error — but without walking the tree
in Python on every iteration.

Why it is fast: the game tree is enumerated ONCE into arrays. For player i, the
counterfactual value of action a at information set I is a sum over the terminal
histories z below (I, a):

    cfv_i(I, a) = sum_z  pi_{-i}(z) * pi_i(ha -> z) * u_i(z)

where pi_{-i}(z) is the reach of the opponent and chance, and pi_i(ha -> z) the product
of player i's own action probabilities after a. Both are products of entries of the
current policy, so each (terminal, own decision on its path) pair stores the indices of
the policy entries it multiplies, plus the constant chance(z) * u_i(z). One iteration is
then a gather, a product along rows and a ``bincount`` per player — about fifteen numpy
calls per player, plus one vector multiply per level of depth, whatever the tree size. Regrets follow as
``cfv(I, a) - sum_b sigma(I, b) cfv(I, b)`` (= OpenSpiel's per-history sum of
``pi_{-i}(h) (v(ha) - v(h))``), and the average policy accumulates ``pi_i(I) sigma(I)``.

NashConv / exploitability come from :mod:`lmselfplay.games.exploitability` (one
implementation for the whole project).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lmselfplay.games.base import CHANCE, Game
from lmselfplay.games.exploitability import exploitability, nash_conv


@dataclass
class _PlayerArrays:
    """Precomputed index arrays for the updates of one player.

    The player's information sets are rows ``lo:hi``; its policy entries are the flat
    slice ``lo*A:hi*A`` ("entries"). Index matrices are stored transposed, (D, P), so
    the product along a path is D-1 vector multiplies instead of a slower axis reduction.
    """

    lo: int
    hi: int
    pair_idx: np.ndarray  # (D, P) policy-buffer indices per pair; the pad points to 1.0
    pair_coef: np.ndarray  # (P,) chance(z) * u_i(z)
    pair_entry: np.ndarray  # (P,) entry (row - lo) * A + a of the own decision on the path
    seq_idx: np.ndarray  # (D', n_rows * A) own entries on the path to each entry, inclusive
    block: slice  # the player's entries in the flat policy
    entry_row: np.ndarray  # (n_rows * A,) row of each entry
    legal: np.ndarray  # (n_rows * A,) float 0/1
    uniform: np.ndarray  # (n_rows * A,) uniform over the legal actions
    all_legal: bool


def _path_products(buf: np.ndarray, idx: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """``scale * prod_d buf[idx[d]]``, one vector multiply per row of ``idx``."""
    x = buf[idx]
    out = x[0] * scale
    for row in x[1:]:
        out *= row
    return out


class CFRSolver:
    """CFR (Zinkevich et al. 2007) with OpenSpiel's defaults: alternating updates.

    ``average_policy()`` converges to a Nash equilibrium in two-player zero-sum games.
    Policies are dicts ``information_state -> np.ndarray`` of length ``game.n_actions``
    (zero on illegal actions), the format :mod:`lmselfplay.games.exploitability` reads.
    """

    def __init__(self, game: Game, *, regret_matching_plus: bool = False,
                 linear_averaging: bool = False, alternating_updates: bool = True):
        if not hasattr(game, "information_state"):
            raise TypeError(f"CFR needs a game with information_state(); {game!r} has none")
        self.game = game
        self.regret_matching_plus = regret_matching_plus
        self.linear_averaging = linear_averaging
        self.alternating_updates = alternating_updates
        self.iteration = 0
        self._build_tree()

    # --- precomputation -------------------------------------------------------------
    def _build_tree(self) -> None:
        g = self.game
        A = g.n_actions
        keys: list[dict[str, list[int]]] = [{}, {}]  # per player: infostate -> legal actions
        own_paths: list[dict[str, list[tuple[str, int]]]] = [{}, {}]
        terminals: list[tuple[float, list[float], list[tuple[int, str, int]]]] = []

        # iterative DFS; edges are (player, infostate, action)
        stack: list[tuple[Any, float, list[tuple[int, str, int]]]] = \
            [(g.new_initial_state(), 1.0, [])]
        while stack:
            state, chance, path = stack.pop()
            if g.is_terminal(state):
                terminals.append((chance, [float(r) for r in g.returns(state)], path))
                continue
            p = g.current_player(state)
            if p == CHANCE:
                for a, prob in g.chance_outcomes(state):
                    if prob > 0:
                        stack.append((g.apply(state, a), chance * prob, path))
                continue
            if p not in (0, 1):
                raise ValueError(f"CFR here is for two players; got player {p}")
            key = g.information_state(state, p)
            legal = list(g.legal_actions(state))
            if not legal or min(legal) < 0 or max(legal) >= A:
                raise ValueError(f"legal actions {legal} at {key!r} not in range({A})")
            if key not in keys[p]:
                keys[p][key] = legal
                own_paths[p][key] = [(k, a) for q, k, a in path if q == p]
            elif keys[p][key] != legal:
                raise ValueError(f"information set {key!r} has different legal actions")
            for a in reversed(legal):
                stack.append((g.apply(state, a), chance, path + [(p, key, a)]))

        self.infostates: list[str] = list(keys[0]) + list(keys[1])
        self._row = {k: i for i, k in enumerate(self.infostates)}
        n = len(self.infostates)
        S = n * A
        # The current policy lives in a buffer whose last entry is a constant 1.0 (the
        # pad of every index matrix), so gathers read it with no copy.
        self._buf = np.ones(S + 1)
        self._sigma = self._buf[:S]
        self._regret = np.zeros(S)
        self._cum_policy = np.zeros(S)

        def entry(key: str, a: int) -> int:
            return self._row[key] * A + a

        self._players = []
        for i in (0, 1):
            lo = 0 if i == 0 else len(keys[0])
            hi = lo + len(keys[i])
            idx_rows, coef, entries = [], [], []
            for chance, rets, path in terminals:
                opp = [entry(k, a) for q, k, a in path if q != i]
                own = [(k, a) for q, k, a in path if q == i]
                for j, (k, a) in enumerate(own):
                    idx_rows.append(opp + [entry(kk, aa) for kk, aa in own[j + 1:]])
                    coef.append(chance * rets[i])
                    entries.append(entry(k, a) - lo * A)
            legal = np.zeros((hi - lo, A))
            for key, acts in keys[i].items():
                legal[self._row[key] - lo, acts] = 1.0
            uniform = (legal / legal.sum(1, keepdims=True)).ravel()
            self._sigma[lo * A:hi * A] = uniform
            self._players.append(_PlayerArrays(
                lo=lo, hi=hi, pair_idx=self._pad_rows(idx_rows, S),
                pair_coef=np.array(coef), pair_entry=np.array(entries, dtype=np.intp),
                seq_idx=self._pad_rows([[entry(k, b) for k, b in own_paths[i][key]]
                                        + [entry(key, a)]
                                        for key in keys[i] for a in range(A)], S),
                block=slice(lo * A, hi * A),
                entry_row=np.repeat(np.arange(hi - lo), A), legal=legal.ravel(),
                uniform=uniform, all_legal=bool(legal.all())))

    @staticmethod
    def _pad_rows(rows: list[list[int]], pad: int) -> np.ndarray:
        """Ragged index lists -> (max_len, n_rows) matrix padded with ``pad``."""
        width = max(1, max((len(r) for r in rows), default=0))
        out = np.full((width, len(rows)), pad, dtype=np.intp)
        for r, row in enumerate(rows):
            out[:len(row), r] = row
        return out

    # --- one iteration --------------------------------------------------------------
    def evaluate_and_update_policy(self) -> None:
        """One CFR iteration (OpenSpiel's name for it)."""
        self.iteration += 1
        if self.alternating_updates:
            for P in self._players:
                self._accumulate(P)
                self._regret_match(P)
        else:
            for P in self._players:
                self._accumulate(P)
            for P in self._players:
                self._regret_match(P)

    def run(self, iterations: int, progress: bool = False) -> CFRSolver:
        steps = range(iterations)
        if progress:
            from tqdm.auto import tqdm

            steps = tqdm(steps, desc="CFR+" if self.regret_matching_plus else "CFR")
        for _ in steps:
            self.evaluate_and_update_policy()
        return self

    def _accumulate(self, P: _PlayerArrays) -> None:
        """Add this iteration's counterfactual regrets and reach-weighted policy."""
        n_rows = P.hi - P.lo
        sigma = self._sigma[P.block]
        w = _path_products(self._buf, P.pair_idx, P.pair_coef)
        cfv = np.bincount(P.pair_entry, w, minlength=len(sigma))
        ev = np.bincount(P.entry_row, sigma * cfv, minlength=n_rows)  # value of each infoset
        inst = cfv - ev[P.entry_row]
        if not P.all_legal:
            inst *= P.legal
        regret = self._regret[P.block]
        regret += inst
        if self.regret_matching_plus:
            np.maximum(regret, 0.0, out=regret)
        # pi_i(I) * sigma(I, a): player i's realization weight of the sequence (I, a)
        weight = float(self.iteration) if self.linear_averaging else 1.0
        self._cum_policy[P.block] += _path_products(self._buf, P.seq_idx, weight)

    def _regret_match(self, P: _PlayerArrays) -> None:
        regret = self._regret[P.block]
        pos = regret if self.regret_matching_plus else np.maximum(regret, 0.0)
        total = np.bincount(P.entry_row, pos, minlength=P.hi - P.lo)[P.entry_row]
        sigma = self._sigma[P.block]
        sigma[:] = P.uniform
        np.divide(pos, total, out=sigma, where=total > 0)

    # --- policies ---------------------------------------------------------------------
    def _as_dict(self, table: np.ndarray) -> dict[str, np.ndarray]:
        return {k: table[i].copy() for i, k in enumerate(self.infostates)}

    def current_policy(self) -> dict[str, np.ndarray]:
        return self._as_dict(self._sigma.reshape(-1, self.game.n_actions))

    def average_policy_array(self) -> np.ndarray:
        """(n_infostates, n_actions), rows in the order of ``self.infostates``; uniform
        over the legal actions where nothing was accumulated."""
        cum = self._cum_policy.reshape(-1, self.game.n_actions)
        total = cum.sum(1, keepdims=True)
        out = np.concatenate([P.uniform for P in self._players]).reshape(cum.shape)
        np.divide(cum, total, out=out, where=total > 0)
        return out

    def average_policy(self) -> dict[str, np.ndarray]:
        return self._as_dict(self.average_policy_array())

    def nash_conv(self) -> float:
        return nash_conv(self.game, self.average_policy())

    def exploitability(self) -> float:
        return exploitability(self.game, self.average_policy())


class CFRPlusSolver(CFRSolver):
    """CFR+ (Tammelin 2014): regret matching+, alternating updates, linear averaging."""

    def __init__(self, game: Game):
        super().__init__(game, regret_matching_plus=True, linear_averaging=True,
                         alternating_updates=True)
