"""Bot seats: players that are functions of the state, not language models.

A bot is a :class:`BotPlayer` whose ``act(game, state, rng) -> action`` picks a move; the
rollout loop plays it wherever an LLM seat could sit. :func:`reference_bots` asks a game
what it supports and returns the opponents every evaluation plays: ``random`` where moves
can be enumerated, ``exact``: uniform among optimal moves for games the solver labels, or the published
equilibrium policy of a game measured by exploitability, ``scripted`` where the game
offers a scripted opponent (``scripted_action``), and the bots a game brings itself
(``reference_opponents()``: OpenSpiel's MCTS at fixed budgets for its games with no exact metric).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmselfplay.games.base import EXPLOITABILITY, OPTIMAL_MOVES, has_enumerable_actions
from lmselfplay.games.exploitability import action_probs
from lmselfplay.games.solve import optimal_actions


@dataclass
class BotPlayer:
    act: Callable[[Any, Any, random.Random], Any]  # (game, state, rng) -> action
    name: str = "bot"
    learner: bool = False


def random_bot() -> BotPlayer:
    return BotPlayer(lambda g, s, rng: rng.choice(g.legal_actions(s)), "random")


def solver_bot() -> BotPlayer:
    """Exact play for perfect-information games (uniform among optimal moves)."""
    return BotPlayer(lambda g, s, rng: rng.choice(optimal_actions(g, s)), "exact")


def policy_bot(policy: dict[str, Any], name: str = "tabular") -> BotPlayer:
    """Samples from a tabular policy over information states (e.g. Kuhn's Nash)."""

    def act(g: Any, s: Any, rng: random.Random) -> int:
        probs = action_probs(g, policy, s, g.current_player(s))
        return rng.choices(list(probs), weights=list(probs.values()))[0]

    return BotPlayer(act, name)


def scripted_bot(game: Any) -> BotPlayer:
    """The game's own scripted opponent (``game.scripted_action``: e.g. Taboo's)."""
    return BotPlayer(lambda g, s, rng: g.scripted_action(s, rng), "scripted")


def league_bot(game: Any) -> BotPlayer:
    """The fixed bot of a league's opponent mix: random where moves can be enumerated,
    else the game's scripted opponent."""
    return random_bot() if has_enumerable_actions(game) else scripted_bot(game)


def reference_bots(game: Any) -> dict[str, BotPlayer]:
    """The fixed opponents a game's evaluation plays, chosen by what the game supports."""
    bots: dict[str, BotPlayer] = {}
    if has_enumerable_actions(game):
        bots["random"] = random_bot()
    if game.exact_metric == OPTIMAL_MOVES:
        bots["exact"] = solver_bot()
    elif game.exact_metric == EXPLOITABILITY and hasattr(game, "nash_policy"):
        bots["exact"] = policy_bot(game.nash_policy(), "nash")  # the exact opponent of this game
    if hasattr(game, "scripted_action"):
        bots["scripted"] = scripted_bot(game)
    if hasattr(game, "reference_opponents"):  # bots the game brings (OpenSpiel's MCTS)
        bots.update(game.reference_opponents())
    return bots
