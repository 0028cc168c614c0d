"""Exact game metrics for any LLM policy (greedy and expected under the policy).

What is measured is what the game declares (``game.exact_metric``):

* ``optimal_moves`` (Nim, tic-tac-toe): optimal-move rate over ALL reachable non-terminal
  positions — greedy decoding (parsed; an illegal answer counts as not optimal) and the
  expected probability of an optimal move, from teacher-forced scores of every legal
  answer normalized over the legal moves;
* ``exploitability`` (Kuhn poker): exact exploitability of the policy read off every
  information state;
* always: win / loss rates with 95% Wilson intervals and the mean return against the
  game's reference bots (:func:`lmselfplay.games.bots.reference_bots`).

``lmselfplay eval-game GAME --model PATH`` prints these as a table and JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from lmselfplay.games import Invalid, make
from lmselfplay.games.base import EXPLOITABILITY, OPTIMAL_MOVES, WIN_RATES, all_states
from lmselfplay.games.bots import reference_bots
from lmselfplay.games.text import MOVE_STOP, format_answer
from lmselfplay.lm.engines.base import SamplingParams
from lmselfplay.lm.prompt import encode_completion, encode_prompt
from lmselfplay.utils.stats import wilson


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


def tabular_policy(engine: Any, tokenizer: Any, game: Any) -> dict[str, list[float]]:
    """The LLM's action probabilities at every information state of a small
    imperfect-information game (one representative position per information state)."""
    reps: dict[str, Any] = {}
    for s in decision_states(game):
        reps.setdefault(game.information_state(s, game.current_player(s)), s)
    keys = sorted(reps)
    dist = answer_distribution(engine, tokenizer, game, [reps[k] for k in keys])
    return {k: [d.get(a, 0.0) for a in range(game.n_actions)] for k, d in zip(keys, dist)}


def policy_exploitability(engine: Any, tokenizer: Any, game: Any) -> dict[str, Any]:
    """Exact exploitability of the LLM's tabular policy (0 at a Nash equilibrium)."""
    from lmselfplay.games.exploitability import exploitability

    pol = tabular_policy(engine, tokenizer, game)
    return {"exploitability": exploitability(game, pol), "policy": pol}


def win_rates(engine: Any, tokenizer: Any, game: Any, opponent: Any, n_games: int = 200,
              sampling: SamplingParams | None = None, seed: int = 0, concurrency: int = 128) -> dict[str, Any]:
    """The LLM plays each seat in half the games. Illegal answers lose (zero-sum)."""
    from lmselfplay.lm.rollout import Episode, LLMPlayer, play_episodes

    sampling = sampling or SamplingParams(max_new_tokens=16, temperature=1.0, seed=seed, stop=MOVE_STOP)
    me = LLMPlayer(engine, tokenizer, learner=False)
    eps = [Episode(game, (me, opponent) if i % 2 == 0 else (opponent, me), seed=seed * 7919 + i)
           for i in range(n_games)]
    wins, losses, n_seat, ret = [0, 0], [0, 0], [0, 0], 0.0
    for f in play_episodes(eps, sampling, concurrency=concurrency):
        seat = 0 if f.episode.players[0] is me else 1
        r = f.returns[seat]
        ret += r
        n_seat[seat] += 1
        wins[seat] += r > 0
        losses[seat] += r < 0
    w, lost, n = sum(wins), sum(losses), max(1, n_games)
    return {"games": n_games, "win": w / n, "draw": (n_games - w - lost) / n, "loss": lost / n,
            "win_ci": wilson(w, n_games), "loss_ci": wilson(lost, n_games), "mean_return": ret / n,
            "win_by_seat": [wins[i] / max(1, n_seat[i]) for i in (0, 1)]}


def headline_metrics(game: Any) -> list[str]:
    """The metrics worth a curve for this game, by what it supports (plots ask this)."""
    exact = {OPTIMAL_MOVES: ["optimal_move_prob", "greedy_optimal_rate"],
             EXPLOITABILITY: ["exploitability"], WIN_RATES: []}[game.exact_metric]
    roles = getattr(game, "roles", ())
    wins = [f"win_vs_{name}_as_{r}" if roles else f"win_vs_{name}" for name in reference_bots(game)
            for r in (roles or [None])]
    return exact + wins


def evaluate(engine: Any, tokenizer: Any, game: Any, positions: list[Any] | None = None,
             n_games: int = 200, sampling: SamplingParams | None = None, seed: int = 0,
             max_new_tokens: int = 16) -> dict[str, float]:
    """Every exact metric ``game`` supports, as one flat dict: optimal-move rates over
    ``positions`` (default: all) or exploitability, then win / loss rates (95% Wilson
    interval) and the mean return against each of the game's reference bots; for games
    whose seats are different roles (``game.roles``, e.g. Taboo's attacker and defender)
    also the win rate in each role."""
    out: dict[str, float] = {}
    if game.exact_metric == OPTIMAL_MOVES:
        r = optimal_move_rates(engine, tokenizer, game, positions, max_new_tokens)
        out["optimal_move_prob"] = r["expected_optimal_prob"]
        out["greedy_optimal_rate"] = r["greedy_optimal_rate"]
        out["min_optimal_prob"] = r["min_expected_optimal_prob"]
    elif game.exact_metric == EXPLOITABILITY:
        out["exploitability"] = policy_exploitability(engine, tokenizer, game)["exploitability"]
    for name, bot in reference_bots(game).items():
        wr = win_rates(engine, tokenizer, game, bot, n_games, sampling, seed=seed)
        out[f"win_vs_{name}"], out[f"loss_vs_{name}"] = wr["win"], wr["loss"]
        out[f"win_vs_{name}_ci_low"], out[f"win_vs_{name}_ci_high"] = wr["win_ci"]
        out[f"mean_return_vs_{name}"] = wr["mean_return"]
        for role, rate in zip(getattr(game, "roles", ()), wr["win_by_seat"]):  # asymmetric seats
            out[f"win_vs_{name}_as_{role}"] = rate
    return out


def format_table(game_name: str, result: dict[str, float]) -> str:
    lines = [f"== {game_name} =="]
    for k, v in result.items():
        if k.endswith("_ci_low"):
            hi = result[k.replace("_ci_low", "_ci_high")]
            lines.append(f"{k[: -len('_ci_low')] + ' 95% CI':<32} [{v:.3f}, {hi:.3f}]")
        elif not k.endswith("_ci_high"):
            lines.append(f"{k:<32} {v:.4f}")
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
        r = evaluate(engine, tok, make(name), n_games=args.n_games, seed=args.seed)
        print(format_table(name, r), flush=True)
        results.append({"game": name, **r})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
