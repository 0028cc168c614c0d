"""The language model on 9x9 Go: win rates against random and GnuGo, before and after self-play.

    python benchmarks/bench_llm_go.py --models embedded runs/selfplay_go9/final_model

Each model plays ``--games`` games against a uniformly random player and ``--gnugo_games``
against GnuGo at ``--level`` (skipped with a note when gnugo is not installed), seats
alternating, sampled at temperature 1 as in the recipe's evaluation; an illegal answer
loses. Wilson 95% intervals. Go has no exact optimal-move metric: win rates are its
measure. Results: ``benchmarks/results/llm_go.json`` (``--name``).
"""

from __future__ import annotations

import argparse
import random
import time

from lmselfplay.eval.game_metrics import win_rates
from lmselfplay.games import Invalid, make
from lmselfplay.games.base import random_playout
from lmselfplay.games.bots import BotPlayer, random_bot
from lmselfplay.games.gtp import find_gnugo, gnugo_player
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm.engines.base import SamplingParams
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.models.policy import load_policy
from lmselfplay.utils.results import save_results


def legal_rate(engine, tok, game, n: int, seed: int) -> float:
    """Share of sampled answers (temperature 1) that are legal moves, at ``n`` positions drawn
    from uniformly random games: one illegal answer in a game's ~80 turns loses it, so this
    per-turn rate is what the win rates above hinge on."""
    rng = random.Random(seed)
    states = []
    while len(states) < n:
        playout = [s for s in random_playout(game, seed=rng.randrange(2**31)) if not game.is_terminal(s)]
        states.append(rng.choice(playout))
    prompts = [encode_prompt(tok, game.observation_text(s, game.current_player(s))) for s in states]
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=seed, stop=MOVE_STOP))
    legal = [not isinstance(game.parse_action(s, o.text), Invalid) for s, o in zip(states, outs)]
    return sum(legal) / n


def series(engine, tok, game, opponent, n: int, seed: int) -> dict:
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=seed, stop=MOVE_STOP)
    t0 = time.time()
    r = win_rates(engine, tok, game, opponent, n, sampling, seed=seed)
    return {"games": n, "win": r["win"], "win_ci": list(r["win_ci"]), "loss": r["loss"],
            "win_as_black": r["win_by_seat"][0], "win_as_white": r["win_by_seat"][1],
            "seconds": round(time.time() - t0, 1)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["embedded"],
                    help="model folders; 'embedded' = the embedded tiny model")
    ap.add_argument("--games", type=int, default=100, help="games against random per model")
    ap.add_argument("--gnugo_games", type=int, default=20, help="games against GnuGo per model (0: none)")
    ap.add_argument("--level", type=int, default=1, help="GnuGo level")
    ap.add_argument("--positions", type=int, default=256, help="random positions for the legal-answer rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="llm_go", help="results file: benchmarks/results/NAME.json")
    args = ap.parse_args(argv)
    game = make("go9")
    use_gnugo = args.gnugo_games > 0 and find_gnugo() is not None
    if args.gnugo_games > 0 and not use_gnugo:
        print("gnugo not installed (apt-get install gnugo): GnuGo games skipped")
    rows = []
    for name in args.models:
        model, tok = load_policy(model_name_or_path=None if name == "embedded" else name)
        engine = HFEngine(model, tok)
        row = {"model": name, "legal_rate": legal_rate(engine, tok, game, args.positions, args.seed),
               "vs_random": series(engine, tok, game, random_bot(), args.games, args.seed)}
        print(f"{name:<40} legal answers at random positions: {row['legal_rate']:.3f}")
        if use_gnugo:
            with gnugo_player(level=args.level) as gnugo:
                row[f"vs_gnugo_l{args.level}"] = series(engine, tok, game, BotPlayer(gnugo, gnugo.name),
                                                        args.gnugo_games, args.seed)
        rows.append(row)
        for k, v in row.items():
            if isinstance(v, dict):
                print(f"{name:<40} {k:<14} win {v['win']:.3f} [{v['win_ci'][0]:.3f}, {v['win_ci'][1]:.3f}]"
                      f"  black {v['win_as_black']:.2f} white {v['win_as_white']:.2f}  ({v['seconds']} s)")
    if len(rows) > 1:
        print(f"win vs random, last / first: {rows[-1]['vs_random']['win']:.3f} / {rows[0]['vs_random']['win']:.3f}")
    result = {"game": "go9", "rows": rows, "seed": args.seed}
    save_results(args.name, result)
    return result


if __name__ == "__main__":
    main()
