"""Build (or load) the embedded tiny model and measure its sampled-legal-move rate.

Target: built in <= 10 minutes on 2 cores, and >= 95% of sampled turns at
temperature 1 are legal moves in Nim, tic-tac-toe and Kuhn poker. Also prints how often
its sampled answers solve the synthetic arithmetic problems and program-output questions
(not a target: SPIN / Absolute Zero start from there), and how far from an optimal player
it is (random prior: it should NOT be optimal).

    .venv/bin/python benchmarks/bench_tiny_legal.py            # default model, cached
    .venv/bin/python benchmarks/bench_tiny_legal.py --force    # time a fresh build
    .venv/bin/python benchmarks/bench_tiny_legal.py --model PATH --n 512 --name NAME
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from lmselfplay import games
from lmselfplay.games.base import has_enumerable_actions, random_playout, resolve_chance
from lmselfplay.games.model_texts import make_game_for
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.tasks.arithmetic import arithmetic_problem, arithmetic_prompt
from lmselfplay.tasks.programs import program_output_prompt, python_program
from lmselfplay.utils.results import save_results


def random_positions(game, n: int, rng: random.Random) -> list:
    """States where a player is to move, drawn from uniformly random playouts (games with
    free-text moves: from games of the game's scripted players)."""
    out = []
    while len(out) < n:
        states = [s for s in playout(game, rng) if not game.is_terminal(s) and game.current_player(s) >= 0]
        out.append(rng.choice(states))
    return out


def playout(game, rng: random.Random) -> list:
    if has_enumerable_actions(game):
        return random_playout(game, seed=rng.randrange(2**31))
    states = [resolve_chance(game, game.new_initial_state(), rng)]
    while not game.is_terminal(states[-1]):
        states.append(game.apply(states[-1], game.scripted_action(states[-1], rng)))
    return states


def arithmetic_solved(model, tok, problems: list[dict], do_sample: bool = True) -> tuple[float, list[str]]:
    """Share of word problems whose answer ends with ``#### <the final answer>``, and the answers."""
    answers = sample(model, tok, [arithmetic_prompt(p) for p in problems], max_new_tokens=40, do_sample=do_sample)
    return sum(a.strip().endswith(f"#### {p['final']}") for a, p in zip(answers, problems)) / len(problems), answers


def outputs_predicted(model, tok, programs: list[dict], do_sample: bool = True) -> float:
    """Share of programs whose printed output the answer names exactly."""
    answers = sample(model, tok, [program_output_prompt(t) for t in programs], max_new_tokens=30, do_sample=do_sample)
    return sum(a.strip() == t["output"] for a, t in zip(answers, programs)) / len(programs)


@torch.no_grad()
def sample(model, tok, prompts: list[str], batch: int = 128, max_new_tokens: int = 12,
           do_sample: bool = True) -> list[str]:
    """Texts sampled at temperature 1 from left-padded batches (the engine's setting)."""
    texts = []
    for i in range(0, len(prompts), batch):
        ids = [encode_prompt(tok, p) for p in prompts[i : i + batch]]
        width = max(map(len, ids))
        x = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in ids])
        att = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
        out = model.generate(input_ids=x, attention_mask=att, do_sample=do_sample,
                             temperature=1.0 if do_sample else None, top_p=None, top_k=None,
                             max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
        texts += tok.batch_decode(out[:, width:], skip_special_tokens=True)
    return texts


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmselfplay.models.cache import ensure_tiny_model
    from lmselfplay.models.tiny import INFO_FILE, build_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    ap.add_argument("--force", action="store_true", help="rebuild the tiny model first")
    ap.add_argument("--n", type=int, default=512, help="sampled turns per game")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train_steps", type=int, default=None, help="override for a trial build")
    ap.add_argument("--cache_dir", default=None)
    ap.add_argument("--name", default="bench_tiny_legal", help="results file name (benchmarks/results/NAME.json)")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)

    build_s = None
    if args.model is None:
        cfg = build_config() if args.train_steps is None else build_config(train_steps=args.train_steps)
        t0 = time.time()
        path = ensure_tiny_model(force=args.force, cfg=cfg, cache_dir=args.cache_dir)
        build_s = time.time() - t0
        info = json.loads((path / INFO_FILE).read_text())
        print(f"model {path}: {info['n_params']:,} params, build {info['build_seconds']} s "
              f"(this call {build_s:.1f} s), {info['tokens_seen']:,} tokens, "
              f"final loss {info['final_loss_ema']:.3f}")
    else:
        path = args.model
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)

    results = {}
    print(f"\n{'game':12s} {'legal':>8s} {'optimal':>8s} {'(random)':>8s}   n={args.n}, temperature 1")
    for name in games.REGISTRY:
        game = make_game_for(name, path)
        states = random_positions(game, args.n, rng)
        prompts = [game.observation_text(s, game.current_player(s)) for s in states]
        longest = max(len(encode_prompt(tok, p)) for p in prompts)
        if longest + 12 > tok.model_max_length:
            print(f"{name:12s} skipped: prompts up to {longest} tokens, context {tok.model_max_length}")
            continue
        t0 = time.time()
        answers = sample(model, tok, prompts, max_new_tokens=12 if has_enumerable_actions(game) else 32)
        moves = [game.parse_action(s, a) for s, a in zip(states, answers)]
        legal = [not isinstance(m, games.Invalid) for m in moves]
        row = {"legal": sum(legal) / len(legal), "seconds": round(time.time() - t0, 1)}
        if hasattr(game, "optimal_actions"):  # Nim: exact; compare with a random legal move
            ok = [m in game.optimal_actions(s) for s, m, lg in zip(states, moves, legal) if lg]
            rnd = [len(game.optimal_actions(s)) / len(game.legal_actions(s)) for s in states]
            row["optimal_of_legal"] = sum(ok) / max(1, len(ok))
            row["random_optimal"] = sum(rnd) / len(rnd)
        results[name] = row
        opt = f"{row['optimal_of_legal']:8.3f} {row['random_optimal']:8.3f}" if "random_optimal" in row else f"{'':8s} {'':8s}"
        print(f"{name:12s} {row['legal']:8.3f} {opt}")
        bad = [a for a, lg in zip(answers, legal) if not lg][:3]
        if bad:
            print(f"{'':12s} e.g. illegal answers: {bad}")

    probs = [arithmetic_problem(rng) for _ in range(args.n // 2)]
    arith, _ = arithmetic_solved(model, tok, probs)
    arith_g, greedy = arithmetic_solved(model, tok, probs, do_sample=False)
    prog = outputs_predicted(model, tok, [python_program(rng) for _ in range(args.n // 2)])
    print(f"\narithmetic solved: {arith:.3f} sampled, {arith_g:.3f} greedy; "
          f"program outputs predicted (sampled): {prog:.3f}")
    print(f"example arithmetic answer: {greedy[0]!r} (truth {probs[0]['final']})")
    results.update(arithmetic_sampled=arith, arithmetic_greedy=arith_g, program_output=prog,
                   build_call_seconds=build_s)
    print(json.dumps(results))
    save_results(args.name, results)


if __name__ == "__main__":
    main()
