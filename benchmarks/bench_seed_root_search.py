"""Seed 002_f687f2ca8d4e1abd's tic-tac-toe root-only search demo, redone with the AlphaZero module.

    python benchmarks/bench_seed_root_search.py            # 6 generations, ~1 minute on one core

The seed's table (its protocol is not in the repository; only these numbers are):
lookup-table network, root-only search, six generations; the policy's score against a
random player 0.496 -> 0.658, first-move preference centre > corners > edges, immediate
win taken 0.959.

The protocol used here (every choice is stated, none is the seed's by assumption):

* network: :class:`TableNet`, a lookup table with the AlphaZero network's interface
  (``forward(planes, legal) -> (log-policy, value)``): one row of 9 move logits and one
  value (through tanh) per tic-tac-toe position, all 0 at generation 0 (uniform policy,
  value 0), trained with :func:`lmselfplay.alphazero.network.alphazero_loss`;
* root-only search: :func:`lmselfplay.alphazero.mcts.mcts` (PUCT, ``c_puct`` 1.5, root
  Dirichlet noise 0.25 / 0.3 in self-play) on :class:`RootOnly`, a search face whose
  non-terminal children of the root are leaves valued by the table (terminal children
  keep their exact value), so the search never looks deeper than one move;
* a generation: ``games`` self-play games with that search (``sims`` simulations per
  move, the move sampled from the visit counts at temperature 1), targets = visit
  distribution and final result, then ``epochs`` full-batch Adam steps (lr 0.1) on the
  samples of the last ``window`` generations (default 6: all of them);
* measured after every generation on the RAW table (no search), exactly (every line of
  play enumerated, no sampling noise): ``vs_random`` the mean over both seats of the
  expected score (win 1, draw 0.5) of the table's policy, SAMPLED, against a uniformly
  random player (uniform play scores exactly 0.500); ``vs_random_greedy`` the same for
  its argmax; ``first_move`` the empty-board probabilities of centre / a corner / an edge
  (means); ``immediate_win`` the mean probability of a winning move over every position
  that has one, ``immediate_win_argmax`` how often the argmax is one, and
  ``immediate_win_in_play`` the probability of taking an available immediate win in the
  table's own games against the random player (positions weighted by how likely that play
  reaches them: what a player of the table sees).

Writes ``benchmarks/results/seed_root_search.json``.

Measured (seed 0, 1 thread, 200 games x 32 simulations per generation; ~5 min at load 10 on 2
cores, seconds of CPU):

    | measure                        | seed 002_f687f2ca8d4e1abd | window 6 (default)      | window 1              |
    |--------------------------------|---------------------------|-------------------------|-----------------------|
    | vs random, generation 0 -> 6   | 0.496 -> 0.658            | 0.500 -> 0.664          | 0.500 -> 0.717        |
    | first move (centre/corner/edge)| centre > corners > edges  | 0.386 / 0.107 / 0.046   | 0.013 / 0.240 / 0.007 |
    | immediate win taken, in play   | 0.959                     | 0.676                   | 0.743                 |
    | ... over all 2,358 positions   |                           | 0.586 (argmax 0.630)    | 0.587 (argmax 0.629)  |
    | ... by the search player       |                           | 0.907 (generation 0: 0.906) |                   |

With replay over every generation the score and the first-move order are the seed's; training
on the latest generation only scores higher but the centre collapses after generation 3 (0.599
there, results/seed_root_search_window1.json, measured when window 1 was the default). Neither
takes immediate wins as often as the seed's 0.959: a table learns only the positions its 200
games a generation visit, and the seed's exact measure of "immediate win" is not recorded.
The root-only search player itself (``immediate_win_searched``: the table's prior and values,
32 simulations, no noise, the move drawn from the visits as in self-play; over all 2,358
positions, measured at generations 0 and 6) takes one 0.907 of the time, already 0.906 with
the untrained table: a won child's exact terminal value draws the visits, so that rate
measures the search, not what the table learned (window 6 run, 50 s on one core).
"""

from __future__ import annotations

import argparse
import random
import time
from functools import cache
from typing import Any

import numpy as np
import torch
from torch import nn

from lmselfplay.alphazero.adapter import Pos, SearchGame
from lmselfplay.alphazero.mcts import mcts, search_policy
from lmselfplay.alphazero.net_strength import raw_vs_random_exact
from lmselfplay.alphazero.network import alphazero_loss, raw_policy
from lmselfplay.games import make
from lmselfplay.games.base import all_states
from lmselfplay.games.tictactoe import LINES
from lmselfplay.utils.results import save_results

SEED_TABLE = {"vs_random_first": 0.496, "vs_random_last": 0.658, "first_move_order": "centre > corners > edges",
              "immediate_win": 0.959, "generations": 6}
CENTRE, CORNERS, EDGES = (4,), (0, 2, 6, 8), (1, 3, 5, 7)


class TableNet(nn.Module):
    """A lookup table behind the AlphaZero network interface: the row of a position is
    found from its encoding, so the search, the loss and the evaluations run unchanged."""

    def __init__(self, face: Any):
        super().__init__()
        game = face.game
        states = [s for s in all_states(game) if not game.is_terminal(s)]
        self.index = {face.encode(face.position(s)).tobytes(): i for i, s in enumerate(states)}
        self.n_actions = face.n_actions
        self.logits = nn.Parameter(torch.zeros(len(states), face.n_actions))
        self.values = nn.Parameter(torch.zeros(len(states)))

    def forward(self, x: torch.Tensor, legal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.tensor([self.index[r.numpy().astype(np.float32).tobytes()] for r in x.reshape(len(x), 3, 3, 3)])
        logits = self.logits[rows].masked_fill(~legal, float("-inf"))
        return torch.log_softmax(logits, dim=-1), torch.tanh(self.values[rows])


class RootOnly:
    """The search face of ``face`` with every non-terminal state except ``root`` a leaf
    whose value is ``value_of(state)``: PUCT at the root over one-move look-ahead."""

    def __init__(self, face: Any, value_of: Any):
        self.face, self.value_of, self.root = face, value_of, None
        self.n_actions = face.n_actions

    def legal(self, s: Pos) -> np.ndarray:
        return self.face.legal(s)

    def next_state(self, s: Pos, a: int) -> Pos:
        return self.face.next_state(s, a)

    def terminal_value(self, s: Pos) -> float | None:
        exact = self.face.terminal_value(s)
        if exact is not None or s is self.root:
            return exact
        return float(self.value_of(s))


def evaluator(net: TableNet, face: Any) -> tuple[Any, Any]:
    """(prior_fn, value_fn) of the table for the search."""
    def prior(s: Pos) -> np.ndarray:
        return raw_policy(net, face, [s])[0]

    @torch.no_grad()
    def value(s: Pos) -> float:
        x = torch.from_numpy(face.encode(s)[None])
        return float(net(x, torch.from_numpy(face.legal(s)[None]))[1][0])

    return prior, value


def self_play(net: TableNet, face: Any, games: int, sims: int, rng: random.Random) -> list[tuple]:
    """(planes, legal, visit distribution, result for the mover) of every move of ``games``
    games of root-only search against itself."""
    prior, value = evaluator(net, face)
    search = RootOnly(face, value)
    samples = []
    for _ in range(games):
        pos, moves = face.position(face.game.new_initial_state()), []
        while face.terminal_value(pos) is None:
            search.root = pos
            visits, _ = mcts(search, pos, prior, value, sims, c_puct=1.5, eps=0.25, alpha=0.3,
                             seed=rng.randrange(2**31))
            pi = search_policy(visits, 1.0, face.legal(pos))
            moves.append((face.encode(pos), face.legal(pos), pi, pos.player))
            pos = face.next_state(pos, int(rng.choices(range(len(pi)), weights=pi)[0]))
        returns = face.game.returns(pos.state)
        samples += [(x, legal, pi, float(returns[player])) for x, legal, pi, player in moves]
    return samples


def train(net: TableNet, samples: list[tuple], epochs: int, lr: float) -> float:
    x = torch.from_numpy(np.stack([s[0] for s in samples]))
    legal = torch.from_numpy(np.stack([s[1] for s in samples]))
    pi = torch.from_numpy(np.stack([s[2] for s in samples])).float()
    z = torch.tensor([s[3] for s in samples])
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(epochs):
        loss, stats = alphazero_loss(net, x, legal, pi, z, c_reg=0.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return stats["loss"]


def policy_table(net: TableNet, face: Any) -> dict[Pos, np.ndarray]:
    """The raw policy of every non-terminal position, one batched forward."""
    game = face.game
    positions = [face.position(s) for s in all_states(game) if not game.is_terminal(s)]
    return dict(zip(positions, raw_policy(net, face, positions)))


def sampled_vs_random(policy: dict[Pos, np.ndarray], face: Any, side: int) -> tuple[float, float, float]:
    """Exact (expected score, reach-weighted win mass, reach weight) of ``policy``, sampled,
    as ``side`` against a uniformly random player (both players' moves enumerated with
    their odds). Score: win 1, draw 0.5. The win mass is the probability the policy puts on
    a winning move, summed over the positions of its turns that have one, each weighted by
    how likely play reaches it; divided by the weight it is the rate at which an immediate
    win is taken IN PLAY."""
    game = face.game

    def odds(pos: Pos) -> list[tuple[int, float]]:
        moves = np.flatnonzero(face.legal(pos))
        if pos.player == side:
            return [(int(a), float(policy[pos][a])) for a in moves if policy[pos][a] > 0]
        return [(int(a), 1.0 / len(moves)) for a in moves]

    @cache
    def score(pos: Pos) -> float:
        if face.terminal_value(pos) is not None:
            return (game.returns(pos.state)[side] + 1.0) / 2.0
        return sum(p * score(face.next_state(pos, a)) for a, p in odds(pos))

    root = face.position(game.new_initial_state())
    level, mass, weight = {root: 1.0}, 0.0, 0.0
    while level:  # reach probabilities, one ply at a time (positions of a ply form a layer)
        nxt: dict[Pos, float] = {}
        for pos, prob in level.items():
            if face.terminal_value(pos) is not None:
                continue
            if pos.player == side:
                wins = winning_moves(pos.state.board, pos.player + 1)
                if wins:
                    mass += prob * float(policy[pos][wins].sum())
                    weight += prob
            for a, p in odds(pos):
                child = face.next_state(pos, a)
                nxt[child] = nxt.get(child, 0.0) + prob * p
        level = nxt
    return float(score(root)), mass, weight


def winning_moves(board: tuple, mover: int) -> list[int]:
    """Empty cells that complete a line of the mover's mark (1 = X, 2 = O)."""
    return [i for i in range(9) if not board[i]
            and any(i in line and all(board[j] == mover for j in line if j != i) for line in LINES)]


def searched_win_rate(net: TableNet, face: Any, positions: list[Pos], wins: list[list[int]],
                      sims: int) -> float:
    """Mean probability that the root-only search player (the table's prior and values,
    ``sims`` simulations, no root noise, the move drawn from the visits at temperature 1, as
    in self-play) takes an immediate win, over ``positions`` (each with its ``wins``)."""
    prior, value = evaluator(net, face)
    search = RootOnly(face, value)
    taken = []
    for pos, w in zip(positions, wins):
        search.root = pos
        visits, _ = mcts(search, pos, prior, value, sims, c_puct=1.5, eps=0.0)
        taken.append(float(search_policy(visits, 1.0, face.legal(pos))[w].sum()))
    return sum(taken) / len(taken)


def measure(net: TableNet, face: Any, sims: int = 0) -> dict[str, float]:
    """The raw table's measures; with ``sims`` > 0 also the search player's immediate-win rate."""
    game = face.game
    positions, wins = [], []
    for s in all_states(game):
        if game.is_terminal(s):
            continue
        w = winning_moves(s.board, game.current_player(s) + 1)
        if w:
            positions.append(face.position(s))
            wins.append(w)
    p = raw_policy(net, face, positions)
    mass = [float(p[i, w].sum()) for i, w in enumerate(wins)]
    argmax_ok = [int(np.argmax(p[i])) in w for i, w in enumerate(wins)]
    first = raw_policy(net, face, [face.position(game.new_initial_state())])[0]
    policy = policy_table(net, face)
    (sx, mx, wx), (so, mo, wo) = sampled_vs_random(policy, face, 0), sampled_vs_random(policy, face, 1)
    searched = {"immediate_win_searched": searched_win_rate(net, face, positions, wins, sims)} if sims else {}
    return searched | {
        "vs_random": (sx + so) / 2,
        "immediate_win_in_play": float((mx + mo) / (wx + wo)),
        "vs_random_greedy": (raw_vs_random_exact(face, net, 0) + raw_vs_random_exact(face, net, 1)) / 2,
        "first_move": {"centre": float(first[list(CENTRE)].mean()), "corner": float(first[list(CORNERS)].mean()),
                       "edge": float(first[list(EDGES)].mean())},
        "immediate_win": sum(mass) / len(mass),
        "immediate_win_argmax": sum(argmax_ok) / len(argmax_ok),
        "immediate_win_positions": len(mass),
    }


def run(generations: int = 6, games: int = 200, sims: int = 32, epochs: int = 50, lr: float = 0.1,
        seed: int = 0, window: int = 6) -> dict[str, Any]:
    """``window``: train on the samples of the last this many generations."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    face = SearchGame(make("tictactoe"))
    net = TableNet(face)
    rows = [{"generation": 0, "seconds": 0.0, **measure(net, face, sims)}]
    t0, recent = time.time(), []
    for g in range(1, generations + 1):
        samples = self_play(net, face, games, sims, rng)
        recent = [*recent, samples][-max(1, window):]
        loss = train(net, [x for part in recent for x in part], epochs, lr)
        rows.append({"generation": g, "seconds": round(time.time() - t0, 1), "samples": len(samples),
                     "loss": loss, **measure(net, face, sims if g == generations else 0)})
    return {"protocol": {"generations": generations, "games_per_generation": games, "sims": sims,
                         "epochs": epochs, "lr": lr, "seed": seed, "window": window, "c_puct": 1.5,
                         "root_noise": [0.25, 0.3]},
            "seed_table": SEED_TABLE, "generations": rows}


def order(fm: dict[str, float]) -> str:
    names = sorted(fm, key=fm.get, reverse=True)
    return " > ".join({"centre": "centre", "corner": "corners", "edge": "edges"}[n] for n in names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generations", type=int, default=6)
    ap.add_argument("--games", type=int, default=200, help="self-play games per generation")
    ap.add_argument("--sims", type=int, default=32, help="root-only search simulations per move")
    ap.add_argument("--epochs", type=int, default=50, help="full-batch Adam steps per generation")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=6, help="train on the last this many generations' samples (6: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="seed_root_search")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = run(args.generations, args.games, args.sims, args.epochs, args.lr, args.seed, args.window)
    print("gen  vs random (sampled)  vs random (argmax)  centre  corner  edge   immediate win: all (argmax), in play")
    for r in out["generations"]:
        fm = r["first_move"]
        print(f"{r['generation']:3d}  {r['vs_random']:19.3f}  {r['vs_random_greedy']:18.3f}  {fm['centre']:6.3f}  "
              f"{fm['corner']:6.3f}  {fm['edge']:5.3f}  {r['immediate_win']:.3f} ({r['immediate_win_argmax']:.3f}), "
              f"{r['immediate_win_in_play']:.3f}")
    first, last = out["generations"][0], out["generations"][-1]
    print("\n| measure | seed 002_f687f2ca8d4e1abd | this run |\n|---|---|---|")
    print(f"| vs random, first -> last generation | 0.496 -> 0.658 | {first['vs_random']:.3f} -> {last['vs_random']:.3f} |")
    print(f"| first-move preference | centre > corners > edges | {order(last['first_move'])} |")
    print(f"| immediate win taken | 0.959 | in play {last['immediate_win_in_play']:.3f}; over all positions "
          f"{last['immediate_win']:.3f} (argmax {last['immediate_win_argmax']:.3f}); by the search player "
          f"{last['immediate_win_searched']:.3f} (generation 0: {first['immediate_win_searched']:.3f}) |")
    save_results(args.name, out)


if __name__ == "__main__":
    main()
