"""A trained AlphaZero Go network against GnuGo (GTP) and a random player.

    python benchmarks/bench_alphazero_go_vs_gnugo.py --run runs/alphazero_go9 \
        [--games 20] [--budgets 0 16 32 64] [--levels 1 10] [--random_games 100]

Loads the newest checkpoint of an ``recipes/alphazero.py`` run. For each search budget
(0 = the raw policy's argmax; otherwise greedy root visits, no root noise) it plays
``--games`` games against GnuGo at each level and ``--random_games`` against a uniform
random player, half as Black and half as White, from fixed openings (``--opening_plies``
random moves drawn from seeds 0, 1, ...; the same openings for every budget). Prints win
rates with 95% Wilson intervals and writes benchmarks/results/alphazero_go_vs_gnugo.json.
A draw is impossible (half-point komi).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lmselfplay.alphazero.evaluate import net_agent
from lmselfplay.eval.stats import wilson
from lmselfplay.games.base import random_legal_reset
from lmselfplay.games.gtp import gnugo_player
from lmselfplay.utils.checkpoint import atomic_write_text, latest_checkpoint
from lmselfplay.utils.config import parse_config
from lmselfplay.utils.recipe_loader import load_recipe


def play_one(face, start, seats) -> float:
    """Black's return; ``seats[p](state) -> action``."""
    s = start
    while not face.game.is_terminal(s):
        s = face.game.apply(s, seats[face.game.current_player(s)](s))
    return face.game.returns(s)[0]


def series(face, me, opponent, openings) -> dict[str, float]:
    """``me`` against ``opponent`` from every opening, once as each colour."""
    wins = 0
    for i, start in enumerate(tqdm(openings * 2, leave=False)):
        black_is_me = i < len(openings)
        seats = (me, opponent) if black_is_me else (opponent, me)
        r = play_one(face, start, seats)
        wins += (r > 0) == black_is_me
    n = 2 * len(openings)
    lo, hi = wilson(wins, n)
    return {"games": n, "wins": wins, "win_rate": wins / n, "ci95": [lo, hi]}


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

    recipe = load_recipe("alphazero")
    ckpt = latest_checkpoint(args.run)
    if ckpt is None:
        raise SystemExit(f"no checkpoint in {args.run}")
    cfg = parse_config(recipe.AlphaZeroConfig, ["--config", str(ckpt / "config.json")])
    game, face, net = recipe.build(cfg)
    net.load_state_dict(torch.load(ckpt / "state.pt", weights_only=False)["net"])
    net.eval()

    def openings(n: int) -> list:
        return [random_legal_reset(game, random.Random(i), args.opening_plies)
                if args.opening_plies else game.new_initial_state() for i in range((n + 1) // 2)]

    rng = random.Random(0)
    rand = lambda s: rng.choice(game.legal_actions(s))  # noqa: E731
    result = {"checkpoint": str(ckpt), "game": cfg.game, "results": {}}
    for k in args.budgets:
        agent = net_agent(face, net, k, cfg.c_puct, recipe.fpu(cfg))
        me = lambda s, agent=agent: agent([face.position(s)])[0]  # noqa: E731
        row = {"random": series(face, me, rand, openings(args.random_games))}
        for level in args.levels:
            with gnugo_player(level, game.size, game.komi) as gnugo:
                row[f"gnugo-l{level}"] = series(face, me, lambda s, g=gnugo: g(game, s),
                                                openings(args.games))
        result["results"][f"sims{k}"] = row
        for opp, r in row.items():
            print(f"budget {k:3d} vs {opp:10s}: {r['wins']:3d}/{r['games']} "
                  f"= {r['win_rate']:.2f}  95% CI [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=2, default=float) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
