"""The Game protocol: one definition serves the LLM (text), search (AlphaZero), the exact
solvers and the renderer.

Conventions (OpenSpiel-like, so differential tests map one to one):

* two players, ids 0 and 1; ``current_player`` is ``CHANCE`` at chance nodes and
  ``TERMINAL`` at terminal states;
* actions are small ints in ``range(game.n_actions)``; chance outcomes are ints too;
* except in games whose moves are free text, which say ``action_space = "text"`` (absent
  means ``"discrete"``; Taboo is one): a player's action is the string it utters,
  ``n_actions`` is 0, ``legal_actions`` cannot enumerate them and raises, ``parse_action``
  returns the cleaned utterance or an ``Invalid``, ``action_text(a)`` is ``a``, and
  ``apply(state, utterance)`` checks it again (``ValueError`` if illegal). Chance outcomes
  stay ints. Code that samples from ``legal_actions`` (random bots, random resets, exact
  solvers) does not apply to them; they offer ``scripted_action(state, rng)`` instead, a
  scripted opponent's move for whoever is to move;
* states are immutable (frozen dataclasses of tuples): ``apply`` returns a new state, so
  copying is free and states can key dictionaries;
* ``returns`` is zero-sum, one value per player;
* text goes through :mod:`lmselfplay.games.text` so that every game shares ONE answer
  format and ONE parser.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

CHANCE = -1
TERMINAL = -4

# What can be measured exactly about a game (its ``exact_metric``); recipes, ``eval-game``
# and the plots ask the game for this instead of branching on its name.
OPTIMAL_MOVES = "optimal_moves"  # small perfect-information: the solver labels every move
EXPLOITABILITY = "exploitability"  # small imperfect-information: best response over info sets
WIN_RATES = "win_rates"  # too large to solve: win rates against bots and other players only
EXACT_METRICS = (OPTIMAL_MOVES, EXPLOITABILITY, WIN_RATES)


def has_enumerable_actions(game: Any) -> bool:
    """False for free-text games (``action_space = "text"``): no random moves, resets or solver."""
    return getattr(game, "action_space", "discrete") != "text"


@dataclass(frozen=True)
class Invalid:
    """What ``parse_action`` returns when the text is not a legal move (never raised)."""

    reason: str

    def __bool__(self) -> bool:  # `if move:` reads naturally; action 0 is falsy too,
        return False  # so callers should test `isinstance(x, Invalid)`.


@runtime_checkable
class Game(Protocol):
    """Two-player zero-sum game, optionally with chance and hidden information."""

    name: str
    n_actions: int
    perfect_information: bool
    max_utility: float  # the largest |return| (OpenSpiel's name): what a forfeit costs
    exact_metric: str  # one of EXACT_METRICS

    def new_initial_state(self, seed: int | None = None) -> Any:
        """The root. With ``seed`` given, chance nodes at the root are resolved with it."""

    def current_player(self, state: Any) -> int: ...

    def legal_actions(self, state: Any) -> list[int]: ...

    def chance_outcomes(self, state: Any) -> list[tuple[int, float]]: ...

    def apply(self, state: Any, action: int) -> Any: ...

    def is_terminal(self, state: Any) -> bool: ...

    def returns(self, state: Any) -> list[float]: ...

    def observation_text(self, state: Any, player: int) -> str: ...

    def action_text(self, action: int) -> str: ...

    def parse_action(self, state: Any, text: str) -> int | Invalid: ...

    def render(self, state: Any) -> str: ...


def move_text(game: Game, state: Any, action: Any) -> str:
    """The name of ``action`` at ``state`` as the player to move writes it: the game's
    ``state_action_text(state, a)`` where names depend on the position or the player (OpenSpiel's
    action strings: ``x(1,1)`` / ``o(1,1)``), else its ``action_text(a)``."""
    by_state = getattr(game, "state_action_text", None)
    return by_state(state, action) if by_state is not None else game.action_text(action)


def sample_chance(game: Game, state: Any, rng: random.Random) -> int:
    """One chance outcome, drawn with the game's probabilities (the ONE way chance is sampled)."""
    outcomes = game.chance_outcomes(state)
    return rng.choices([a for a, _ in outcomes], weights=[p for _, p in outcomes], k=1)[0]


def resolve_chance(game: Game, state: Any, rng: random.Random) -> Any:
    """Sample chance outcomes until a player (or the end) is to move."""
    while game.current_player(state) == CHANCE:
        state = game.apply(state, sample_chance(game, state, rng))
    return state


def forfeit_returns(offender: int, stake: float = 1.0) -> list[float]:
    """Zero-sum result of an illegal move: the largest loss for its author (``stake``, the
    game's ``max_utility``), the largest win for the other.

    The largest, not -1: in Kuhn poker folding also costs 1 chip, so a forfeit of -1 made
    "answer anything" as good as folding, and self-play drifted to 10% illegal answers
    whenever folding was right (measured). No legal line may be worse than a forfeit."""
    r = [stake, stake]
    r[offender] = -stake
    return r


def random_playout(game: Game, seed: int = 0, state: Any = None) -> list[Any]:
    """States of one uniformly random game (chance sampled), root to terminal."""
    rng = random.Random(seed)
    state = game.new_initial_state() if state is None else state
    states = [state]
    while not game.is_terminal(state):
        if game.current_player(state) == CHANCE:
            a = sample_chance(game, state, rng)
        else:
            a = rng.choice(game.legal_actions(state))
        state = game.apply(state, a)
        states.append(state)
    return states


def random_legal_reset(game: Game, rng: random.Random, max_plies: int) -> Any:
    """A start state after a random number (0..max_plies) of random legal moves.

    Used by self-play (SPIRAL / search-free PPO) so that every position gets visited.
    Never returns a terminal state: it stops one ply early instead.
    """
    state = resolve_chance(game, game.new_initial_state(), rng)
    for _ in range(rng.randint(0, max_plies)):
        nxt = game.apply(state, rng.choice(game.legal_actions(state)))
        nxt = resolve_chance(game, nxt, rng)
        if game.is_terminal(nxt):
            break
        state = nxt
    return state


def all_states(game: Game) -> list[Any]:
    """Every reachable state (deduplicated; deterministic order) of a small game."""
    root = game.new_initial_state()
    seen = {root: None}
    stack = [root]
    while stack:
        s = stack.pop()
        if game.is_terminal(s):
            continue
        if game.current_player(s) == CHANCE:
            children = [game.apply(s, a) for a, _ in game.chance_outcomes(s)]
        else:
            children = [game.apply(s, a) for a in game.legal_actions(s)]
        for c in children:
            if c not in seen:
                seen[c] = None
                stack.append(c)
    return list(seen)

