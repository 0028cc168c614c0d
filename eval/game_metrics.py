"""Exact game metrics for any LLM policy (greedy and expected under the policy).

* Nim / tic-tac-toe: optimal-move rate over ALL reachable non-terminal positions —
  greedy decoding (parsed; an illegal answer counts as not optimal) and the expected
  probability of an optimal move, from teacher-forced scores of every legal answer
  normalized over the legal moves.
* Kuhn poker: exact exploitability of the policy read off the 12 information sets.
* Win / draw / loss against random and exact opponents with 95% Wilson intervals.

``lmselfplay eval-game GAME --model PATH`` prints these as a table and JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from lmselfplay.eval.stats import wilson
from lmselfplay.games import Invalid, make
from lmselfplay.games.base import all_states
from lmselfplay.games.text import MOVE_STOP, format_answer
from lmselfplay.lm.engines.base import SamplingParams
from lmselfplay.lm.prompt import encode_completion, encode_prompt


def decision_states(game: Any) -> list[Any]:
    """Every reachable non-terminal, non-chance position."""
    return [s for s in all_states(game) if not game.is_terminal(s) and game.current_player(s) >= 0]


def answer_distribution(engine: Any, tokenizer: Any, game: Any, states: list[Any],
                        temperature: float = 1.0) -> list[dict[int, float]]:
    """P(legal move) per state: each legal answer's teacher-forced sequence probability,
    normalized over the legal moves (what the policy would play if it answered legally)."""
    prompts, completions, index = [], [], []
    for i, s in enumerate(states):
        p = encode_prompt(tokenizer, game.observation_text(s, game.current_player(s)))
        for a in game.legal_actions(s):
            prompts.append(p)
            completions.append(encode_completion(tokenizer, format_answer(game.action_text(a)), eos=False))
            index.append((i, a))
    scores = engine.score(prompts, completions, temperature=temperature)
    logits: list[dict[int, float]] = [{} for _ in states]
    for (i, a), lp in zip(index, scores):
        logits[i][a] = sum(lp)
    out = []
    for d in logits:
        m = max(d.values())
        z = sum(math.exp(v - m) for v in d.values())
        out.append({a: math.exp(v - m) / z for a, v in d.items()})
    return out


def greedy_actions(engine: Any, tokenizer: Any, game: Any, states: list[Any],
                   max_new_tokens: int = 16) -> list[int | Invalid]:
    prompts = [encode_prompt(tokenizer, game.observation_text(s, game.current_player(s))) for s in states]
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=MOVE_STOP))
    return [game.parse_action(s, o.text) for s, o in zip(states, outs)]


def optimal_move_rates(engine: Any, tokenizer: Any, game: Any, states: list[Any] | None = None,
                       max_new_tokens: int = 16) -> dict[str, Any]:
    from lmselfplay.games.solve import optimal_actions

    states = decision_states(game) if states is None else states
    optimal = [set(optimal_actions(game, s)) for s in states]
    dist = answer_distribution(engine, tokenizer, game, states)
    greedy = greedy_actions(engine, tokenizer, game, states, max_new_tokens)
    expected = [sum(p for a, p in d.items() if a in opt) for d, opt in zip(dist, optimal)]
    greedy_ok = [not isinstance(g, Invalid) and g in opt for g, opt in zip(greedy, optimal)]
    return {
        "positions": len(states),
        "greedy_optimal_rate": sum(greedy_ok) / len(states),
        "greedy_legal_rate": sum(not isinstance(g, Invalid) for g in greedy) / len(states),
        "expected_optimal_prob": sum(expected) / len(states),
        "min_expected_optimal_prob": min(expected),
        "argmax_optimal_rate": sum(max(d, key=d.get) in opt for d, opt in zip(dist, optimal)) / len(states),
    }


def kuhn_policy(engine: Any, tokenizer: Any, game: Any | None = None) -> dict[str, list[float]]:
    """The LLM's action probabilities at each of Kuhn's 12 information sets."""
    game = game or make("kuhn_poker")
    reps: dict[str, Any] = {}
    for s in decision_states(game):
        reps.setdefault(game.information_state(s, game.current_player(s)), s)
    keys = sorted(reps)
    dist = answer_distribution(engine, tokenizer, game, [reps[k] for k in keys])
    return {k: [d.get(a, 0.0) for a in range(game.n_actions)] for k, d in zip(keys, dist)}


def kuhn_exploitability(engine: Any, tokenizer: Any) -> dict[str, Any]:
    from lmselfplay.games.exploitability import exploitability

    game = make("kuhn_poker")
    pol = kuhn_policy(engine, tokenizer, game)
    return {"exploitability": exploitability(game, pol), "policy": pol}


def opponents_for(game: Any) -> dict[str, Any]:
    from lmselfplay.lm.rollout import policy_bot, random_bot, solver_bot

    opp = {"random": random_bot()}
    if game.perfect_information:
        opp["exact"] = solver_bot()
    elif game.name == "kuhn_poker":
        from lmselfplay.games.kuhn_poker import nash_policy

        opp["exact"] = policy_bot(nash_policy(), "nash")
    return opp


def win_rates(engine: Any, tokenizer: Any, game: Any, opponent: Any, n_games: int = 200,
              sampling: SamplingParams | None = None, seed: int = 0, concurrency: int = 128) -> dict[str, Any]:
    """The LLM plays each seat in half the games. Illegal answers lose (zero-sum)."""
    from lmselfplay.lm.rollout import Episode, LLMPlayer, play

    sampling = sampling or SamplingParams(max_new_tokens=16, temperature=1.0, seed=seed, stop=MOVE_STOP)
    me = LLMPlayer(engine, tokenizer, learner=False)
    eps = [Episode(game, (me, opponent) if i % 2 == 0 else (opponent, me), seed=seed * 7919 + i)
           for i in range(n_games)]
    w = d = ret = 0.0
    for f in play(eps, sampling, concurrency=concurrency):
        seat = 0 if f.episode.players[0] is me else 1
        r = f.returns[seat]
        ret += r
        w += r > 0
        d += r == 0
    n = max(1, n_games)
    return {"games": n_games, "win": w / n, "draw": d / n, "loss": (n_games - w - d) / n,
            "win_ci": wilson(w, n_games), "loss_ci": wilson(n_games - w - d, n_games),
            "mean_return": ret / n}


def evaluate_game(engine: Any, tokenizer: Any, name: str, n_games: int = 200, seed: int = 0) -> dict[str, Any]:
    game = make(name)
    out: dict[str, Any] = {"game": name}
    if game.perfect_information:
        out.update(optimal_move_rates(engine, tokenizer, game))
    elif name == "kuhn_poker":
        out.update(kuhn_exploitability(engine, tokenizer))
    for opp_name, opp in opponents_for(game).items():
        out[f"vs_{opp_name}"] = win_rates(engine, tokenizer, game, opp, n_games, seed=seed)
    return out


def format_table(result: dict[str, Any]) -> str:
    lines = [f"== {result['game']} =="]
    for k, v in result.items():
        if k in ("game", "policy"):
            continue
        if isinstance(v, dict):
            lo, hi = v["win_ci"]
            lines.append(f"{k:<24} win {v['win']:.3f} [{lo:.3f}, {hi:.3f}]  draw {v['draw']:.3f}  "
                         f"loss {v['loss']:.3f}  mean return {v['mean_return']:+.3f}  (n={v['games']})")
        elif isinstance(v, float):
            lines.append(f"{k:<24} {v:.4f}")
        else:
            lines.append(f"{k:<24} {v}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lmselfplay eval-game", description=__doc__.splitlines()[0])
    ap.add_argument("games", nargs="*", default=["nim", "tictactoe", "kuhn_poker"])
    ap.add_argument("--model", default=None, help="path or hub name; default: the embedded tiny model")
    ap.add_argument("--n-games", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    from lmselfplay.lm.engines.hf import HFEngine
    from lmselfplay.lm.policy import load_policy

    model, tok = load_policy(model_name_or_path=args.model)
    engine = HFEngine(model, tok)
    results = []
    for name in args.games:
        r = evaluate_game(engine, tok, name, args.n_games, args.seed)
        print(format_table(r), flush=True)
        results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
