"""Network, loss, self-play targets and evaluation helpers."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from lmselfplay.alphazero.adapter import CachedGame, SearchGame
from lmselfplay.alphazero.net_strength import (
    exact_agent,
    match,
    optimal_argmax_fraction,
    random_agent,
    raw_vs_minimax,
    raw_vs_random_exact,
)
from lmselfplay.alphazero.network import PolicyValueNet, alphazero_loss
from lmselfplay.alphazero.searched_games import SelfPlaySettings, alpha_for, play_games
from lmselfplay.games import Nim, TicTacToe


def nim_face(start=6, misere=False):
    return CachedGame(SearchGame(Nim(start=start, misere=misere)))


def make_net(face, seed=0):
    torch.manual_seed(seed)
    x = face.encode(face.position(face.game.new_initial_state()))
    return PolicyValueNet(int(np.prod(x.shape)), face.n_actions, hidden=16, blocks=1).eval()


def test_network_masks_illegal_moves():
    face = SearchGame(TicTacToe())
    net = make_net(face)
    s = face.position(TicTacToe().apply(TicTacToe().new_initial_state(), 4))
    x = torch.from_numpy(face.encode(s))[None]
    legal = torch.from_numpy(face.legal(s))[None]
    with torch.no_grad():
        logp, v = net(x, legal)
    assert torch.isinf(logp[0, 4]) and logp[0, 4] < 0
    assert torch.isclose(logp.exp().sum(), torch.tensor(1.0))
    assert -1 <= float(v) <= 1


def test_loss_matches_formula():
    face = SearchGame(TicTacToe())
    net = make_net(face)
    g = TicTacToe()
    states = [face.position(g.new_initial_state()), face.position(g.apply(g.new_initial_state(), 0))]
    x = torch.from_numpy(np.stack([face.encode(s) for s in states]))
    legal = torch.from_numpy(np.stack([face.legal(s) for s in states]))
    pi = legal.float() / legal.float().sum(-1, keepdim=True)
    z = torch.tensor([1.0, -1.0])
    loss, parts = alphazero_loss(net, x, legal, pi, z, c_reg=1e-4)
    logp, v = net(x, legal)
    ce = -(pi[0] * logp[0]).sum() - (pi[1, 1:] * logp[1, 1:]).sum()  # skip the -inf cell
    l2 = sum((p ** 2).sum() for p in net.parameters())
    expected = ((z - v) ** 2).mean() + ce / 2 + 1e-4 * l2
    assert torch.isclose(loss, expected) and torch.isfinite(loss)
    assert parts["l2"] == pytest.approx(l2.item(), rel=1e-6)


def _games(samples):
    """Split Nim samples (in game order) into games: the pile only shrinks within a game."""
    stones = samples.x.argmax(1)
    games, cur = [], [0]
    for i in range(1, len(stones)):
        if stones[i] >= stones[i - 1]:
            games.append(cur)
            cur = []
        cur.append(i)
    return games + [cur], stones


@pytest.mark.parametrize("misere,reuse", [(False, False), (True, False), (False, True)])
def test_selfplay_targets_for_player_to_move(misere, reuse):
    face = nim_face(6, misere)
    settings = SelfPlaySettings(n_sims=8, dirichlet_alpha=1.0, temperature_moves=10,
                                tree_reuse=reuse)
    samples, stats = play_games(face, make_net(face), 30, settings, random.Random(0))
    assert np.allclose(samples.pi.sum(1), 1.0)
    assert np.all(samples.pi[~samples.legal] == 0.0)  # no illegal target mass
    games, stones = _games(samples)
    assert len(games) == 30 and stats["selfplay/games"] == 30
    for g in games:
        z = samples.z[g]
        # The mover at the last position takes the last stone: wins, or loses in misere.
        assert z[-1] == (-1.0 if misere else 1.0)
        assert np.all(z[:-1] == -z[1:])  # alternating players, outcome for the mover
        assert stones[g[0]] == 6


@pytest.mark.parametrize("reuse", [False, True])
def test_selfplay_against_bank_stores_only_learner_moves(reuse):
    face = nim_face(9)
    settings = SelfPlaySettings(n_sims=4, dirichlet_alpha=1.0, tree_reuse=reuse)
    samples, stats = play_games(face, make_net(face, 0), 20, settings, random.Random(1),
                                opponents=[make_net(face, 1)], bank_fraction=1.0)
    assert "selfplay/vs_bank_return" in stats and "selfplay/first_player_return" not in stats
    games, stones = _games(samples)
    for g in games:
        assert len(set(samples.z[g].tolist())) == 1  # one player's positions only
        assert np.all(np.diff(stones[g]) <= -2)  # two plies between the learner's moves


def test_random_resets_start_inside_the_game():
    face = nim_face(12)
    settings = SelfPlaySettings(n_sims=2, dirichlet_alpha=1.0, reset_fraction=1.0,
                                reset_max_plies=6)
    samples, _ = play_games(face, make_net(face), 40, settings, random.Random(2))
    games, stones = _games(samples)
    firsts = {int(stones[g[0]]) for g in games}
    assert 12 in firsts and min(firsts) < 12


def test_alpha_scales_inversely_with_legal_moves():
    nim = nim_face(15)
    ttt = SearchGame(TicTacToe())
    assert alpha_for(ttt, ttt.game) < alpha_for(nim, nim.game)
    assert alpha_for(nim, nim.game) == pytest.approx(10 / 3, rel=0.1)


def test_exact_player_wins_from_winning_nim_start():
    face = nim_face(15)  # 15 % 4 != 0: the first player wins with exact play
    r = match(face, exact_agent(face, 0), random_agent(face, 0), 20, seed=0)
    assert r["first"] == 1.0 and r["second"] > 0.5
    r = match(face, exact_agent(face, 0), exact_agent(face, 1), 20, seed=0)
    assert r["first"] == 1.0 and r["second"] == 0.0


class _TableNet(torch.nn.Module):
    """A "network" whose logits come from a fixed table over tic-tac-toe encodings: lets the
    exact evaluators be checked against hand-known answers."""

    def __init__(self, choose):
        super().__init__()
        self.choose = choose

    def forward(self, x, legal):
        logits = torch.stack([self.choose(xi, li) for xi, li in zip(x, legal)])
        logits = logits.masked_fill(~legal, float("-inf"))
        return torch.log_softmax(logits, -1), torch.zeros(len(x))


def test_exact_evaluators_on_first_legal_policy():
    face = SearchGame(TicTacToe())
    first_legal = _TableNet(lambda x, legal: -torch.arange(9.0))  # prefer the lowest cell
    # Filling cells in order loses to minimax as O (X wins) and is beaten as X too.
    as_x = raw_vs_minimax(face, first_legal, 0)
    assert as_x["lost"] > 0 and sum(as_x.values()) >= 1
    # Against random, X playing 1,2,3,... wins often: exact expectation is in (0.5, 1).
    v = raw_vs_random_exact(face, first_legal, 0)
    assert 0.5 < v < 1.0
    nim = nim_face(7)
    take_one = _TableNet(lambda x, legal: torch.tensor([1.0, 0.0, 0.0]))
    frac = optimal_argmax_fraction(nim, take_one)
    # Reachable winning positions from 7: player 1 to move at 7, 5, 3, 2, 1 and player 2 at
    # 6, 5, 3, 2, 1. Taking one stone is optimal exactly at n % 4 == 1: 4 of those 10.
    assert frac["eval/raw_optimal_fraction_winning"] == pytest.approx(4 / 10)


def test_best_vs_random_ceiling_known_values():
    from fractions import Fraction

    from lmselfplay.alphazero.net_strength import best_vs_random_exact

    # Expectimax of tic-tac-toe against a uniform random player (win 1, draw 1/2).
    x = best_vs_random_exact(TicTacToe(), 0)
    o = best_vs_random_exact(TicTacToe(), 1)
    assert Fraction(x).limit_denominator(10_000) == Fraction(383, 384)
    assert Fraction(o).limit_denominator(10_000) == Fraction(1819, 1890)


def test_net_evaluator_fast_path_matches_states_path():
    from lmselfplay.alphazero.adapter import StateTable
    from lmselfplay.alphazero.network import NetEvaluator
    from lmselfplay.games.base import random_playout

    face = SearchGame(TicTacToe())
    net = make_net(face)
    ev = NetEvaluator(net, face)
    game = TicTacToe()
    positions = [face.position(s) for s in random_playout(game, seed=5)[:-1]]
    table = StateTable(face, capacity=2)  # forces the arrays to grow
    sids = np.array([table.add(p) for p in positions])
    p1, v1 = ev(positions)
    p2, v2 = ev.evaluate_ids(table, sids)
    assert np.array_equal(p1, p2) and np.array_equal(v1, v2)
    assert np.all(p1[~np.stack([face.legal(p) for p in positions])] == 0.0)


def test_the_old_module_path_is_one_line_naming_searched_games():
    import importlib
    import sys

    sys.modules.pop("lmselfplay.alphazero.selfplay", None)
    with pytest.raises(ImportError, match=r"^[^\n]*lmselfplay\.alphazero\.searched_games [^\n]*$"):
        importlib.import_module("lmselfplay.alphazero.selfplay")
