"""Policy-Space Response Oracles (Lanctot et al. 2017) for two-player zero-sum games.

Each player keeps a population of policies. The meta-game is the table of expected
payoffs of every row member against every column member; a meta-solver turns it into a
mixture over each population; a best-response oracle adds, for each player, a best
response to the other's mixture. The meta-solver decides which classic dynamics PSRO
becomes:

* ``"last"``: all weight on the newest member -> iterated best response;
* ``"uniform"``: the average of the population -> fictitious play;
* ``"nash"``: a Nash equilibrium of the meta-game (linear programming) -> double oracle,
  which stops once no best response gains anything: the mixture is then a Nash
  equilibrium of the full game.

The meta-solvers (:func:`lmselfplay.game_theory.matrix_games.meta_strategy`) are also what the
LLM league uses to weight its checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmselfplay.game_theory.matrix_games import META_SOLVERS, meta_strategy
from lmselfplay.games.base import CHANCE, Game, all_states
from lmselfplay.games.exploitability import BestResponse, action_probs, policy_value


def meta_strategies(payoffs, solver: str = "nash") -> tuple[np.ndarray, np.ndarray]:
    """Row and column mixtures of a two-population meta-game (row player's payoffs)."""
    U = np.asarray(payoffs, dtype=float)
    return meta_strategy(U, solver), meta_strategy(-U.T, solver)


# payoff(row_policy, col_policy) -> row player's expected payoff
PayoffFn = Callable[[Any, Any], float]
# best_response(player, opponent_population, opponent_weights) -> new policy for player
OracleFn = Callable[[int, Sequence[Any], np.ndarray], Any]


@dataclass
class PSROStep:
    iteration: int
    population_sizes: tuple[int, int]
    meta_strategies: tuple[np.ndarray, np.ndarray]
    gains: tuple[float, float]  # best-response value minus meta-strategy value, per player
    converged: bool

    @property
    def nash_conv(self) -> float:
        """Sum of both gains: the exploitability (matrix-game sense) / NashConv of the
        meta-strategy profile in the full game, exact when the oracle is exact."""
        return self.gains[0] + self.gains[1]


@dataclass
class PSRO:
    """Two populations grown by a best-response oracle; see the module docstring.

    ``step()`` solves the meta-game, asks the oracle for both best responses and adds
    them — unless neither gains more than ``tol``, in which case the current meta-strategy
    is already an (``tol``-)equilibrium: the step is marked converged and adds nothing.
    """

    payoff: PayoffFn
    best_response: OracleFn
    initial: tuple[Any, Any]
    meta_solver: str = "nash"
    tol: float = 1e-9
    populations: tuple[list[Any], list[Any]] = field(init=False)
    payoffs: np.ndarray = field(init=False)
    history: list[PSROStep] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.meta_solver not in META_SOLVERS:
            raise ValueError(f"unknown meta-solver {self.meta_solver!r}; "
                             f"choose one of {', '.join(META_SOLVERS)}")
        self.populations = ([self.initial[0]], [self.initial[1]])
        self.payoffs = np.array([[float(self.payoff(self.initial[0], self.initial[1]))]])

    def meta_strategies(self) -> tuple[np.ndarray, np.ndarray]:
        return meta_strategies(self.payoffs, self.meta_solver)

    def step(self) -> PSROStep:
        rows, cols = self.populations
        mu, nu = self.meta_strategies()
        value = float(mu @ self.payoffs @ nu)
        br_row = self.best_response(0, list(cols), nu)
        br_col = self.best_response(1, list(rows), mu)
        # the new entries of the table double as the best responses' values
        new_row = np.array([float(self.payoff(br_row, c)) for c in cols])
        new_col = np.array([float(self.payoff(r, br_col)) for r in rows])
        gains = (float(new_row @ nu) - value, value - float(mu @ new_col))
        converged = max(gains) <= self.tol
        record = PSROStep(len(self.history), (len(rows), len(cols)), (mu, nu), gains, converged)
        self.history.append(record)
        if not converged:
            corner = float(self.payoff(br_row, br_col))
            self.payoffs = np.block([[self.payoffs, new_col[:, None]],
                                     [new_row[None, :], np.array([[corner]])]])
            rows.append(br_row)
            cols.append(br_col)
        return record

    def run(self, max_iterations: int, progress: bool = False) -> PSROStep:
        """Step until converged or ``max_iterations`` steps; returns the last step."""
        steps = range(max_iterations)
        if progress:
            from tqdm.auto import tqdm

            steps = tqdm(steps, desc=f"PSRO ({self.meta_solver})")
        record = None
        for _ in steps:
            record = self.step()
            if record.converged:
                break
        if record is None:
            raise ValueError("max_iterations must be at least 1")
        return record


# --- extensive-form games (Kuhn poker): tabular policies and an exact oracle ---------------

TabularPolicy = dict[str, np.ndarray]


def infostates(game: Game, player: int) -> dict[str, list[int]]:
    """Every information state of ``player`` -> its legal actions."""
    out: dict[str, list[int]] = {}
    for s in all_states(game):
        if not game.is_terminal(s) and game.current_player(s) == player:
            out.setdefault(game.information_state(s, player), list(game.legal_actions(s)))
    return out


def uniform_tabular(game: Game, player: int) -> TabularPolicy:
    out = {}
    for key, legal in infostates(game, player).items():
        p = np.zeros(game.n_actions)
        p[legal] = 1.0 / len(legal)
        out[key] = p
    return out


def mixture_policy(game: Game, policies: Sequence[Any], weights, player: int) -> TabularPolicy:
    """The behaviour policy of ``player`` equivalent to playing ``policies[k]`` with
    probability ``weights[k]`` for the whole game (Kuhn's theorem, perfect recall):
    ``sigma(I) ∝ sum_k w_k pi_k(I) sigma_k(I)`` with ``pi_k(I)`` the player's own reach."""
    w = np.asarray(weights, dtype=float)
    num: dict[str, np.ndarray] = {}
    legal_of: dict[str, list[int]] = {}

    def visit(state: Any, reach: np.ndarray) -> None:
        if game.is_terminal(state):
            return
        p = game.current_player(state)
        if p != player:
            outcomes = game.chance_outcomes(state) if p == CHANCE else \
                [(a, 1.0) for a in game.legal_actions(state)]
            for a, _ in outcomes:
                visit(game.apply(state, a), reach)
            return
        key = game.information_state(state, player)
        probs = np.zeros((len(policies), game.n_actions))
        for k, pol in enumerate(policies):
            for a, q in action_probs(game, pol, state, player).items():
                probs[k, a] = q
        if key not in num:  # own reach is the same at every history of the set
            num[key] = (w * reach) @ probs
            legal_of[key] = list(game.legal_actions(state))
        for a in game.legal_actions(state):
            visit(game.apply(state, a), reach * probs[:, a])

    visit(game.new_initial_state(), np.ones(len(policies)))
    out = {}
    for key, v in num.items():
        if v.sum() > 0:
            out[key] = v / v.sum()
        else:  # unreachable under the mixture: any choice is equivalent
            out[key] = np.zeros(game.n_actions)
            out[key][legal_of[key]] = 1.0 / len(legal_of[key])
    return out


def joint_policy(game: Game, row: Any, col: Any) -> Callable[[Any, int], Any]:
    """One policy callable ``(state, player)`` from a player-0 and a player-1 policy."""
    def policy(state: Any, player: int) -> Any:
        pol = row if player == 0 else col
        return pol(state, player) if callable(pol) else pol[game.information_state(state, player)]
    return policy


def extensive_form_oracles(game: Game) -> tuple[PayoffFn, OracleFn, tuple[TabularPolicy,
                                                                          TabularPolicy]]:
    """``(payoff, exact best-response oracle, uniform initial policies)`` for a
    two-player zero-sum game with information states, ready for :class:`PSRO`."""

    def payoff(row: Any, col: Any) -> float:
        return float(policy_value(game, joint_policy(game, row, col))[0])

    def best_response(player: int, opponents: Sequence[Any], weights: np.ndarray):
        mix = mixture_policy(game, opponents, weights, 1 - player)
        br = BestResponse(game, player, mix).policy()
        return {key: np.eye(game.n_actions)[a] for key, a in br.items()}

    return payoff, best_response, (uniform_tabular(game, 0), uniform_tabular(game, 1))
