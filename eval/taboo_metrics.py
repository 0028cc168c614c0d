"""Taboo outcome metrics over finished games, and win rates against the scripted bots.

Both roles are always reported apart: in SPAG's self-play data the attacker won 31,273 games
to the defender's 2,700, so one pooled number would hide the weaker role.

* :func:`taboo_metrics` — attacker win / defender win / draw rates with 95% Wilson intervals;
  how each game ended (attacker said the word, defender said it, correct or wrong guess, an
  invalid answer per role, draw); the rule-break rates per role (attacker said the word;
  defender guessed wrong); mean game length in utterances; per-role entropy.
* :func:`win_rates_vs_bots` — a policy plays each role against the scripted bot of the other.

A finished game is a :class:`~lmselfplay.games.taboo.TabooState` or a rollout ``Finished``
(whose ``returns`` also tell forfeits by an invalid answer apart from draws).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from lmselfplay.games.taboo import ATTACKER, DEFENDER, WINNER
from lmselfplay.utils.stats import wilson

ATTACKER_INVALID, DEFENDER_INVALID, DRAW = "attacker_invalid", "defender_invalid", "draw"


def outcome(game: Any) -> tuple[str, int | None]:
    """(how it ended, the winning seat or None) of one finished game."""
    state = getattr(game, "final_state", game)
    if state.result:
        return state.result, WINNER[state.result]
    returns = getattr(game, "returns", None)
    if returns is not None and returns[ATTACKER] != returns[DEFENDER]:  # a forfeit
        loser = ATTACKER if returns[ATTACKER] < returns[DEFENDER] else DEFENDER
        return (ATTACKER_INVALID if loser == ATTACKER else DEFENDER_INVALID), 1 - loser
    return DRAW, None


def role_entropy(games: Sequence[Any], seat: int) -> float:
    """Mean of -log p over the tokens the policy sampled in ``seat`` (a Monte Carlo estimate
    of its per-token entropy); NaN without trajectories carrying log-probs."""
    lps = [lp for g in games for t in getattr(g, "trajectories", ()) if t.seat == seat
           for turn in t.turns for lp in turn.logprobs]
    return -sum(lps) / len(lps) if lps else math.nan


def taboo_metrics(games: Sequence[Any]) -> dict[str, Any]:
    """Rates (with Wilson intervals for the three results) over finished games."""
    n = len(games)
    ends = [outcome(g) for g in games]
    reasons = Counter(r for r, _ in ends)
    out: dict[str, Any] = {"games": n}
    for name, seat in (("attacker_win", ATTACKER), ("defender_win", DEFENDER), ("draw", None)):
        k = sum(w == seat for _, w in ends)
        out[name] = k / n if n else math.nan
        out[f"{name}_ci"] = wilson(k, n)
    for reason in ("attacker_said_word", "defender_said_word", "correct_guess", "wrong_guess",
                   ATTACKER_INVALID, DEFENDER_INVALID):
        out[f"{reason}_rate"] = reasons[reason] / n if n else math.nan
    out["attacker_rule_break_rate"] = out["attacker_said_word_rate"]
    out["defender_rule_break_rate"] = out["wrong_guess_rate"]
    lengths = [len(getattr(g, "final_state", g).utterances) for g in games]
    out["mean_length"] = sum(lengths) / n if n else math.nan
    out["attacker_entropy"] = role_entropy(games, ATTACKER)
    out["defender_entropy"] = role_entropy(games, DEFENDER)
    return out


def win_rates_vs_bots(engine: Any, tokenizer: Any, game: Any, n_games: int = 100,
                      sampling: Any = None, seed: int = 0, concurrency: int = 64) -> dict[str, Any]:
    """The policy plays ``n_games`` as attacker against the defender bot and ``n_games`` as
    defender against the attacker bot; :func:`taboo_metrics` of each, keyed by its role."""
    from lmselfplay.games.bots import BotPlayer
    from lmselfplay.games.taboo_bots import scripted_bot
    from lmselfplay.games.text import MOVE_STOP
    from lmselfplay.lm.engines.base import SamplingParams
    from lmselfplay.lm.rollout import Episode, LLMPlayer, play_episodes

    sampling = sampling or SamplingParams(max_new_tokens=64, temperature=1.0, seed=seed, stop=MOVE_STOP)
    me, bot = LLMPlayer(engine, tokenizer, learner=True), BotPlayer(scripted_bot, "taboo_bot")
    out = {}
    for role, seats in (("as_attacker", (me, bot)), ("as_defender", (bot, me))):
        eps = [Episode(game, seats, seed=seed * 7919 + i) for i in range(n_games)]
        out[role] = taboo_metrics(list(play_episodes(eps, sampling, concurrency=concurrency)))
    return out
