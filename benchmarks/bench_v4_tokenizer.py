"""What the v4 "cells" tokenizer changes in what the model reads, beside the shipped v3 BPE.

    python benchmarks/bench_v4_tokenizer.py [--turns 200]

For every corpus game, over ``--turns`` turns of random play (the corpus's own stream):
mean and max tokens per turn (prompt, with the formatter), the tokens of the legal-move
line, the share of move names that are one token, and for the board games the share of
board rows whose token count is the same for every row of that width (one token per
cell and separator whatever is on the cells: "position-stable"). Then the language tasks'
mean lengths. No training: seconds. Writes ``benchmarks/results/v4_tokenizer.json``.
"""

from __future__ import annotations

import argparse
import random
from statistics import mean

from lmselfplay import games
from lmselfplay.games.base import has_enumerable_actions
from lmselfplay.lm.prompt import encode_prompt, format_prompt
from lmselfplay.models import corpus as st
from lmselfplay.models import tiny
from lmselfplay.tasks.arithmetic import arithmetic_problem, arithmetic_prompt
from lmselfplay.tasks.programs import program_output_prompt, python_program
from lmselfplay.utils.results import save_results


def tokenizers() -> dict[str, object]:
    from transformers import AutoTokenizer

    v3 = AutoTokenizer.from_pretrained(tiny.ensure_tiny_model(progress=False))
    cfg = tiny.build_config("v4")
    rng = random.Random(cfg.seed)
    corpus = tiny.Corpus(cfg, random.Random(rng.random()))  # the build's own tokenizer texts
    texts = [format_prompt(None, p) + a for p, a, _ in (corpus.sample() for _ in range(cfg.tokenizer_texts))]
    return {"v3": v3, "v4": tiny.train_tokenizer(cfg, texts, tiny.move_names(cfg))}


def n_tokens(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def board_rows(text: str) -> list[str]:
    """Lines made only of one-character cells separated by single spaces (a board row)."""
    return [ln for ln in text.splitlines() if len(ln.split()) >= 3 and all(len(c) == 1 for c in ln.split())]


def game_stats(tok, game, turns: list[tuple[str, str]]) -> dict[str, float]:
    lengths = [len(encode_prompt(tok, p)) for p, _ in turns]
    legal = [n_tokens(tok, ln) for p, _ in turns for ln in p.splitlines() if ln.startswith("Legal moves:")]
    out = {"mean_tokens": mean(lengths), "max_tokens": max(lengths),
           "legal_line_tokens": mean(legal) if legal else 0.0}
    names = [game.action_text(a) for a in range(game.n_actions)]
    out["one_token_moves"] = mean(n_tokens(tok, n) == 1 for n in names)
    rows = [r for p, _ in turns for r in board_rows(p)]
    if rows:
        by_width: dict[int, set[int]] = {}
        for r in rows:
            by_width.setdefault(len(r.split()), set()).add(n_tokens(tok, r))
        out["stable_rows"] = mean(len(by_width[len(r.split())]) == 1 for r in rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--name", default="v4_tokenizer")
    args = ap.parse_args()
    toks = tokenizers()
    cfg = tiny.build_config("v4")
    results: dict[str, dict] = {name: {} for name in toks}
    print(f"{'game':12s} {'tokenizer':9s} {'mean':>6s} {'max':>5s} {'legal line':>10s} {'1-token moves':>13s} {'stable rows':>11s}")
    for g in cfg.game_names():
        game = games.make(g)
        if not has_enumerable_actions(game):
            continue
        turns = st.game_turns(game, random.Random(0), args.turns, st.reset_plies(game))
        for name, tok in toks.items():
            r = results[name][g] = game_stats(tok, game, turns)
            print(f"{g:12s} {name:9s} {r['mean_tokens']:6.1f} {r['max_tokens']:5d} {r['legal_line_tokens']:10.1f} "
                  f"{r['one_token_moves']:13.2f} {r.get('stable_rows', float('nan')):11.2f}")
    rng = random.Random(1)
    tasks = {"arithmetic": [arithmetic_prompt(arithmetic_problem(rng)) for _ in range(args.turns)],
             "programs": [program_output_prompt(python_program(rng)) for _ in range(args.turns)],
             "two_option": [st.two_option_task(rng)[0] for _ in range(args.turns)]}
    for kind, prompts in tasks.items():
        for name, tok in toks.items():
            results[name][kind] = {"mean_tokens": mean(len(encode_prompt(tok, p)) for p in prompts)}
            print(f"{kind:12s} {name:9s} {results[name][kind]['mean_tokens']:6.1f}")
    save_results(args.name, results)


if __name__ == "__main__":
    main()
