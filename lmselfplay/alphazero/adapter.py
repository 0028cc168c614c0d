"""Give any project game (:mod:`lmselfplay.games.base` protocol) the search face of
:mod:`lmselfplay.alphazero.mcts`.

A search state is a :class:`Pos`: the game state plus the player to move. The player is
carried explicitly because at a terminal state the game reports ``TERMINAL``, while the
search needs "the player who would move now" to express the exact result from that
player's side. Games with chance or hidden information are refused: AlphaZero's search is
for deterministic perfect-information games.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from lmselfplay.games.base import CHANCE


class Pos(NamedTuple):
    state: Any
    player: int  # who moves at ``state`` (at a terminal state: who would move next)


class SearchGame:
    """The search face (``n_actions``, ``legal``, ``next_state``, ``terminal_value``) of a Game."""

    def __init__(self, game: Any):
        if not getattr(game, "perfect_information", False):
            raise ValueError(f"{game.name}: AlphaZero search needs a perfect-information game")
        self.game = game
        self.n_actions = int(game.n_actions)
        self.name = game.name

    def position(self, state: Any) -> Pos:
        """Wrap a non-terminal game state (the root of a search)."""
        player = self.game.current_player(state)
        if player == CHANCE:
            raise ValueError(f"{self.name}: chance nodes are not supported by the search")
        if self.game.is_terminal(state):
            raise ValueError(f"{self.name}: a terminal state cannot be a search root")
        return Pos(state, player)

    def legal(self, s: Pos) -> np.ndarray:
        mask = np.zeros(self.n_actions, dtype=bool)
        if not self.game.is_terminal(s.state):
            mask[self.game.legal_actions(s.state)] = True
        return mask

    def next_state(self, s: Pos, a: int) -> Pos:
        child = self.game.apply(s.state, int(a))
        if self.game.is_terminal(child):
            return Pos(child, 1 - s.player)
        player = self.game.current_player(child)
        if player == CHANCE:
            raise ValueError(f"{self.name}: chance nodes are not supported by the search")
        if player != 1 - s.player:
            # Values are negated once per edge, which assumes strictly alternating moves.
            raise ValueError(f"{self.name}: the search assumes alternating players")
        return Pos(child, player)

    def terminal_value(self, s: Pos) -> float | None:
        if not self.game.is_terminal(s.state):
            return None
        return float(self.game.returns(s.state)[s.player])

    def encode(self, s: Pos) -> np.ndarray:
        return np.asarray(self.game.encode(s.state), dtype=np.float32)


class StateTable:
    """Integer ids for search states, with their rules memoised in arrays.

    ``step(ids, actions)`` is vectorised: transitions seen before are one numpy lookup, new
    ones call the face's ``next_state`` once. The batched search keeps ids in its tree, so
    after warm-up a simulation wave is pure numpy. This caches rules, not statistics: the
    tree is still one node per path.
    """

    def __init__(self, face: Any, capacity: int = 1024):
        self.face = face
        self.n_actions = int(face.n_actions)
        self.index: dict[Any, int] = {}
        self.states: list[Any] = []
        self.tv = np.zeros(0)
        self.legal = np.zeros((0, self.n_actions), dtype=bool)
        self.next = np.zeros((0, self.n_actions), dtype=np.int64)
        self.enc: np.ndarray | None = None  # network inputs, filled on first use
        self.has_enc = np.zeros(0, dtype=bool)
        self._grow(capacity)

    def __len__(self) -> int:
        return len(self.states)

    def _grow(self, cap: int) -> None:
        n = len(self.states)
        tv, legal, nxt = self.tv, self.legal, self.next
        self.tv = np.full(cap, np.nan)
        self.legal = np.zeros((cap, self.n_actions), dtype=bool)
        self.next = np.full((cap, self.n_actions), -1, dtype=np.int64)
        self.tv[:n], self.legal[:n], self.next[:n] = tv[:n], legal[:n], nxt[:n]
        has, self.has_enc = self.has_enc, np.zeros(cap, dtype=bool)
        self.has_enc[: len(has)] = has
        if self.enc is not None:
            enc, self.enc = self.enc, np.zeros((cap, *self.enc.shape[1:]), dtype=np.float32)
            self.enc[: len(enc)] = enc

    def encoded(self, sids: np.ndarray) -> np.ndarray:
        """``face.encode`` of each state, computed once per state."""
        if self.enc is None:
            first = np.asarray(self.face.encode(self.states[int(sids[0])]), dtype=np.float32)
            self.enc = np.zeros((len(self.tv), *first.shape), dtype=np.float32)
        for s in np.unique(sids[~self.has_enc[sids]]).tolist():
            self.enc[s] = self.face.encode(self.states[s])
            self.has_enc[s] = True
        return self.enc[sids]

    def add(self, state: Any) -> int:
        """The id of ``state`` (registered, with its terminal value and legal mask)."""
        sid = self.index.get(state)
        if sid is None:
            sid = len(self.states)
            if sid >= len(self.tv):
                self._grow(2 * len(self.tv))
            tv = self.face.terminal_value(state)
            if tv is not None:
                self.tv[sid] = float(tv)
            else:
                self.legal[sid] = np.asarray(self.face.legal(state), dtype=bool)
            self.states.append(state)
            self.index[state] = sid
        return sid

    def step(self, sids: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """Child ids of ``(sids[k], actions[k])`` for every k."""
        out = self.next[sids, actions]
        for k in np.flatnonzero(out < 0):
            s, a = int(sids[k]), int(actions[k])
            c = self.next[s, a]
            if c < 0:  # the same transition may appear twice in one call
                c = self.next[s, a] = self.add(self.face.next_state(self.states[s], a))
            out[k] = c
        return out


class CachedGame:
    """A search face whose rules are memoised in a persistent :class:`StateTable`.

    Search revisits the same positions constantly (tic-tac-toe has 5,478 of them); the
    batched search uses ``table`` directly, and ``mcts`` gets dictionary lookups instead
    of rule code. A table holding ``max_entries`` states is replaced by a fresh one when
    the next search starts (trees already running keep the old table).
    """

    def __init__(self, face: Any, max_entries: int = 1_000_000):
        self.face = face
        self.n_actions = face.n_actions
        self.max_entries = int(max_entries)
        self.table = StateTable(face)

    def __getattr__(self, name: str) -> Any:  # position(), encode(), game, name ...
        return getattr(self.face, name)

    def fresh_table(self) -> StateTable:
        """The table a new search should use (replaced when it has grown too large)."""
        if len(self.table) >= self.max_entries:
            self.table = StateTable(self.face)
        return self.table

    def legal(self, s: Any) -> np.ndarray:
        t = self.table
        sid = t.add(s)
        return t.legal[sid].copy()

    def terminal_value(self, s: Any) -> float | None:
        t = self.table
        v = t.tv[t.add(s)]
        return None if np.isnan(v) else float(v)

    def next_state(self, s: Any, a: int) -> Any:
        t = self.table
        return t.states[int(t.step(np.array([t.add(s)]), np.array([int(a)]))[0])]
