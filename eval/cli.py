"""The ``lmselfplay eval ...`` and ``lmselfplay arena ...`` verbs.

    lmselfplay eval reasoning --suite default [--model DIR] [--samples 8 --k 1,4] [--out DIR]
    lmselfplay eval reasoning --suite default --completions file.jsonl     # no model
    lmselfplay eval humaneval [--model DIR] [--samples 10 --k 1,10] [--out DIR]
    lmselfplay eval humaneval --completions samples.jsonl                  # no model
    lmselfplay arena tictactoe --models runs/a/checkpoint-100 runs/a/checkpoint-200 --bots random,exact

Results go to ``--out`` (default ``runs/eval/``, the arena ``runs/arena/``) as JSON + CSV (+ PNG for the arena),
each written atomically. A completions file's problems (missing ids, bad lines, oversized
completions) are printed and counted as failures; they never stop the run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _ks(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k wants integers like 1,5,10, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError("--k values must be >= 1")
    return ks


def _engine(args: argparse.Namespace) -> tuple[Any, Any]:
    from lmselfplay.lm.engines.hf import HFEngine
    from lmselfplay.models.policy import load_policy

    from .arena import model_dir

    path = None if args.model is None else model_dir(args.model)
    model, tok = load_policy(model_name_or_path=path, device=args.device)
    return HFEngine(model, tok, max_batch_size=args.batch_size), tok


def _print_issues(result: dict[str, Any]) -> None:
    if result.get("issues"):
        print("completions file issues:\n  " + "\n  ".join(result["issues"]), file=sys.stderr)


def _cmd_reasoning(args: argparse.Namespace) -> int:
    from . import reasoning
    from .report import render

    if args.completions:
        result = reasoning.score_completions_file(args.suite, args.completions, args.k)
        _print_issues(result)
    else:
        engine, tok = _engine(args)
        result = reasoning.evaluate_suite(engine, tok, args.suite, samples=args.samples,
                                          temperature=args.temperature, ks=args.k, seed=args.seed,
                                          max_new_tokens=args.max_new_tokens)
    print(render(result, args.out, f"reasoning_{result['suite']}"))
    return 0


def _cmd_humaneval(args: argparse.Namespace) -> int:
    from . import humaneval
    from .report import render

    if args.completions:
        result = humaneval.score_completions_file(args.completions, args.k, timeout_s=args.timeout)
        _print_issues(result)
    else:
        engine, tok = _engine(args)
        result = humaneval.evaluate_humaneval(engine, tok, samples=args.samples,
                                              temperature=args.temperature, ks=args.k,
                                              max_new_tokens=args.max_new_tokens or 256,
                                              seed=args.seed, limit=args.limit)
    print(render(result, args.out, "humaneval"))
    return 0


def _cmd_arena(args: argparse.Namespace) -> int:
    from lmselfplay.games.text import MOVE_STOP
    from lmselfplay.lm.engines.base import SamplingParams
    from lmselfplay.utils.checkpoint import atomic_write_text
    from lmselfplay.utils.errors import UserError

    from . import arena

    game = arena.game_for_models(args.game, args.models or [])
    bots = [b.strip() for b in args.bots.split(",") if b.strip()] if args.bots else []
    players = arena.load_players(game, args.models or [], bots, args.device)
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              stop=MOVE_STOP, seed=args.seed)
    res = arena.round_robin(game, players, games=args.games, sampling=sampling, seed=args.seed)
    out = arena.rate(res, n_boot=args.bootstrap, seed=args.seed)
    out["game"] = args.game
    print(f"== arena {args.game}: {args.games} games per pair ==")
    print(f"{'player':<32}{'Elo':>8}  95% CI")
    for name, r in out["ratings"].items():
        note = "  (perfect record: the rating is held by the prior alone)" if r["perfect_record"] else ""
        print(f"{name:<32}{r['elo']:>8.0f}  [{r['ci'][0]:.0f}, {r['ci'][1]:.0f}]{note}")
    for c in out["cycles"]:
        print("warning: non-transitive: " + " > ".join([*c, c[0]]))
    outdir = Path(args.out)
    png = arena.heatmap(res.names, res.score_share(), outdir / f"arena_{args.game}.png",
                        f"{args.game}: score share (row vs column)")
    atomic_write_text(outdir / f"arena_{args.game}.json", json.dumps(out, indent=1))
    rows = "player,elo,ci_lo,ci_hi,games,perfect_record\n" + "".join(
        f"{n},{r['elo']:.1f},{r['ci'][0]:.1f},{r['ci'][1]:.1f},{r['games']},{r['perfect_record']}\n"
        for n, r in out["ratings"].items())
    atomic_write_text(outdir / f"arena_{args.game}.csv", rows)
    print(f"wrote {outdir}/arena_{args.game}.json, .csv and {png}")
    return 0


def _model_args(p: argparse.ArgumentParser, default_tokens: int | None) -> None:
    p.add_argument("--model", default=None, help="model dir, run checkpoint dir or hub name; default: embedded")
    p.add_argument("--completions", default=None, help="score this JSONL instead of running a model")
    p.add_argument("--samples", type=int, default=0, help="sampled completions per problem (pass@k)")
    p.add_argument("--k", type=_ks, default=[1, 5], help="pass@k values, e.g. 1,5,10")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--max-new-tokens", type=int, default=default_tokens)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default="runs/eval", help="directory for the JSON and CSV")


def add_commands(sub: Any) -> None:
    """Add ``eval`` (with ``reasoning`` and ``humaneval``) and ``arena`` to a subparsers object."""
    ev = sub.add_parser("eval", help="reasoning benchmarks: reasoning-gym suites, HumanEval")
    evsub = ev.add_subparsers(dest="benchmark", required=True)
    r = evsub.add_parser("reasoning", help="a reasoning-gym suite (eval/suites/*.yaml or a path)")
    r.add_argument("--suite", default="default")
    _model_args(r, None)
    r.set_defaults(func=_cmd_reasoning)
    h = evsub.add_parser("humaneval", help="HumanEval's 164 problems, run in the sandbox")
    _model_args(h, 256)
    h.add_argument("--limit", type=int, default=None, help="only the first N problems (model runs)")
    h.add_argument("--timeout", type=float, default=3.0, help="seconds per program")
    h.set_defaults(func=_cmd_humaneval)
    a = sub.add_parser("arena", help="round robin of checkpoints and bots: Bradley-Terry Elo")
    a.add_argument("game")
    a.add_argument("--models", nargs="*", default=[], help="model dirs (or 'embedded')")
    a.add_argument("--bots", default="random", help="comma list of random, exact ('' for none)")
    a.add_argument("--games", type=int, default=100, help="games per pair (half per seating)")
    a.add_argument("--max-new-tokens", type=int, default=16, help="answer budget of a move (tokens)")
    a.add_argument("--temperature", type=float, default=1.0, help="the models' sampling temperature")
    a.add_argument("--bootstrap", type=int, default=200)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--device", default="auto")
    a.add_argument("--out", default="runs/arena", help="directory for the JSON, CSV and PNG")
    a.set_defaults(func=_cmd_arena)
