"""Go on an N x N board (5..19, default 9): exact rules, text face, AlphaZero planes.

Rules (the ones this module implements, checked against OpenSpiel and GnuGo in the tests):

* Black (player 0, ``X``) moves first; White (player 1, ``O``) receives ``komi`` (7.5).
* A move places a stone on an empty point or passes. After the placement, opposing
  groups (4-connected stones of one colour) without liberties are removed; then the
  mover's own group must have a liberty, otherwise the move is **suicide** and illegal.
  A placement that captures is never suicide.
* **Positional superko**: a placement may not recreate any board position (stones only,
  whoever is to move) that occurred before in the game. Passing is always legal.
* The game ends after two consecutive passes or after ``max_plies`` plies (default
  ``2 * N * N``, OpenSpiel's cap).
* **Area scoring** (Chinese / Tromp-Taylor): a player's points are their stones plus the
  empty regions that touch only their colour; stones are counted as they stand (no dead
  stone removal: play continues until the players pass). White adds komi. The winner gets
  +1, the loser -1; with half-point komi there are no draws (integral komi can draw: 0).

Actions follow OpenSpiel: point (row, col) is ``row * N + col`` with row 0 the first line
("A1" = 0) and pass is ``N * N``.

Bookkeeping is incremental: every state keeps its groups (stones, liberties, Zobrist key)
and the group id of each point, so a move touches only the groups next to it. States are
immutable (``apply`` returns a new one); equality and hashing cover the board, the side to
move, the pass count, the ply, the set of earlier positions (it decides superko) and the
recent boards (the network input).
"""

from __future__ import annotations

import random
import re
from operator import itemgetter

import numpy as np

from lmselfplay.games.base import TERMINAL, Invalid
from lmselfplay.games.text import extract_move, prompt

COLUMNS = "ABCDEFGHJKLMNOPQRST"  # Go labels skip I
STONE_CHARS = ".XO"
HISTORY_PLANES = 4  # boards fed to the network: the current one and the 3 before it
_COORD = re.compile(r"^([a-hj-t])([0-9]{1,2})$")


_FIELDS = ("board", "to_play", "passes", "ply", "history", "zhash", "chain", "groups", "last",
           "captures", "recent", "path")


class GoState(tuple):
    """One position (an immutable tuple with named fields; tuple construction keeps a move
    cheap). ``board[p]`` is 0 empty, 1 black, 2 white. ``chain[p]`` is the id (a stone's
    point) of the group at p, -1 when empty; ``groups[id]`` is (stones, liberties, Zobrist
    key of the stones). ``chain`` and ``groups`` are never mutated after construction.

    Fields: board (bytes), to_play (0 black, 1 white), passes (consecutive passes just
    played), ply, history (Zobrist keys of every board so far, this one included), zhash,
    chain, groups, last (last action, -1 before the first), captures (stones captured by
    black, by white), recent (earlier boards, newest first, for the network input), path
    (how the game got here, for engines that replay it: ``(parent path, action)`` after a
    move, the start board at the root; see :meth:`Go.move_history`)."""

    __slots__ = ()

    def __new__(cls, board: bytes, to_play: int, passes: int, ply: int, history: frozenset,
                zhash: int, chain: list, groups: dict, last: int = -1,
                captures: tuple = (0, 0), recent: tuple = (), path: object = None) -> GoState:
        return tuple.__new__(cls, (board, to_play, passes, ply, history, zhash, chain, groups,
                                   last, captures, recent, board if path is None else path))

    def __getnewargs__(self) -> tuple:  # pickling calls __new__ with the fields
        return tuple(self)

    def _key(self) -> tuple:
        return (self[5], self[0], self[1], self[2], self[3], self[4], self[10])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GoState) and self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((self[5], self[1], self[2], self[3], self[4]))

    def __repr__(self) -> str:
        return f"GoState(ply={self[3]}, to_play={self[1]}, zhash={self[5]:#x})"


for _i, _name in enumerate(_FIELDS):
    setattr(GoState, _name, property(itemgetter(_i)))
_new_state = tuple.__new__


class Go:
    """N x N Go with positional superko and area scoring (see the module docstring)."""

    perfect_information = True
    max_utility = 1.0
    exact_metric = "win_rates"

    def __init__(self, size: int = 9, komi: float = 7.5, max_plies: int | None = None,
                 area_planes: bool = False):
        if not 5 <= int(size) <= 19:
            raise ValueError(f"go board size must be 5..19, got {size}")
        self.size = n = int(size)
        self.komi = float(komi)
        self.name = "go9" if n == 9 else f"go{n}"
        self.title = f"Go {n}x{n}"  # the name in words (figures, tables)
        self.n_points = n * n
        self.pass_action = n * n
        self.n_actions = n * n + 1
        self.max_plies = 2 * n * n if max_plies is None else int(max_plies)
        self.area_planes = bool(area_planes)
        self.nbrs = [tuple(r2 * n + c2 for r2, c2 in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1))
                           if 0 <= r2 < n and 0 <= c2 < n)
                     for r in range(n) for c in range(n)]
        self.diags = [tuple(r2 * n + c2 for r2, c2 in ((r - 1, c - 1), (r - 1, c + 1), (r + 1, c - 1), (r + 1, c + 1))
                            if 0 <= r2 < n and 0 <= c2 < n)
                      for r in range(n) for c in range(n)]
        rng = random.Random(0x60)  # fixed keys: hashes are reproducible across runs
        self.zobrist = [[0] * self.n_points] + [[rng.getrandbits(64) for _ in range(self.n_points)]
                                                 for _ in range(2)]
        self.names = [self._point_name(p) for p in range(self.n_points)] + ["pass"]
        self.by_name = {name.casefold(): a for a, name in enumerate(self.names)}
        self._perms = _symmetry_perms(n)

    # ---- protocol ------------------------------------------------------------------

    def new_initial_state(self, seed: int | None = None) -> GoState:
        return GoState(bytes(self.n_points), 0, 0, 0, frozenset([0]), 0, [-1] * self.n_points, {})

    def is_terminal(self, s: GoState) -> bool:
        return s[2] >= 2 or s[3] >= self.max_plies  # passes, ply

    def current_player(self, s: GoState) -> int:
        return TERMINAL if self.is_terminal(s) else s.to_play

    def chance_outcomes(self, s: GoState) -> list[tuple[int, float]]:
        return []

    def legal_actions(self, s: GoState) -> list[int]:
        """Every legal placement (ascending) and pass; empty at the end of the game."""
        if self.is_terminal(s):
            return []
        board, to_play, _, _, hist, h, chain, groups = s[:8]
        nbrs = self.nbrs
        c = to_play + 1
        zc = self.zobrist[c]
        # Enemy groups in atari: playing on their liberty captures them (never suicide).
        capture_at: dict[int, int] = {}
        for g, (_, lib, gz) in groups.items():
            if len(lib) == 1 and board[g] != c:
                for q in lib:
                    capture_at[q] = capture_at.get(q, 0) ^ gz
        out = []
        for q in range(self.n_points):
            if board[q]:
                continue
            gz = capture_at.get(q)
            if gz is not None:
                if h ^ zc[q] ^ gz not in hist:
                    out.append(q)
                continue
            if h ^ zc[q] in hist:
                continue
            for n in nbrs[q]:  # not suicide: an empty neighbour or a friend with 2+ liberties
                v = board[n]
                if v == 0 or (v == c and len(groups[chain[n]][1]) > 1):
                    out.append(q)
                    break
        out.append(self.pass_action)
        return out

    def illegal_reason(self, s: GoState, a: int) -> str | None:
        """Why action ``a`` is illegal in ``s`` (None when it is legal)."""
        if self.is_terminal(s):
            return "the game is over"
        if not 0 <= a <= self.pass_action:
            return f"action {a} is off the board"
        if a == self.pass_action:
            return None
        board, to_play, _, _, history, zhash, chain, groups = s[:8]
        if board[a]:
            return f"{self.names[a]} is occupied"
        c = to_play + 1
        key, alive, seen = zhash ^ self.zobrist[c][a], False, []
        for n in self.nbrs[a]:
            v = board[n]
            if v == 0:
                alive = True
                continue
            g = chain[n]
            lib = groups[g][1]
            if v == c:
                if len(lib) > 1:
                    alive = True
            elif len(lib) == 1 and g not in seen:  # its last liberty is a: captured
                seen.append(g)
                key ^= groups[g][2]
                alive = True
        if not alive:
            return f"{self.names[a]} is suicide"
        if key in history:
            return f"{self.names[a]} repeats an earlier position (superko)"
        return None

    def apply(self, s: GoState, a: int) -> GoState:
        board, to_play, passes, ply, history, zhash, chain, groups, _, caps, recent, path = s
        if passes >= 2 or ply >= self.max_plies or not 0 <= a <= self.pass_action or (
                a < self.pass_action and board[a]):
            raise ValueError(f"illegal go action {a}: {self.illegal_reason(s, a)}")
        recent = (board, *recent)[: HISTORY_PLANES - 1]
        if a == self.pass_action:
            return _new_state(GoState, (board, 1 - to_play, passes + 1, ply + 1, history, zhash,
                                        chain, groups, a, caps, recent, (path, a)))
        return self._place(s, a, recent)

    def _place(self, s: GoState, p: int, recent: tuple) -> GoState:
        """Put the mover's stone on the empty point p: captures, merges, new Zobrist key.
        Raises on suicide and superko (the caller's state is untouched)."""
        board, to_play, _, ply, history, h, chain, groups, _, caps, _, path = s
        c = to_play + 1
        board, chain, groups = bytearray(board), chain[:], groups.copy()
        nbrs = self.nbrs
        board[p] = c
        zc = self.zobrist[c]
        h ^= zc[p]
        captured: tuple = ()
        friends: list[int] = []
        for n in nbrs[p]:
            v = board[n]
            if v == c:
                g = chain[n]
                if g not in friends:
                    friends.append(g)
            elif v:
                e = groups.get(chain[n])
                if e is None or p not in e[1]:  # captured, or already updated, via another side
                    continue
                st, lib, gz = e
                if len(lib) == 1:  # p was its last liberty
                    del groups[chain[n]]
                    h ^= gz
                    captured += st
                else:
                    groups[chain[n]] = (st, lib.difference((p,)), gz)
        gained: dict[int, set] = {}  # friendly groups' new liberties from captured stones
        if captured:
            for q in captured:
                board[q] = 0
                chain[q] = -1
            for q in captured:
                for n in nbrs[q]:
                    if board[n] == c and n != p:
                        gained.setdefault(chain[n], set()).add(q)
        empties = [n for n in nbrs[p] if not board[n]]
        if not friends:
            head, stones, libs, gz = p, (p,), frozenset(empties), zc[p]
        else:
            head = friends[0]
            for g in friends[1:]:  # merge into the largest group: fewest relabels
                if len(groups[g][0]) > len(groups[head][0]):
                    head = g
            stones, lib, gz = groups[head]
            libs = set(lib)
            libs.update(empties)
            libs.update(gained.pop(head, ()))
            for g in friends:
                if g != head:
                    st, lib, z = groups.pop(g)
                    libs.update(lib)
                    libs.update(gained.pop(g, ()))
                    gz ^= z
                    stones += st
                    for q in st:
                        chain[q] = head
            libs.discard(p)
            libs = frozenset(libs)
            stones += (p,)
            gz ^= zc[p]
        if not libs:
            raise ValueError(f"illegal go action {p}: {self.names[p]} is suicide")
        if h in history:
            raise ValueError(f"illegal go action {p}: {self.names[p]} repeats an earlier "
                             "position (superko)")
        chain[p] = head
        groups[head] = (stones, libs, gz)
        for g, add in gained.items():
            st, lib, z = groups[g]
            groups[g] = (st, lib.union(add), z)
        if captured:
            k = len(captured)
            caps = (caps[0] + k, caps[1]) if c == 1 else (caps[0], caps[1] + k)
        return _new_state(GoState, (bytes(board), 1 - to_play, 0, ply + 1, history | {h},
                                    h, chain, groups, p, caps, recent, (path, p)))

    def area_score(self, s: GoState) -> float:
        """Black's area minus White's, minus komi (positive: Black wins)."""
        black, white, _ = self._areas(s.board)
        return black - white - self.komi

    def _areas(self, board: bytes) -> tuple[int, int, int]:
        """(Black's area, White's area, open points): stones plus empty regions that touch
        one colour only; open points are empty regions touching both colours or none."""
        counts = np.bincount(self.area_map(board), minlength=3)
        return int(counts[1]), int(counts[2]), int(counts[0])

    def selfplay_actions(self, s: GoState) -> list[int]:
        """The legal actions worth searching in self-play.

        * No placement in one of the mover's own true eyes (:meth:`is_own_eye`): it throws
          away a liberty the group needs to live, and against an opponent who plays on (a
          random player does) such fills let whole groups be captured.
        * A pass only while the mover is ahead on the board as it stands, and, unless it
          answers the opponent's pass (then it ends the game, a win), only on a settled board
          (every empty point is one colour's territory: no dame, no stone left inside the
          other's area). A pass while behind loses on the spot if the opponent passes too; a
          first pass on an unsettled board gives an opponent who plays on a free move or
          leaves an invader standing.
        * When nothing is left, the pass (always legal).

        Evaluation and GTP play keep every legal move: the network has to learn these."""
        legal = self.legal_actions(s)
        placements = [a for a in legal[:-1] if not self.is_own_eye(s, a)]
        black, white, open_points = self._areas(s.board)
        margin = (black - white - self.komi) * (1 if s.to_play == 0 else -1)
        may_pass = margin >= 0 and (not open_points or s.passes > 0)
        return placements + [self.pass_action] if may_pass or not placements else placements

    def is_own_eye(self, s: GoState, p: int) -> bool:
        """Whether empty point ``p`` is a true eye of the player to move: every orthogonal
        neighbour is the mover's stone, and fewer than two of its diagonals are the
        opponent's stones, counting the board's edge as one (so on the edge or in a corner
        a single opposing diagonal makes the eye false). The usual playout-policy test."""
        board, me = s.board, 1 + s.to_play
        if board[p] or any(board[q] != me for q in self.nbrs[p]):
            return False
        enemy = sum(board[q] == 3 - me for q in self.diags[p])
        return enemy + (len(self.diags[p]) < 4) < 2

    def score_margins(self, s: GoState) -> list[float]:
        """Each player's area margin with komi (Black's is :meth:`area_score`); AlphaZero
        can blend it into its value targets."""
        m = self.area_score(s)
        return [m, -m]

    def returns(self, s: GoState) -> list[float]:
        if not self.is_terminal(s):
            return [0.0, 0.0]
        score = self.area_score(s)
        if score == 0:
            return [0.0, 0.0]
        return [1.0, -1.0] if score > 0 else [-1.0, 1.0]

    def random_action(self, s: GoState, rng: random.Random) -> int:
        """A uniformly random legal action without building the legal list: draw among all
        actions until the draw is legal (rejection sampling: exactly uniform on the legal set)."""
        if self.is_terminal(s):
            raise ValueError("the game is over")
        board, pass_action, draw = s[0], self.pass_action, rng.random
        while True:
            a = int(draw() * (pass_action + 1))  # uniform up to float rounding (< 1e-13)
            if a == pass_action or (not board[a] and self.illegal_reason(s, a) is None):
                return a

    # ---- text ----------------------------------------------------------------------

    def _point_name(self, p: int) -> str:
        return f"{COLUMNS[p % self.size]}{p // self.size + 1}"

    def action_text(self, a: int) -> str:
        return self.names[a]

    def board_text(self, s: GoState) -> list[str]:
        """Column letters, then rows N..1: one character per point ('.', 'X', 'O'); the
        stone played last is lower case ('x' / 'o')."""
        n = self.size
        width = len(str(n))
        lines = [" " * width + " " + " ".join(COLUMNS[:n])]
        for r in range(n - 1, -1, -1):
            row = [STONE_CHARS[v] for v in s.board[r * n: (r + 1) * n]]
            if s.last is not None and 0 <= s.last - r * n < n and s.last < self.n_points:
                row[s.last - r * n] = row[s.last - r * n].lower()
            lines.append(f"{r + 1:>{width}} " + " ".join(row))
        return lines

    def status_lines(self, s: GoState) -> list[str]:
        last = "none"
        if s.last >= 0:
            last = f"{STONE_CHARS[2 - s.to_play]} {self.names[s.last]}"
        return [f"Last move: {last}. Captured: X {s.captures[0]}, O {s.captures[1]}. "
                f"Komi {self.komi:g} for O."]

    def observation_text(self, s: GoState, player: int) -> str:
        rules = (f"{self.size}x{self.size} board, area scoring, positional superko, "
                 "answer a point like D4 or pass.")
        state = [f"You play {STONE_CHARS[player + 1]}.", *self.status_lines(s), *self.board_text(s)]
        return prompt(self.name, rules, state, [self.names[a] for a in self.legal_actions(s)])

    def parse_action(self, s: GoState, text: str) -> int | Invalid:
        """The move in the answer's last ``<move>...</move>``: a point ("D4", any case) or
        "pass". Never raises; malformed, occupied, suicidal and superko moves are Invalid."""
        move = extract_move(text)
        if isinstance(move, Invalid):
            return move
        key = move.casefold()
        shown = move if len(move) <= 16 else move[:16] + "..."
        a = self.by_name.get(key)
        if a is None:
            m = _COORD.match(key)
            if m is None or (COLUMNS.index(m[1].upper()) < self.size
                             and 1 <= int(m[2]) <= self.size):  # e.g. "D04"
                return Invalid(f"{shown!r} is not a point like D4 or pass")
            return Invalid(f"{shown!r} is off the {self.size}x{self.size} board")
        reason = self.illegal_reason(s, a)
        return a if reason is None else Invalid(reason)

    def render(self, s: GoState) -> str:
        return "\n".join(self.status_lines(s) + self.board_text(s))

    # ---- positions for tests and tools -----------------------------------------------

    def from_rows(self, rows: list[str], to_play: int = 0) -> GoState:
        """A position from rows of '.', 'X', 'O', top row (row N) first. Groups with no
        liberty are refused; the position starts a fresh history."""
        n = self.size
        cells = "".join(r.replace(" ", "") for r in rows)
        if len(rows) != n or len(cells) != n * n or set(cells) - set(".XO"):
            raise ValueError(f"need {n} rows of {n} characters from '.XO'")
        board = bytearray(n * n)
        for i, ch in enumerate(cells):
            r, col = n - 1 - i // n, i % n
            board[r * n + col] = ".XO".index(ch)
        chain, groups, h = [-1] * self.n_points, {}, 0
        for p in range(self.n_points):
            if board[p] and chain[p] < 0:
                stones, libs, stack = [], set(), [p]
                chain[p] = p
                while stack:
                    q = stack.pop()
                    stones.append(q)
                    for nb in self.nbrs[q]:
                        if board[nb] == 0:
                            libs.add(nb)
                        elif board[nb] == board[p] and chain[nb] < 0:
                            chain[nb] = p
                            stack.append(nb)
                if not libs:
                    raise ValueError(f"group at {self.names[p]} has no liberty")
                gz = 0
                for q in stones:
                    gz ^= self.zobrist[board[p]][q]
                groups[p] = (tuple(stones), frozenset(libs), gz)
                h ^= gz
        return GoState(bytes(board), to_play, 0, 0, frozenset([h]), h, chain, groups)

    def move_history(self, s: GoState) -> tuple[bytes, list[int]]:
        """(start board, actions played since), e.g. to replay a game into a GTP engine."""
        node, actions = s.path, []
        while isinstance(node, tuple):
            node, a = node
            actions.append(a)
        return node, actions[::-1]

    def point(self, name: str) -> int:
        """Action id of a point name ("D4") or "pass"."""
        return self.by_name[name.casefold()]

    # ---- AlphaZero ---------------------------------------------------------------------

    def encode(self, s: GoState) -> np.ndarray:
        """Planes [2 * HISTORY_PLANES + 3, N, N] from the mover's side: for the current
        board and the 3 before it, (mover's stones, opponent's stones); a plane of ones when
        the opponent has just passed (a pass now ends the game: the same board is worth
        something else), a plane of ones when Black is to move and a plane of ones (the
        board's extent for padded convolutions). Missing earlier boards are empty.

        With ``area_planes`` four more come before the last three: the mover's area and
        the opponent's area as the board stands (the points :meth:`area_score` counts), a
        constant plane tanh(mover's margin with komi / 10) and a plane of ones when that
        margin is positive. Answering a pass with a pass wins exactly when it is positive
        (and loses otherwise); a small net does not learn to count the whole board to the
        half point in a 30-minute budget, so it is given the count."""
        n = self.size
        me = s.to_play + 1
        extra = 4 if self.area_planes else 0
        planes = np.zeros((2 * HISTORY_PLANES + extra + 3, n, n), dtype=np.float32)
        boards = (s.board, *s.recent)
        arr = np.frombuffer(b"".join(boards), dtype=np.uint8).reshape(len(boards), n, n)
        planes[0: 2 * len(boards): 2] = arr == me
        planes[1: 2 * len(boards): 2] = arr == 3 - me
        if extra:
            owner = self.area_map(s.board).reshape(n, n)
            planes[-7] = owner == me
            planes[-6] = owner == 3 - me
            margin = (float((owner == me).sum()) - float((owner == 3 - me).sum())
                      + (-self.komi if me == 1 else self.komi))
            planes[-5] = np.tanh(margin / 10.0)
            planes[-4] = float(margin > 0)
        planes[-3] = float(s.passes == 1)
        planes[-2] = float(s.to_play == 0)
        planes[-1] = 1.0
        return planes

    def area_map(self, board: bytes) -> np.ndarray:
        """Owner of every point as the board stands (area scoring): 1 or 2 for a stone of
        that colour or an empty region touching that colour only, 0 for other empty points."""
        owner = np.frombuffer(board, dtype=np.uint8).copy()
        seen = bytearray(self.n_points)
        for p in range(self.n_points):
            if board[p] or seen[p]:
                continue
            region, borders, stack = [], 0, [p]
            seen[p] = 1
            while stack:
                q = stack.pop()
                region.append(q)
                for nb in self.nbrs[q]:
                    if board[nb]:
                        borders |= board[nb]
                    elif not seen[nb]:
                        seen[nb] = 1
                        stack.append(nb)
            if borders in (1, 2):
                owner[region] = borders
        return owner

    def legal_masks(self, states: list[GoState]) -> np.ndarray:
        """Legal-move masks [len(states), n_actions] for a batch of states (search)."""
        mask = np.zeros((len(states), self.n_actions), dtype=bool)
        for i, s in enumerate(states):
            mask[i, self.legal_actions(s)] = True
        return mask

    def symmetry_actions(self, k: int) -> np.ndarray:
        """Action permutation of symmetry k (0..7; 0 is the identity); pass maps to pass.
        ``perm[a]`` is the image of action a."""
        return self._perms[k]

    def transform_planes(self, x: np.ndarray, k: int) -> np.ndarray:
        """Apply symmetry k to planes [..., N, N] (rows = board rows), consistent with
        :meth:`symmetry_actions`."""
        return _transform_grid(np.asarray(x), k)


def _transform_grid(x: np.ndarray, k: int) -> np.ndarray:
    """Symmetry k of the dihedral group on the last two axes: k % 4 quarter turns, then a
    transpose when k >= 4."""
    y = np.rot90(x, k % 4, axes=(-2, -1))
    if k >= 4:
        y = np.swapaxes(y, -1, -2)
    return np.ascontiguousarray(y)


def _symmetry_perms(n: int) -> list[np.ndarray]:
    """For each symmetry, where every action goes (derived from the grid transform so the
    two always agree)."""
    ids = np.arange(n * n).reshape(n, n)
    perms = []
    for k in range(8):
        img = _transform_grid(ids, k)  # img[r, c] = the point that lands on (r, c)
        perm = np.empty(n * n + 1, dtype=np.int64)
        perm[img.ravel()] = np.arange(n * n)
        perm[n * n] = n * n
        perms.append(perm)
    return perms
