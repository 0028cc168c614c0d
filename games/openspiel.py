"""OpenSpiel's games as games of this project: ``openspiel:<name>`` in OpenSpiel's own parameter
syntax (``openspiel:leduc_poker``, ``openspiel:liars_dice(numdice=1)``, ``openspiel:connect_four``).

Every two-player, sequential, zero-sum (or constant-sum) OpenSpiel game with explicit chance
outcomes loads; anything else is refused by :func:`refusal` in one line that says why.

* A state is the OpenSpiel history (the action ids from the root) with a key for equality: the
  history itself where there is chance or hidden information, the player to move and OpenSpiel's
  state string in a perfect-information game without chance (transpositions are one position, as
  in this project's own tic-tac-toe; a game whose state string leaves out part of its state, such
  as a repetition count, merges positions that differ only there, which matters only to the
  walks of the exact metrics). The OpenSpiel state of a history is cached.
* The acting player reads its own information-state string (its observation string in a
  perfect-information game, or where the game has no information-state string): hidden
  information stays hidden. Moves are OpenSpiel's action strings at the position
  (:meth:`OpenSpielGame.state_action_text`), answered and parsed by the ONE text protocol.
* Returns are OpenSpiel's, minus their mean in a constant-sum game (zero-sum either way).
* What can be measured exactly (``exact_metric``) follows the size of the game (a walk of at most
  :data:`MAX_NODES` histories and :data:`MAX_SIZING_S` seconds): an imperfect-
  information game with at most :data:`MAX_INFOSETS` information states and :data:`MAX_NODES`
  histories gets its exact exploitability, computed by OpenSpiel's own
  ``open_spiel.python.algorithms.exploitability`` on a ``TabularPolicy`` (:meth:`exact_exploitability`);
  a perfect-information game without chance and at most :data:`MAX_POSITIONS` positions gets
  optimal-move rates (this project's minimax); any other game win rates only, against OpenSpiel's
  MCTS bot (IS-MCTS where information is hidden) at the budgets of ``mcts_budgets``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmselfplay.games.base import CHANCE, EXPLOITABILITY, OPTIMAL_MOVES, WIN_RATES, Invalid
from lmselfplay.games.bots import BotPlayer
from lmselfplay.games.text import parse_named_move, prompt

PREFIX = "openspiel:"
MAX_NODES = 100_000  # histories walked to size a game (and the most an exact metric walks)
MAX_SIZING_S = 10.0  # a game whose sizing walk takes longer is not small (OpenSpiel's Python games are slow)
MAX_INFOSETS = 5_000  # information states an exploitability readout scores (Leduc: 936)
MAX_POSITIONS = 20_000  # positions an optimal-move readout scores (tic-tac-toe: 4,520)
MCTS_BUDGETS = (16, 128)  # simulations per move of the reference MCTS bots
CACHE_LIMIT = 200_000  # cached OpenSpiel states before the cache is emptied


def pyspiel_module() -> Any:
    try:
        import pyspiel
    except ImportError:
        raise ValueError("openspiel: games need OpenSpiel: pip install 'lmselfplay[openspiel]'") from None
    return pyspiel


def load(spec: str) -> Any:
    """OpenSpiel's game of ``spec`` (``name`` or ``name(key=value,...)``, its Python games included);
    ValueError when unknown."""
    pyspiel = pyspiel_module()
    try:
        import open_spiel.python.games  # noqa: F401  (registers python_kuhn_poker, ...)
    except ImportError:
        pass
    try:
        return pyspiel.load_game(spec)
    except pyspiel.SpielError as e:
        raise ValueError(f"openspiel:{spec}: {_last_line(e)}") from None


def refusal(game: Any) -> str | None:
    """Why this project cannot play OpenSpiel's ``game``, in one line; None when it can."""
    pyspiel = pyspiel_module()
    t = game.get_type()
    if t.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        return "simultaneous moves (the project's games take turns)"
    if game.num_players() != 2:
        return f"{game.num_players()} players (the project's games have two)"
    if t.utility not in (pyspiel.GameType.Utility.ZERO_SUM, pyspiel.GameType.Utility.CONSTANT_SUM):
        return f"not zero-sum ({t.utility.name.lower().replace('_', '-')}): a forfeit has no zero-sum price"
    if t.chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC:
        return "sampled chance: its chance outcomes are not listed"
    if not (t.provides_information_state_string or t.provides_observation_string):
        return "no string observations: a player has no text to read"
    return _action_name_clash(game)


def _action_name_clash(game: Any, plies: int = 60) -> str | None:
    """Two legal actions with one name, at the root or along a random game (no answer could choose)."""
    rng = random.Random(0)
    state = game.new_initial_state()
    for _ in range(plies):
        if state.is_terminal():
            return None
        if state.is_chance_node():
            actions, probs = zip(*state.chance_outcomes())
            state.apply_action(rng.choices(actions, weights=probs)[0])
            continue
        legal = state.legal_actions()
        names = {state.action_to_string(state.current_player(), a).strip().casefold() for a in legal}
        if len(names) < len(legal):
            return "no string actions: two legal moves share one action string"
        state.apply_action(rng.choice(legal))
    return None


@dataclass(frozen=True)
class OpenSpielState:
    """A position: its history of OpenSpiel action ids; equal and hashed by ``key``."""

    key: Any
    history: tuple[int, ...] = field(compare=False)


def _size(game: Any, keyed: Any, limit: int = MAX_NODES, seconds: float = MAX_SIZING_S
          ) -> tuple[int, int, int] | None:
    """(histories, distinct positions by ``keyed``, information states) of the whole tree, or None
    beyond ``limit`` histories or ``seconds``."""
    seen, infosets, nodes = set(), set(), 0
    stack = [game.new_initial_state()]
    deadline = time.monotonic() + seconds
    while stack:
        s = stack.pop()
        nodes += 1
        if nodes > limit or (nodes % 100 == 0 and time.monotonic() > deadline):
            return None
        if s.is_terminal():
            continue
        if not s.is_chance_node():
            k = keyed(s)
            if k in seen:
                continue
            seen.add(k)
            if game.get_type().provides_information_state_string:
                infosets.add(s.information_state_string())
        actions = [a for a, _ in s.chance_outcomes()] if s.is_chance_node() else s.legal_actions()
        try:
            stack.extend(s.child(a) for a in actions)
        except pyspiel_module().SpielError:  # OpenSpiel stops a history at its maximum length (oware)
            return None
    return nodes, len(seen), len(infosets)


_SIZES: dict[str, tuple[int, int, int] | None] = {}


class OpenSpielGame:
    """An OpenSpiel game behind the project's Game protocol (see the module docstring)."""

    def __init__(self, spec: str, mcts_budgets: str | tuple[int, ...] = MCTS_BUDGETS):
        self.spec = spec.strip()
        self.game = load(self.spec)
        why = refusal(self.game)
        if why:
            raise ValueError(f"openspiel:{self.spec} cannot be played: {why}")
        pyspiel = pyspiel_module()
        t = self.game.get_type()
        self.name = PREFIX + self.spec
        self.title = t.long_name
        self.n_actions = self.game.num_distinct_actions()
        self.perfect_information = t.information == pyspiel.GameType.Information.PERFECT_INFORMATION
        self._deterministic = t.chance_mode == pyspiel.GameType.ChanceMode.DETERMINISTIC
        self._constant = 0.0
        if t.utility == pyspiel.GameType.Utility.CONSTANT_SUM:
            self._constant = self.game.utility_sum() / 2
        self.max_utility = max(abs(self.game.min_utility() - self._constant),
                               abs(self.game.max_utility() - self._constant))
        self._infostate_text = t.provides_information_state_string
        self._observation_text = t.provides_observation_string
        self.mcts_budgets = _budgets(mcts_budgets)
        self._states: dict[tuple[int, ...], Any] = {(): self.game.new_initial_state()}
        self.exact_metric = self._exact_metric()
        self._minimax = None

    # --- sizing -----------------------------------------------------------------------
    def _merges_transpositions(self) -> bool:
        return self.perfect_information and self._deterministic

    def _key(self, s: Any) -> Any:
        if self._merges_transpositions():
            return (s.current_player(), str(s))
        return tuple(s.history())

    def _exact_metric(self) -> str:
        if self.spec not in _SIZES:
            _SIZES[self.spec] = _size(self.game, self._key)
        size = _SIZES[self.spec]
        if size is None:
            return WIN_RATES
        _, positions, infosets = size
        if self._merges_transpositions() and positions <= MAX_POSITIONS:
            return OPTIMAL_MOVES
        if not self.perfect_information and self._infostate_text and infosets <= MAX_INFOSETS:
            return EXPLOITABILITY
        return WIN_RATES

    # --- the OpenSpiel state behind a position ---------------------------------------
    def spiel_state(self, s: OpenSpielState) -> Any:
        """OpenSpiel's state at ``s`` (cached; do not modify it: ``.clone()`` first)."""
        st = self._states.get(s.history)
        if st is None:
            if len(self._states) > CACHE_LIMIT:
                self._states = {(): self._states[()]}
            st = self.game.new_initial_state()
            for a in s.history:
                st.apply_action(a)
            self._states[s.history] = st
        return st

    def _wrap(self, st: Any) -> OpenSpielState:
        h = tuple(st.history())
        self._states.setdefault(h, st)
        return OpenSpielState(self._key(st), h)

    # --- the Game protocol --------------------------------------------------------------
    def new_initial_state(self, seed: int | None = None) -> OpenSpielState:
        s = self._wrap(self._states[()])
        if seed is not None:
            rng = random.Random(seed)
            while self.current_player(s) == CHANCE:
                outcomes = self.chance_outcomes(s)
                s = self.apply(s, rng.choices([a for a, _ in outcomes], weights=[p for _, p in outcomes])[0])
        return s

    def current_player(self, s: OpenSpielState) -> int:
        return int(self.spiel_state(s).current_player())  # OpenSpiel's chance -1 / terminal -4

    def is_terminal(self, s: OpenSpielState) -> bool:
        return self.spiel_state(s).is_terminal()

    def chance_outcomes(self, s: OpenSpielState) -> list[tuple[int, float]]:
        st = self.spiel_state(s)
        return [(int(a), float(p)) for a, p in st.chance_outcomes()] if st.is_chance_node() else []

    def legal_actions(self, s: OpenSpielState) -> list[int]:
        st = self.spiel_state(s)
        if st.is_chance_node():
            return [a for a, _ in self.chance_outcomes(s)]
        return [] if st.is_terminal() else [int(a) for a in st.legal_actions()]

    def apply(self, s: OpenSpielState, a: int) -> OpenSpielState:
        if a not in self.legal_actions(s):
            raise ValueError(f"illegal action {a} in {self.name} after history {list(s.history)}")
        child = self._states.get(s.history + (a,))
        if child is None:
            child = self.spiel_state(s).child(a)
        return self._wrap(child)

    def returns(self, s: OpenSpielState) -> list[float]:
        st = self.spiel_state(s)
        if not st.is_terminal():
            return [0.0, 0.0]
        return [float(r) - self._constant for r in st.returns()]

    # --- text ---------------------------------------------------------------------------
    def information_state(self, s: OpenSpielState, player: int) -> str:
        """OpenSpiel's information-state string (its observation string where it has none; in a
        perfect-information game the position itself)."""
        st = self.spiel_state(s)
        if self._infostate_text:
            return st.information_state_string(player)
        return st.observation_string(player)

    def view_text(self, s: OpenSpielState, player: int) -> str:
        """What ``player`` reads: the observation string in a perfect-information game (the board),
        else its information state."""
        if self.perfect_information and self._observation_text:
            return self.spiel_state(s).observation_string(player)
        return self.information_state(s, player)

    def state_action_text(self, s: OpenSpielState, a: int) -> str:
        """OpenSpiel's action string of ``a`` for the player to move at ``s``."""
        st = self.spiel_state(s)
        return st.action_to_string(st.current_player(), a).strip()

    def action_text(self, a: int) -> str:
        """The name of ``a`` at the root, for player 0 (names may depend on the position and the
        player: :meth:`state_action_text` is the name at a position)."""
        return self.game.new_initial_state().action_to_string(0, a).strip()

    def observation_text(self, s: OpenSpielState, player: int) -> str:
        rules = "OpenSpiel's rules."
        lines = [f"You are player {player + 1}.", *self.view_text(s, player).strip().splitlines()]
        legal = [self.state_action_text(s, a) for a in self.legal_actions(s)] \
            if self.current_player(s) == player else None
        return prompt(self.name, rules, lines, legal)

    def parse_action(self, s: OpenSpielState, text: str) -> int | Invalid:
        if self.current_player(s) < 0:
            return Invalid("no player is to move")
        return parse_named_move(text, {self.state_action_text(s, a).casefold(): a for a in self.legal_actions(s)})

    def render(self, s: OpenSpielState) -> str:
        return str(self.spiel_state(s))

    # --- what can be measured exactly ---------------------------------------------------
    def optimal_actions(self, s: OpenSpielState) -> list[int]:
        """Optimal moves by this project's minimax (a perfect-information game without chance)."""
        if self.exact_metric != OPTIMAL_MOVES:
            raise ValueError(f"{self.name} has no exact solver here (exact_metric {self.exact_metric!r})")
        if self._minimax is None:
            from lmselfplay.games.solve import Minimax

            self._minimax = Minimax(self)
        return self._minimax.optimal_actions(s)

    def tabular_policy(self, policy: dict[str, Any]) -> Any:
        """OpenSpiel's ``TabularPolicy`` holding ``policy`` (information state -> probabilities over
        ``n_actions`` or ``{action: prob}``), normalized over the legal actions; an information
        state it lacks, or one with no positive legal mass, plays uniformly."""
        from open_spiel.python.policy import TabularPolicy

        tab = TabularPolicy(self.game)
        for key, row in tab.state_lookup.items():
            legal = tab.legal_actions_mask[row].astype(bool)
            raw = policy.get(key)
            if raw is None:
                continue
            if isinstance(raw, dict):
                p = np.array([float(raw.get(a, 0.0)) for a in range(self.n_actions)])
            else:
                p = np.asarray(raw, dtype=float)[: self.n_actions]
            p = np.where(legal, p, 0.0)
            total = p.sum()
            tab.action_probability_array[row] = p / total if np.isfinite(total) and total > 0 \
                else legal / legal.sum()
        return tab

    def exact_exploitability(self, policy: dict[str, Any]) -> float:
        """NashConv / 2 of ``policy`` (both seats), by OpenSpiel's own ``exploitability``."""
        from open_spiel.python.algorithms.exploitability import exploitability

        return float(exploitability(self.game, self.tabular_policy(policy)))

    def reference_opponents(self) -> dict[str, BotPlayer]:
        """OpenSpiel's MCTS bots (IS-MCTS where information is hidden) at ``mcts_budgets``: the
        opponents of a game with no exact metric. None for a hidden-information game whose states
        cannot be resampled from an information state (IS-MCTS needs it; plain MCTS would read the
        hidden cards): it is measured against the random bot only."""
        if self.exact_metric != WIN_RATES or not (self.perfect_information or _resamples(self.game)):
            return {}
        return {f"mcts{n}": BotPlayer(_mcts_act(n, not self.perfect_information), f"mcts{n}")
                for n in self.mcts_budgets}


def _resamples(game: Any) -> bool:
    """Whether OpenSpiel resamples this game's histories from an information state (IS-MCTS)."""
    pyspiel = pyspiel_module()
    state = game.new_initial_state()
    while state.is_chance_node():
        state.apply_action(state.chance_outcomes()[0][0])
    if state.is_terminal():
        return False
    try:
        state.resample_from_infostate(state.current_player(), pyspiel.UniformProbabilitySampler(0.0, 1.0))
    except pyspiel.SpielError:
        return False
    return True


def _budgets(value: str | tuple[int, ...]) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in (value.split(",") if isinstance(value, str) else value))
    except ValueError:
        raise ValueError(f"mcts_budgets must be comma-separated integers, got {value!r}") from None
    if not out or min(out) < 1:
        raise ValueError(f"mcts_budgets must be >= 1, got {value!r}")
    return out


def _mcts_act(budget: int, hidden: bool) -> Any:
    """A bot's move function: OpenSpiel's MCTS (or IS-MCTS) with random rollouts, ``budget``
    simulations, seeded from the episode's ``rng``."""
    def act(game: OpenSpielGame, s: OpenSpielState, rng: random.Random) -> int:
        from open_spiel.python.algorithms import ismcts, mcts

        np_rng = np.random.RandomState(rng.randrange(2**31))
        evaluator = mcts.RandomRolloutEvaluator(1, np_rng)
        if hidden:
            bot = ismcts.ISMCTSBot(game.game, evaluator, uct_c=2.0, max_simulations=budget, random_state=np_rng)
        else:
            bot = mcts.MCTSBot(game.game, 2.0, budget, evaluator, random_state=np_rng)
        return int(bot.step(game.spiel_state(s).clone()))

    return act


def make(spec: str, **params: Any) -> OpenSpielGame:
    """The registry's factory for ``openspiel:<spec>``."""
    return OpenSpielGame(spec, **params)


def registry_rows() -> list[tuple[str, str]]:
    """``(name, "loads" | "refused: why")`` for every game of OpenSpiel's registry with its default
    parameters: what the docs table of :mod:`lmselfplay.games.openspiel` lists."""
    pyspiel = pyspiel_module()
    try:  # OpenSpiel's Python games join the registry when this package is imported: always list them
        import open_spiel.python.games  # noqa: F401
    except ImportError:
        pass
    rows = []
    for name in sorted(pyspiel.registered_names()):
        try:
            game = pyspiel.load_game(name)
        except Exception as e:  # OpenSpiel's own failure (SpielError, or a C++ IndexError): reported
            rows.append((name, f"refused: does not load with default parameters ({_last_line(e)})"))
            continue
        why = refusal(game)
        rows.append((name, f"refused: {why}" if why else "loads"))
    return rows


def _last_line(error: Exception) -> str:
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return lines[-1].split("/open_spiel/")[-1].strip()


def registry_table() -> str:
    """The docs table: every OpenSpiel registry game and whether ``openspiel:<name>`` plays it."""
    from importlib.metadata import version

    lines = [f"| OpenSpiel {version('open_spiel')} game | `openspiel:<name>` |", "|---|---|"]
    lines += [f"| `{name}` | {status} |" for name, status in registry_rows()]
    return "\n".join(lines)
