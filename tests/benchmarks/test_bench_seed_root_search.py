"""benchmarks/bench_seed_root_search.py: the seed's root-only search demo on the AlphaZero
module (a lookup-table network behind the network interface, PUCT over one-move look-ahead)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_seed_root_search import (  # noqa: E402
    RootOnly,
    TableNet,
    evaluator,
    measure,
    searched_win_rate,
    self_play,
    train,
    winning_moves,
)

from lmselfplay.alphazero.adapter import SearchGame  # noqa: E402
from lmselfplay.alphazero.mcts import mcts  # noqa: E402
from lmselfplay.games import make  # noqa: E402


def test_root_only_search_values_only_the_roots_children_and_finds_the_win():
    face = SearchGame(make("tictactoe"))
    net = TableNet(face)
    prior, value = evaluator(net, face)
    seen = []

    def counted(s):
        seen.append(s)
        return value(s)

    g = face.game
    s = g.new_initial_state()
    for a in (0, 3, 1, 4):  # X X . / O O . / . . . : X to move wins at 2
        s = g.apply(s, a)
    root = face.position(s)
    search = RootOnly(face, counted)
    search.root = root
    visits, q = mcts(search, root, prior, counted, 40, c_puct=1.5)
    marks = sum(1 for c in root.state.board if c)
    assert seen and all(sum(1 for c in p.state.board if c) == marks + 1 for p in seen)
    assert int(np.argmax(visits)) == 2 and q[2] == 1.0


def test_generation_zero_is_uniform_play():
    face = SearchGame(make("tictactoe"))
    m = measure(TableNet(face), face)
    assert abs(m["vs_random"] - 0.5) < 1e-6  # uniform play against uniform play, both seats
    assert len(set(m["first_move"].values())) == 1 and 0.3 < m["immediate_win"] < 0.6


def test_one_generation_moves_the_table_toward_the_wins_its_search_found():
    import random

    import torch

    face = SearchGame(make("tictactoe"))
    net = TableNet(face)
    samples = self_play(net, face, 20, 16, random.Random(0))
    rows, wins = [], []
    for i, (x, _, _, _) in enumerate(samples):  # planes from the mover's side: mine, theirs
        board = tuple(1 if x[0].flat[k] else 2 if x[1].flat[k] else 0 for k in range(9))
        if winning_moves(board, 1):
            rows.append(i)
            wins.append(winning_moves(board, 1))
    assert len(rows) >= 10
    x = torch.from_numpy(np.stack([samples[i][0] for i in rows]))
    legal = torch.from_numpy(np.stack([samples[i][1] for i in rows]))

    def win_mass():
        with torch.no_grad():
            p = net(x, legal)[0].exp()
        return float(np.mean([float(p[j, w].sum()) for j, w in enumerate(wins)]))

    start = win_mass()
    train(net, samples, epochs=20, lr=0.1)
    assert win_mass() > start + 0.2


def test_the_search_player_takes_wins_the_untrained_table_does_not():
    from lmselfplay.games.base import all_states

    face = SearchGame(make("tictactoe"))
    net = TableNet(face)
    g = face.game
    found = [(face.position(s), winning_moves(s.board, g.current_player(s) + 1))
             for s in all_states(g) if not g.is_terminal(s)]
    found = [(p, w) for p, w in found if w][:60]
    raw = np.mean([len(w) / int(face.legal(p).sum()) for p, w in found])  # the uniform table
    searched = searched_win_rate(net, face, [p for p, _ in found], [w for _, w in found], 32)
    assert searched > max(0.85, raw + 0.25) and searched <= 1.0
