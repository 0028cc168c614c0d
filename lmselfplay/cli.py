"""`lmselfplay ...`: everything that is not a training recipe.

Subcommands import their modules lazily so that `lmselfplay show nim` stays instant.
"""

from __future__ import annotations

import argparse
import random
import sys

from lmselfplay.utils.errors import UserError


def _cmd_show(args: argparse.Namespace) -> int:
    """Print a random game's positions as a person sees them (and the model's prompt)."""
    from lmselfplay.games import make
    from lmselfplay.games.base import random_playout

    game = make(args.game)
    states = random_playout(game, seed=args.seed)
    for s in states:
        print(game.render(s))
        print()
    if args.prompt:  # in the text the model was built to read (imports torch, so only here)
        from lmselfplay.games.model_texts import make_game_for
        from lmselfplay.models.policy import resolve_model_path

        model_game = make_game_for(args.game, resolve_model_path(args.model))
        first = next(s for s in states if game.current_player(s) >= 0)
        print("--- what the model reads as player", game.current_player(first) + 1, "---")
        print(model_game.observation_text(first, game.current_player(first)))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """An exact solver (seat 1) against a random player (seat 2), as a transcript."""
    from lmselfplay.games import make
    from lmselfplay.games.base import move_text
    from lmselfplay.games.solve import optimal_actions

    game = make(args.game)
    if not game.perfect_information:
        print(f"{args.game} has hidden information; the demo needs an exact solver (nim, tictactoe)")
        return 2
    rng = random.Random(args.seed)
    totals = [0.0, 0.0]
    for g in range(args.games):
        s = game.new_initial_state()
        verbose = g == 0
        while not game.is_terminal(s):
            p = game.current_player(s)  # perfect-information games here: no chance nodes
            a = rng.choice(optimal_actions(game, s)) if p == 0 else rng.choice(game.legal_actions(s))
            if verbose:
                print(game.render(s))
                who = "solver" if p == 0 else "random"
                print(f"player {p + 1} ({who}) plays {move_text(game, s, a)}\n")
            s = game.apply(s, a)
        if verbose:
            print(game.render(s), "\nreturns", game.returns(s), "\n")
        totals = [t + r for t, r in zip(totals, game.returns(s))]
    print(f"{args.games} games: solver mean return {totals[0] / args.games:+.3f}")
    return 0


def _passthrough(module: str, func: str):
    def run(args: argparse.Namespace) -> int:
        import importlib

        result = importlib.import_module(module).__dict__[func](args.rest)
        return result if isinstance(result, int) else 0

    return run


PASSTHROUGH = {
    "bootstrap": ("lmselfplay.models.cache", "bootstrap_main", "build the embedded tiny model (cached)"),
    "play": ("lmselfplay.human_play", "main", "play a game against the model in the terminal"),
    "eval-game": ("lmselfplay.eval.game_metrics", "main", "exact game metrics of a model"),
    "gametheory-plots": ("lmselfplay.game_theory.plots", "main",
                         "PNG of exploitability vs T for best response, fictitious play, regret matching"),
    "lm-eval": ("lmselfplay.eval.lm_eval_bridge", "main", "lm-evaluation-harness with --model lmselfplay"),
    "referee-study": ("lmselfplay.referee_study", "main", "R-Zero grounded by rules/executor vs vote (vs judge)"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lmselfplay", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="print a random game of GAME as boards/hands")
    show.add_argument("game")
    show.add_argument("--seed", type=int, default=0)
    show.add_argument("--prompt", action="store_true", help="also print the model's prompt")
    show.add_argument("--model", default=None,
                      help="--prompt in the text this model reads (default: the embedded model)")
    show.set_defaults(func=_cmd_show)
    demo = sub.add_parser("demo", help="exact solver vs random player, as a transcript")
    demo.add_argument("game", nargs="?", default="tictactoe")
    demo.add_argument("--games", type=int, default=100)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_cmd_demo)
    from lmselfplay.eval.cli import add_commands  # eval reasoning|humaneval, arena
    add_commands(sub)
    for name, (module, func, help_) in PASSTHROUGH.items():
        sp = sub.add_parser(name, help=help_, add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
        sp.set_defaults(func=_passthrough(module, func))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASSTHROUGH:
        # argparse's REMAINDER drops a remainder that starts with an option
        # ("bootstrap --force" -> "unrecognized arguments"), so these skip the parser.
        args = argparse.Namespace(command=argv[0], rest=argv[1:], func=_passthrough(*PASSTHROUGH[argv[0]][:2]))
    else:
        args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UserError, ValueError, KeyError, FileNotFoundError) as e:
        print(f"lmselfplay {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
