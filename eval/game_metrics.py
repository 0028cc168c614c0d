"""Exact game metrics for any LLM policy (greedy and expected under the policy).

What is measured is what the game declares (``game.exact_metric``):

* ``optimal_moves`` (Nim, tic-tac-toe): optimal-move rate over ALL reachable non-terminal
  positions — greedy decoding (parsed; an illegal answer counts as not optimal) and the
  expected probability of an optimal move under the policy's readout (below);
* ``exploitability`` (Kuhn poker): exact exploitability of the policy read off every
  information state;
* always: win / loss rates with 95% Wilson intervals and the mean return against the
  game's reference bots (:func:`lmselfplay.games.bots.reference_bots`).

The policy at a position is read (:mod:`lmselfplay.lm.readout`) in one of two ways, named in
the results (``readout``):

* ``bare``: the teacher-forced probability of every legal answer written right after the
  assistant header (``<move>X</move>``), normalized over the legal moves. Exact and cheap,
  but it is the policy only of a model that answers at once;
* ``sampled``: ``readout_samples`` answers per position (information set), generated as the
  policy plays (its temperature, its budget, thinking included) and parsed. The optimal-move
  probability is the share of samples that are optimal moves (an illegal or unfinished
  answer is not, as in play), with a 95% Wilson interval over all samples; the tabular
  policy is the sampled frequency of each legal move normalized over the legal samples
  (uniform where none was legal), and the game's exploitability is computed on it; the
  share of legal samples is reported beside it. This is the readout of a model that thinks
  (``readout: auto`` picks it exactly then, see :func:`resolve_readout`).

Every generation budget is the caller's ``max_new_tokens`` (a config / CLI value).
``lmselfplay eval-game GAME --model PATH`` prints these as a table and JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lmselfplay.games import Invalid, make
from lmselfplay.games.base import EXPLOITABILITY, OPTIMAL_MOVES, WIN_RATES
from lmselfplay.games.bots import reference_bots
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm.engines.base import SamplingParams
from lmselfplay.lm.readout import (
    MOVE_BUDGET,
    READOUTS,
    answer_distribution,
    decision_states,
    greedy_actions,
    resolve_readout,
    sampled_answers,
    sampled_distribution,
    tabular_policy,
)
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.curves import Reference
from lmselfplay.utils.stats import wilson


def optimal_move_rates(engine: Any, tokenizer: Any, game: Any, states: list[Any] | None = None,
                       max_new_tokens: int = MOVE_BUDGET, readout: str = "bare", samples: int = 32,
                       sampling: SamplingParams | None = None) -> dict[str, Any]:
    """Greedy rates (always) and the expected optimal-move probability of the ``readout``
    (``bare`` or ``sampled``, see the module docstring); ``sampling`` is the played policy's
    (default: temperature 1, ``max_new_tokens``)."""
    from lmselfplay.games.solve import optimal_actions

    states = decision_states(game) if states is None else states
    optimal = [set(optimal_actions(game, s)) for s in states]
    greedy = greedy_actions(engine, tokenizer, game, states, max_new_tokens)
    greedy_ok = [not isinstance(g, Invalid) and g in opt for g, opt in zip(greedy, optimal)]
    out: dict[str, Any] = {
        "positions": len(states), "readout": readout,
        "greedy_optimal_rate": sum(greedy_ok) / len(states),
        "greedy_legal_rate": sum(not isinstance(g, Invalid) for g in greedy) / len(states),
    }
    if readout == "bare":
        dist = answer_distribution(engine, tokenizer, game, states)
        expected = [sum(p for a, p in d.items() if a in opt) for d, opt in zip(dist, optimal)]
        argmax_ok = [max(d, key=d.get) in opt for d, opt in zip(dist, optimal)]
    elif readout == "sampled":
        sampling = sampling or SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, stop=MOVE_STOP)
        answers = sampled_answers(engine, tokenizer, game, states, samples, sampling)
        hits = [sum(not isinstance(x, Invalid) and x in opt for x in row) for row, opt in zip(answers, optimal)]
        legal = sum(not isinstance(x, Invalid) for row in answers for x in row)
        expected = [h / samples for h in hits]
        argmax_ok = [max(d := sampled_distribution(row, game.legal_actions(s)), key=d.get) in opt
                     for row, s, opt in zip(answers, states, optimal)]
        n = samples * len(states)
        out.update(readout_samples=samples, expected_optimal_ci=wilson(sum(hits), n),
                   readout_legal_rate=legal / n, readout_legal_ci=wilson(legal, n))
    else:
        raise ConfigError(f"readout must be 'bare' or 'sampled' here, got {readout!r}")
    out.update(expected_optimal_prob=sum(expected) / len(states), min_expected_optimal_prob=min(expected),
               argmax_optimal_rate=sum(argmax_ok) / len(states))
    return out


def policy_exploitability(engine: Any, tokenizer: Any, game: Any, readout: str = "bare", samples: int = 32,
                          sampling: SamplingParams | None = None) -> dict[str, Any]:
    """Exact exploitability of the LLM's tabular policy by ``readout`` (0 at a Nash
    equilibrium); the sampled readout adds the share of legal answers and its interval."""
    from lmselfplay.games.exploitability import exploitability

    counts: list[int] = []
    pol = tabular_policy(engine, tokenizer, game, readout, samples, sampling, counts)
    out: dict[str, Any] = {"exploitability": exploitability(game, pol), "policy": pol, "readout": readout}
    if counts:
        out.update(readout_samples=samples, readout_legal_rate=counts[0] / counts[1],
                   readout_legal_ci=wilson(counts[0], counts[1]))
    return out


def win_rates(engine: Any, tokenizer: Any, game: Any, opponent: Any, n_games: int = 200,
              sampling: SamplingParams | None = None, seed: int = 0, concurrency: int = 128) -> dict[str, Any]:
    """The LLM plays each seat in half the games. Illegal answers lose (zero-sum)."""
    from lmselfplay.lm.rollout import Episode, LLMPlayer, play_episodes

    sampling = sampling or SamplingParams(max_new_tokens=MOVE_BUDGET, temperature=1.0, seed=seed, stop=MOVE_STOP)
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


def uniform_value(game: Any) -> dict[str, float]:
    """What the uniform random policy scores on the game's exact metric: its expected
    optimal-move probability over every decision position, or its exploitability."""
    from lmselfplay.games.exploitability import exploitability, uniform_policy
    from lmselfplay.games.solve import optimal_actions

    if game.exact_metric == OPTIMAL_MOVES:
        states = decision_states(game)
        shares = [len(optimal_actions(game, s)) / len(game.legal_actions(s)) for s in states]
        return {"optimal_move_prob": sum(shares) / len(shares)}
    if game.exact_metric == EXPLOITABILITY:
        return {"exploitability": exploitability(game, uniform_policy(game))}
    return {}


def reference_lines(game: Any) -> dict[str, list[Reference]]:
    """The levels each of the game's metrics is read against, from what it declares: optimal
    play (1.0) where a solver labels every move, a Nash equilibrium (exploitability 0) where
    best responses are exact, the uniform random policy's value of either, and break-even
    (mean return 0, the game being zero-sum) against every reference bot."""
    out: dict[str, list[Reference]] = {}
    if game.exact_metric == OPTIMAL_MOVES:
        for m in ("optimal_move_prob", "greedy_optimal_rate", "min_optimal_prob"):
            out[m] = [Reference(1.0, "optimal play")]
    elif game.exact_metric == EXPLOITABILITY:
        out["exploitability"] = [Reference(0.0, "Nash equilibrium")]
    for m, v in uniform_value(game).items():
        out[m].append(Reference(v, f"uniform random policy ({v:.2f})"))
    for name in reference_bots(game):
        out[f"mean_return_vs_{name}"] = [Reference(0.0, "break-even")]
    return out


def plot_annotations(groups: Any) -> tuple[dict[str, list[Reference]], dict[str, str]]:
    """For the curve helper (:mod:`lmselfplay.utils.curves`): the reference lines of every
    ``group/metric`` key and the title of every group that names a registered game (its
    ``title``, else its name); groups that are not games get neither."""
    references: dict[str, list[Reference]] = {}
    titles: dict[str, str] = {}
    for group in dict.fromkeys(groups):
        try:
            game = make(group)
        except (KeyError, ValueError):  # a task or a training group, not a game
            continue
        titles[group] = getattr(game, "title", game.name.replace("_", " ").capitalize())
        references.update({f"{group}/{m}": refs for m, refs in reference_lines(game).items()})
    return references, titles


def policy_metrics(engine: Any, tokenizer: Any, game: Any, positions: list[Any] | None = None,
             n_games: int = 200, sampling: SamplingParams | None = None, seed: int = 0,
             max_new_tokens: int = MOVE_BUDGET, readout: str = "bare", readout_samples: int = 32
             ) -> dict[str, Any]:
    """Every exact metric ``game`` supports, as one flat dict: optimal-move rates over
    ``positions`` (default: all) or exploitability, by ``readout`` (``bare`` | ``sampled``,
    named as ``readout``; the sampled one adds ``readout_samples``, Wilson intervals and the
    share of legal answers), then win / loss rates (95% Wilson interval) and the mean return
    against each of the game's reference bots; for games whose seats are different roles
    (``game.roles``, e.g. Taboo's attacker and defender) also the win rate in each role.
    ``sampling`` is the played policy's (default: temperature 1, ``max_new_tokens``); greedy
    answers get ``max_new_tokens`` too."""
    sampling = sampling or SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed, stop=MOVE_STOP)
    out: dict[str, Any] = {}
    if game.exact_metric == OPTIMAL_MOVES:
        r = optimal_move_rates(engine, tokenizer, game, positions, max_new_tokens, readout, readout_samples, sampling)
        out["readout"] = r["readout"]
        out["optimal_move_prob"] = r["expected_optimal_prob"]
        out["greedy_optimal_rate"] = r["greedy_optimal_rate"]
        out["min_optimal_prob"] = r["min_expected_optimal_prob"]
        out.update(_readout_stats(r, "optimal_move_prob", "expected_optimal_ci"))
    elif game.exact_metric == EXPLOITABILITY:
        r = policy_exploitability(engine, tokenizer, game, readout, readout_samples, sampling)
        out["readout"] = r["readout"]
        out["exploitability"] = r["exploitability"]
        out.update(_readout_stats(r))
    for name, bot in reference_bots(game).items():
        wr = win_rates(engine, tokenizer, game, bot, n_games, sampling, seed=seed)
        out[f"win_vs_{name}"], out[f"loss_vs_{name}"] = wr["win"], wr["loss"]
        out[f"win_vs_{name}_ci_low"], out[f"win_vs_{name}_ci_high"] = wr["win_ci"]
        out[f"mean_return_vs_{name}"] = wr["mean_return"]
        for role, rate in zip(getattr(game, "roles", ()), wr["win_by_seat"]):  # asymmetric seats
            out[f"win_vs_{name}_as_{role}"] = rate
    return out


def _readout_stats(r: dict[str, Any], metric: str = "", ci_key: str = "") -> dict[str, Any]:
    """The sampled readout's extras, flat: samples, the metric's interval, the legal share."""
    if r["readout"] != "sampled":
        return {}
    out: dict[str, Any] = {"readout_samples": r["readout_samples"], "readout_legal_rate": r["readout_legal_rate"]}
    out["readout_legal_rate_ci_low"], out["readout_legal_rate_ci_high"] = r["readout_legal_ci"]
    if metric:
        out[f"{metric}_ci_low"], out[f"{metric}_ci_high"] = r[ci_key]
    return out


def format_table(game_name: str, result: dict[str, Any]) -> str:
    lines = [f"== {game_name} =="]
    for k, v in result.items():
        if isinstance(v, str):
            lines.append(f"{k:<32} {v}")
        elif k.endswith("_ci_low"):
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
    ap.add_argument("--max-new-tokens", type=int, default=MOVE_BUDGET,
                    help="answer budget of a move (tokens); a model that thinks needs hundreds")
    ap.add_argument("--temperature", type=float, default=1.0, help="the played policy's sampling temperature")
    ap.add_argument("--enable-thinking", choices=("true", "false"), default=None,
                    help="the chat template's thinking switch (Qwen3); default: the template's default")
    ap.add_argument("--readout", choices=READOUTS, default="auto",
                    help="bare: teacher-forced answers right after the header; sampled: N generated answers "
                         "per position; auto: sampled iff the policy thinks")
    ap.add_argument("--readout-samples", type=int, default=32, help="answers per position (sampled readout)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.max_new_tokens < 1 or args.readout_samples < 1 or args.n_games < 0:
        ap.error("--max-new-tokens and --readout-samples must be >= 1, --n-games >= 0")
    from lmselfplay.games.model_texts import make_game_for
    from lmselfplay.lm.engines.hf import HFEngine
    from lmselfplay.lm.prompt import thinks
    from lmselfplay.models.policy import load_policy, resolve_model_path

    thinking = None if args.enable_thinking is None else args.enable_thinking == "true"
    model, tok = load_policy(model_name_or_path=args.model, enable_thinking=thinking)
    engine = HFEngine(model, tok)
    readout = resolve_readout(args.readout, thinks(tok))
    results = []
    for name in args.games:
        sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                  seed=args.seed, stop=MOVE_STOP)
        r = policy_metrics(engine, tok, make_game_for(name, resolve_model_path(args.model)), n_games=args.n_games, sampling=sampling, seed=args.seed,
                     max_new_tokens=args.max_new_tokens, readout=readout, readout_samples=args.readout_samples)
        print(format_table(name, r), flush=True)
        results.append({"game": name, **r})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
