"""A trained AlphaZero Go network against GnuGo (GTP) and a random player.

    python benchmarks/bench_alphazero_go_vs_gnugo.py --run runs/alphazero_go9 \
        [--games 20] [--budgets 0 16 32 64] [--levels 1 10] [--random_games 100]

Loads the newest checkpoint of an ``recipes/alphazero.py`` run. For each search budget
(0 = the raw policy's argmax; otherwise greedy root visits, no root noise) it plays
``--games`` games against GnuGo at each level and ``--random_games`` against a uniform
random player, half as Black and half as White, from fixed openings (``--opening_plies``
random moves drawn from seeds 0, 1, ...; the same openings for every budget). The games of
one series advance together, so the network searches them in one batch (one GnuGo process
per game). Prints win rates with 95% Wilson intervals and writes
benchmarks/results/alphazero_go_vs_gnugo.json.
A draw is impossible (half-point komi).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from contextlib import ExitStack
from pathlib import Path

import torch

from lmselfplay.alphazero.config import AlphaZeroConfigs, fpu
from lmselfplay.alphazero.iteration import make_game_and_network
from lmselfplay.alphazero.net_strength import net_agent
from lmselfplay.games.base import random_legal_reset
from lmselfplay.games.gtp import gnugo_player
from lmselfplay.utils.checkpoint import atomic_write_text, latest_checkpoint
from lmselfplay.utils.stats import wilson


def play_all(face, me, opponent, starts, me_black: bool) -> list[float]:
    """One game from each start, all advancing together so that ``me`` (a batched agent:
    positions -> actions) searches every game's position in one batch; ``opponent(i,
    state) -> action`` moves in game i. Returns Black's return per game."""
    pos = [face.position(s) for s in starts]
    result: list[float | None] = [None] * len(starts)
    while True:
        live = [i for i, r in enumerate(result) if r is None]
        if not live:
            return [float(r) for r in result]
        mine = [i for i in live if (pos[i].player == 0) == me_black]
        for i, a in zip(mine, me([pos[i] for i in mine]) if mine else []):
            pos[i] = face.next_state(pos[i], a)
        for i in live:
            if i not in mine:
                pos[i] = face.next_state(pos[i], opponent(i, pos[i].state))
            if face.terminal_value(pos[i]) is not None:
                result[i] = face.game.returns(pos[i].state)[0]


def series(face, me, opponent, openings) -> dict[str, float]:
    """``me`` against ``opponent`` from every opening, once as each colour."""
    by_colour = {}
    for me_black in (True, False):
        returns = play_all(face, me, opponent, openings, me_black)
        by_colour["wins_as_black" if me_black else "wins_as_white"] = sum(
            (r > 0) == me_black for r in returns)
    wins = sum(by_colour.values())
    n = 2 * len(openings)
    lo, hi = wilson(wins, n)
    return {"games": n, "wins": wins, "win_rate": wins / n, "ci95": [lo, hi], **by_colour}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="output_dir of an alphazero run")
    ap.add_argument("--games", type=int, default=20, help="games per budget and level")
    ap.add_argument("--random_games", type=int, default=100)
    ap.add_argument("--budgets", type=int, nargs="+", default=[0, 16, 32, 64])
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--opening_plies", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/alphazero_go_vs_gnugo.json")
    args = ap.parse_args()
    torch.set_num_threads(1)

    ckpt = latest_checkpoint(args.run)
    if ckpt is None:
        raise SystemExit(f"no checkpoint in {args.run}")
    parsed = AlphaZeroConfigs.parse(["--config", str(ckpt / "config.json")])
    cfg, puct = parsed.alphazero, parsed.puct
    game, face, net = make_game_and_network(cfg)
    saved = torch.load(ckpt / "state.pt", weights_only=False)
    net.load_state_dict(saved["net"])
    iteration = saved["iteration"]
    net.eval()

    def openings(n: int) -> list:
        return [random_legal_reset(game, random.Random(i), args.opening_plies)
                if args.opening_plies else game.new_initial_state() for i in range((n + 1) // 2)]

    rng = random.Random(0)
    rand = lambda i, s: rng.choice(game.legal_actions(s))  # noqa: E731
    result = {"checkpoint": str(ckpt), "game": cfg.game, "iteration": iteration,
              "opening_plies": args.opening_plies, "results": {}}
    for k in args.budgets:
        t0 = time.time()
        me = net_agent(face, net, k, puct.c_puct, fpu(cfg))
        row = {"random": series(face, me, rand, openings(args.random_games))}
        for level in args.levels:
            starts = openings(args.games)
            with ExitStack() as stack:  # one engine per concurrent game, all killed on exit
                engines = [stack.enter_context(gnugo_player(level, game.size, game.komi))
                           for _ in starts]
                row[f"gnugo-l{level}"] = series(face, me, lambda i, s, e=engines: e[i](game, s),
                                                starts)
                row[f"gnugo-l{level}"]["engine_moves_refused"] = sum(e.replaced for e in engines)
        result["results"][f"sims{k}"] = row
        for opp, r in row.items():
            print(f"budget {k:3d} vs {opp:10s}: {r['wins']:3d}/{r['games']} "
                  f"= {r['win_rate']:.2f}  95% CI [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]")
        print(f"budget {k:3d}: {time.time() - t0:.0f} s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2, default=float) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
