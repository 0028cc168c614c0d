"""`lmselfplay play GAME [--model PATH]`: a person plays the model in the terminal.

The board is shown before every move; type a move name (as listed), or `quit`.
The model answers through the same prompt and parser the training uses.
"""

from __future__ import annotations

import argparse
import random
import sys

from lmselfplay.games import Invalid, make
from lmselfplay.games.base import move_text, resolve_chance
from lmselfplay.games.model_texts import make_game_for
from lmselfplay.games.text import MOVE_STOP, format_answer
from lmselfplay.lm.engines import HFEngine, SamplingParams
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.models.policy import load_policy, resolve_model_path


def main(argv: list[str] | None = None, input_fn=input, out=print) -> int:
    ap = argparse.ArgumentParser(prog="lmselfplay play", description=__doc__.splitlines()[0])
    ap.add_argument("game")
    ap.add_argument("--model", default=None, help="path or hub name; default: the embedded tiny model")
    ap.add_argument("--seat", type=int, choices=(1, 2), default=1, help="your seat (1 moves first)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=16, help="the model's answer budget per move (tokens)")
    args = ap.parse_args(argv)
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    game = make_game_for(args.game, resolve_model_path(args.model))  # the model reads the text it was built to read
    view = make(args.game)  # the person reads the game's own text (its legal moves listed)
    model, tok = load_policy(model_name_or_path=args.model)
    engine = HFEngine(model, tok)
    rng = random.Random(args.seed)
    me = args.seat - 1
    s = resolve_chance(game, game.new_initial_state(), rng)
    while not game.is_terminal(s):
        p = game.current_player(s)
        if p == me:
            out(view.observation_text(s, me).split("\nAnswer with")[0])
            try:
                text = input_fn("your move> ").strip()
            except EOFError:
                return 0
            if text.lower() in ("quit", "exit", "q"):
                return 0
            a = view.parse_action(s, format_answer(text))
            if isinstance(a, Invalid):
                out(f"  {a.reason}")
                continue
        else:
            prompt = encode_prompt(tok, game.observation_text(s, p))
            sp = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                seed=rng.randrange(2**31), stop=MOVE_STOP)
            (c,) = engine.generate([prompt], sp)
            a = game.parse_action(s, c.text)
            if isinstance(a, Invalid):
                out(f"model answered {c.text!r}: {a.reason} -> it forfeits")
                out(f"you win ({game.name})")
                return 0
            out(f"model plays {move_text(game, s, a)}")
        s = resolve_chance(game, game.apply(s, a), rng)
    out(game.render(s))
    r = game.returns(s)[me]
    out("you win" if r > 0 else "you lose" if r < 0 else "draw")
    return 0


if __name__ == "__main__":
    sys.exit(main())
