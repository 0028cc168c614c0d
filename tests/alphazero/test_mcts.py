"""PUCT search semantics: known values down to the last simulation."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmselfplay.alphazero.adapter import CachedGame, SearchGame
from lmselfplay.alphazero.batched_mcts import BatchedMCTS, batched_mcts, from_fns
from lmselfplay.alphazero.mcts import (
    MisereNimPosition,
    NimPosition,
    mcts,
    search_policy,
    uniform_prior,
    zero_value,
)
from lmselfplay.games import KuhnPoker, TicTacToe
from lmselfplay.games import Nim as ProjectNim
from lmselfplay.games.base import random_playout


def quarter(n: int) -> float:
    return 0.25 if n % 4 else -0.25


def test_known_value_nim5():
    N, Q = mcts(NimPosition(), 5, uniform_prior, quarter, 4, c_puct=2)
    assert N.tolist() == [2, 1, 1]
    assert Q.tolist() == [0.25, -0.25, -0.25]


@pytest.mark.parametrize("sims,expected", [(1, [1, 0, 0]), (2, [1, 1, 0]), (3, [1, 1, 1])])
def test_known_value_nim5_prefixes(sims, expected):
    # Hand trace: sim 1 ties at U = 0 -> first move; sim 2: 0.25+1/3 < 2/3; sim 3: a2 has U = 0.94.
    N, _ = mcts(NimPosition(), 5, uniform_prior, quarter, sims, c_puct=2)
    assert N.tolist() == expected


def test_terminal_values_normal_and_misere():
    assert NimPosition().terminal_value(0) == -1.0 and NimPosition().terminal_value(3) is None
    assert MisereNimPosition().terminal_value(0) == 1.0
    # From 1 stone the only move takes the last stone: a win in NimPosition, a loss in misere NimPosition.
    N, Q = mcts(NimPosition(), 1, uniform_prior, zero_value, 3)
    assert N.tolist() == [3, 0, 0] and Q.tolist() == [1.0, 0, 0]
    N, Q = mcts(MisereNimPosition(), 1, uniform_prior, zero_value, 3)
    assert N.tolist() == [3, 0, 0] and Q.tolist() == [-1.0, 0, 0]


def test_terminal_never_expanded_or_valued():
    seen_prior, seen_value = [], []

    def prior(s):
        seen_prior.append(s)
        return np.ones(3)

    def value(s):
        seen_value.append(s)
        return 0.0

    mcts(NimPosition(), 3, prior, value, 50, c_puct=1.0)
    assert 0 not in seen_prior and 0 not in seen_value
    # One node per path: from 3 stones the non-terminal paths are 3->2, 3->1, 3->2->1: root + 3.
    assert sorted(seen_prior) == [1, 1, 2, 3] and sorted(seen_value) == [1, 1, 2]


def test_converges_to_optimal_move():
    # From 7 stones the only winning move takes 3 (leaves 4); exact terminal values suffice.
    N, Q = mcts(NimPosition(), 7, uniform_prior, zero_value, 3000, c_puct=1.0)
    assert int(np.argmax(N)) == 2 and Q[2] > 0.5 and N[2] > 0.9 * N.sum()


def test_root_noise_is_dirichlet_on_legal_moves_in_order():
    eps, alpha, seed = 0.25, 0.3, 7
    eta = np.random.default_rng(seed).dirichlet([alpha] * 2)  # 2 stones: 2 legal moves
    noisy = np.array([(1 - eps) * 0.5 + eps * eta[0], (1 - eps) * 0.5 + eps * eta[1], 0.0])

    def prior_root_noised(s):
        return noisy if s == 2 else np.ones(3)

    for sims in (2, 5, 9):
        a = mcts(NimPosition(), 2, uniform_prior, quarter, sims, c_puct=3, eps=eps, alpha=alpha, seed=seed)
        b = mcts(NimPosition(), 2, prior_root_noised, quarter, sims, c_puct=3)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    # Noise changes the search (else the comparison above would be vacuous).
    c = mcts(NimPosition(), 9, uniform_prior, quarter, 6, c_puct=3, eps=0.9, alpha=0.05, seed=1)
    d = mcts(NimPosition(), 9, uniform_prior, quarter, 6, c_puct=3)
    assert not np.array_equal(c[0], d[0])


def test_prior_masked_and_renormalised():
    # All weight on the illegal action 2 (2 stones): legal moves become uniform.
    a = mcts(NimPosition(), 2, lambda s: np.array([0.0, 0.0, 5.0]), quarter, 7, c_puct=2)
    b = mcts(NimPosition(), 2, uniform_prior, quarter, 7, c_puct=2)
    assert np.array_equal(a[0], b[0])
    # Scale does not matter, only the ratio.
    c = mcts(NimPosition(), 9, lambda s: np.array([1.0, 2.0, 3.0]), quarter, 20)
    d = mcts(NimPosition(), 9, lambda s: np.array([10.0, 20.0, 30.0]), quarter, 20)
    assert np.array_equal(c[0], d[0])
    with pytest.raises(ValueError):
        mcts(NimPosition(), 9, lambda s: np.array([1.0, -1.0, 1.0]), quarter, 2)


def test_tie_break_first_legal_move():
    g = SearchGame(TicTacToe())
    root = g.position(TicTacToe().apply(TicTacToe().new_initial_state(), 0))  # X in cell 1
    N, _ = mcts(g, root, uniform_prior, zero_value, 1)
    assert N.tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0]


def test_adapter_matches_native_nim_and_refuses_hidden_information():
    g = SearchGame(ProjectNim(start=5))
    N, Q = mcts(g, g.position(ProjectNim(start=5).new_initial_state()), uniform_prior,
                lambda p: quarter(p.state.stones), 4, c_puct=2)
    assert N.tolist() == [2, 1, 1] and Q.tolist() == [0.25, -0.25, -0.25]
    with pytest.raises(ValueError):
        SearchGame(KuhnPoker())


def test_adapter_terminal_value_is_for_player_to_move():
    game = TicTacToe()
    g = SearchGame(game)
    s = g.position(game.new_initial_state())
    for a in (0, 3, 1, 4):  # X: 1, 2; O: 4, 5
        s = g.next_state(s, a)
    assert g.terminal_value(s) is None
    won = g.next_state(s, 2)  # X completes the top row; O would be to move
    assert won.player == 1 and g.terminal_value(won) == -1.0
    # Search from there finds the immediate win with exact value +1.
    N, Q = mcts(g, s, uniform_prior, zero_value, 200, c_puct=1.0)
    assert int(np.argmax(N)) == 2 and Q[2] == 1.0


# --- search_policy ------------------------------------------------------------------------


def test_search_policy_temperatures():
    legal = np.array([True, True, True, False])
    n = np.array([6.0, 3.0, 1.0, 50.0])  # visits on an illegal move must be ignored
    assert np.allclose(search_policy(n, 1.0, legal), [0.6, 0.3, 0.1, 0.0])
    assert np.allclose(search_policy(n, 0.5, legal), np.array([36, 9, 1, 0]) / 46)
    assert search_policy(n, 0.0, legal).tolist() == [1.0, 0.0, 0.0, 0.0]
    tie = search_policy(np.array([4.0, 1.0, 4.0, 9.0]), 0.0, legal)
    assert tie.tolist() == [0.5, 0.0, 0.5, 0.0]


def test_search_policy_no_visits_is_uniform_over_legal():
    legal = np.array([False, True, True])
    assert search_policy(np.zeros(3), 1.0, legal).tolist() == [0.0, 0.5, 0.5]
    assert search_policy(np.array([5.0, 0.0, 0.0]), 0.0, legal).tolist() == [0.0, 0.5, 0.5]


def test_search_policy_tiny_tau_does_not_overflow():
    legal = np.ones(4, dtype=bool)
    with np.errstate(all="raise"):
        pi = search_policy(np.array([800.0, 799.0, 400.0, 0.0]), 0.005, legal)
    ratio = np.exp(200 * np.log(800 / 799))  # (800/799)^(1/0.005)
    assert np.isclose(pi[0] / pi[1], ratio) and np.isclose(pi.sum(), 1.0)
    assert 0 < pi[2] < 1e-50 and pi[3] == 0.0
    assert np.all(np.isfinite(pi))
    with np.errstate(all="raise"):  # far below the smallest double: exactly 0, no error
        assert search_policy(np.array([1000.0, 1.0]), 0.005, legal[:2]).tolist() == [1.0, 0.0]


def test_search_policy_rejects_bad_input():
    with pytest.raises(ValueError):
        search_policy(np.ones(3), 1.0, np.zeros(3, dtype=bool))
    with pytest.raises(ValueError):
        search_policy(np.ones(3), -1.0, np.ones(3, dtype=bool))
    with pytest.raises(ValueError):
        search_policy(np.ones(2), 1.0, np.ones(3, dtype=bool))


# --- batched search -------------------------------------------------------------------------


def _hashed_fns():
    def h(p):
        return zlib.crc32(repr(p.state).encode())

    return (lambda p: np.random.default_rng(h(p)).random(9),
            lambda p: float(np.random.default_rng(h(p) + 1).uniform(-1, 1)))


def test_batched_known_value():
    N, Q = batched_mcts(NimPosition(), [5], from_fns(uniform_prior, quarter, 3), 4, c_puct=2)
    assert N.tolist() == [[2, 1, 1]] and Q.tolist() == [[0.25, -0.25, -0.25]]


@pytest.mark.parametrize("cached,fpu", [(False, None), (True, None), (True, 0.2)])
def test_batched_equals_unbatched(cached, fpu):
    g = SearchGame(TicTacToe())
    face = CachedGame(g) if cached else g
    prior, value = _hashed_fns()
    roots = [g.position(s) for s in random_playout(TicTacToe(), seed=3)[:-1]]
    evaluate = from_fns(prior, value, 9)
    for k, root in enumerate(roots):  # batch of one
        Nb, Qb = batched_mcts(face, [root], evaluate, 150, c_puct=1.3, eps=0.25, alpha=0.5,
                              seeds=[k], fpu_reduction=fpu)
        N, Q = mcts(g, root, prior, value, 150, c_puct=1.3, eps=0.25, alpha=0.5, seed=k,
                    fpu_reduction=fpu)
        assert np.array_equal(N, Nb[0]) and np.array_equal(Q, Qb[0])
    Nb, Qb = batched_mcts(face, roots, evaluate, 150, c_puct=1.3, eps=0.25, alpha=0.5,
                          seeds=range(len(roots)), fpu_reduction=fpu)  # whole batch at once
    for k, root in enumerate(roots):
        N, Q = mcts(g, root, prior, value, 150, c_puct=1.3, eps=0.25, alpha=0.5, seed=k,
                    fpu_reduction=fpu)
        assert np.array_equal(N, Nb[k]) and np.array_equal(Q, Qb[k])


def test_batched_one_network_call_per_wave():
    calls = []
    base = from_fns(uniform_prior, zero_value, 9)

    def evaluate(states):
        calls.append(len(states))
        return base(states)

    g = SearchGame(TicTacToe())
    root = g.position(TicTacToe().new_initial_state())
    batched_mcts(g, [root] * 8, evaluate, 5)
    assert calls == [8] * 6  # the roots, then one batch per simulation wave


def test_tree_reuse_keeps_subtree():
    g = SearchGame(TicTacToe())
    root = g.position(TicTacToe().new_initial_state())
    search = BatchedMCTS(g, from_fns(uniform_prior, zero_value, 9), c_puct=1.0)
    search.set_roots([root])
    N, _ = search.search(100)
    child_visits = N[0, 4]
    search.advance(0, 4)
    N2, _ = search.search(30)
    assert N2.sum() == child_visits - 1 + 30  # the child's own expansion visit is not an edge
    assert not N2[0, 4]  # cell 5 is taken now


def test_tree_reuse_many_trees_and_unexpanded_children():
    g = SearchGame(TicTacToe())
    game = TicTacToe()
    root = g.position(game.new_initial_state())
    search = BatchedMCTS(g, from_fns(uniform_prior, zero_value, 9), c_puct=1.0)
    search.set_roots([root, root, root])
    search.search(12)
    N0 = search.N[search.roots].copy()
    unvisited = int(np.flatnonzero(N0[2] == 0)[0]) if (N0[2] == 0).any() else None
    moves = [0, 4, unvisited if unvisited is not None else 8]
    search.advance([0, 1, 2], moves)
    N, _ = search.search(5, active=np.array([True, False, True]))
    def kept(k):  # edge visits below the new root: its visits minus its own expansion
        return max(N0[k, moves[k]] - 1, 0)

    assert N[0].sum() == kept(0) + 5
    assert N[1].sum() == kept(1)  # inactive tree: untouched
    assert N[2].sum() == kept(2) + 5
    # The reused trees search the positions after the move.
    for k, a in enumerate(moves):
        assert search.table.states[search.sid[search.roots[k]]] == g.next_state(root, a)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000) | st.sampled_from([1, 999, 1000]), st.booleans()),
                min_size=1, max_size=12),
       st.sampled_from([0.0, 0.005, 0.1, 0.5, 1.0, 2.0]))
def test_search_policy_properties(cells, tau):
    visits = np.array([float(n) for n, _ in cells])
    legal = np.array([ok for _, ok in cells])
    if not legal.any():
        legal[0] = True
    with np.errstate(all="raise"):
        pi = search_policy(visits, tau, legal)
    assert np.isclose(pi.sum(), 1.0) and np.all(pi >= 0)
    assert np.all(pi[~legal] == 0.0)
    if (visits[legal] > 0).any():
        top = visits[legal].max()
        assert np.argmax(pi) in np.flatnonzero(legal & (visits == top))


class _Behind:
    """Eight moves from a root whose mover is behind after every one of them (Q -0.4),
    least after move 3 (Q -0.1); the tree below repeats the root's values."""

    n_actions = 8

    def legal(self, s: tuple) -> np.ndarray:
        return np.ones(8, dtype=bool)

    def next_state(self, s: tuple, a: int) -> tuple:
        return (*s, a)

    def terminal_value(self, s: tuple) -> None:
        return None


def _behind_value(s: tuple) -> float:
    v = 0.1 if s and s[0] == 3 else 0.4
    return v if len(s) % 2 else -v  # for the player to move at s


def test_first_play_urgency_when_every_move_is_behind():
    """With Q = 0 for unvisited moves, a side that is behind everywhere spends each
    simulation on a new move: 8 simulations, 8 moves, one visit each (a flat target, which
    made 9x9 Go's Black learn to pass). With first-play urgency the search stays on the
    move its prior and values prefer."""
    prior = lambda s: [2.0 if a == 3 else 1.0 for a in range(8)]  # noqa: E731
    N, _ = mcts(_Behind(), (), prior, _behind_value, 8, c_puct=1.5)
    assert N.tolist() == [1.0] * 8
    N, Q = mcts(_Behind(), (), prior, _behind_value, 8, c_puct=1.5, fpu_reduction=0.2)
    assert N[3] == N.max() and N[3] >= 5 and Q[3] == pytest.approx(-0.1)
    Nb, _ = batched_mcts(_Behind(), [()], from_fns(prior, _behind_value, 8), 8, c_puct=1.5,
                         fpu_reduction=0.2)
    assert np.array_equal(Nb[0], N)
