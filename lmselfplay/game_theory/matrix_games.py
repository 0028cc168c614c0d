"""Two-player zero-sum matrix games: exploitability, and three learning dynamics.

``U`` of shape (m1, m2) is the row player's payoff; the column player gets ``-U``.
Every best response breaks ties towards the lowest action index (``np.argmax`` /
``np.argmin``), so the dynamics are deterministic and their trajectories can be tested
value by value.

* iterated best response (``best_response_dynamics``): the *last* strategy of each player
  is its pure best response to the other's previous strategy — cycles in RPS;
* fictitious play: best response to the *average* of the opponent's past actions;
* regret matching: play in proportion to positive cumulative regret (Hart & Mas-Colell
  2000); the average external regrets bound the exploitability of the average strategies,
  exactly: ``matrix_exploitability(U, mu_bar, nu_bar) = Reg^mu + Reg^nu``.

``solve_zero_sum`` solves the game by linear programming; PSRO's Nash meta-solver
(:mod:`lmselfplay.game_theory.psro`) uses it.
"""

from __future__ import annotations

import numpy as np

ROCK, PAPER, SCISSORS = 0, 1, 2

#: Rock-paper-scissors, row player's payoff; actions rock, paper, scissors.
RPS = np.array([[0.0, -1.0, 1.0],
                [1.0, 0.0, -1.0],
                [-1.0, 1.0, 0.0]])

#: RPS where rock's win over scissors pays 2; unique equilibrium (1/4, 1/2, 1/4).
BIASED_RPS = np.array([[0.0, -1.0, 2.0],
                       [1.0, 0.0, -1.0],
                       [-2.0, 1.0, 0.0]])


def _payoff(U) -> np.ndarray:
    U = np.asarray(U, dtype=float)
    if U.ndim != 2 or U.size == 0 or not np.all(np.isfinite(U)):
        raise ValueError(f"payoff must be a finite non-empty 2-D matrix, got shape {U.shape}")
    return U


def _rounds(T: int) -> int:
    if int(T) != T or T < 1:
        raise ValueError(f"T must be a positive integer, got {T!r}")
    return int(T)


def matrix_exploitability(U, mu, nu):
    """``max_i (U nu)_i - min_j (mu^T U)_j``: the sum of both players' best-response gains.

    ``mu``/``nu`` may carry leading batch dimensions (e.g. one row per round); the result
    then has those dimensions. 0 exactly at a Nash equilibrium; 2 for rock vs rock.
    """
    U = _payoff(U)
    mu, nu = np.asarray(mu, dtype=float), np.asarray(nu, dtype=float)
    out = np.max(nu @ U.T, axis=-1) - np.min(mu @ U, axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def best_response_dynamics(U, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Iterated (simultaneous) pure best response.

    Round 1: both play action 0. Each of the next T-1 rounds: both switch at once to a
    pure best response to the other's previous strategy. Returns every round's
    strategies, shapes (T, m1) and (T, m2) (one-hot rows).
    """
    U, T = _payoff(U), _rounds(T)
    m1, m2 = U.shape
    a = np.zeros(T, dtype=int)
    b = np.zeros(T, dtype=int)
    for t in range(1, T):
        a[t] = int(np.argmax(U[:, b[t - 1]]))
        b[t] = int(np.argmin(U[a[t - 1], :]))
    return np.eye(m1)[a], np.eye(m2)[b]


def fictitious_play_rounds(U, T: int) -> tuple[np.ndarray, np.ndarray]:
    """The pure action of each round of fictitious play, one-hot, shapes (T, m1), (T, m2)."""
    U, T = _payoff(U), _rounds(T)
    m1, m2 = U.shape
    a = np.zeros(T, dtype=int)
    b = np.zeros(T, dtype=int)
    count_a, count_b = np.zeros(m1), np.zeros(m2)
    count_a[0] += 1
    count_b[0] += 1
    for t in range(1, T):
        # best responses to the opponent's empirical counts (same argmax as to the average)
        a[t] = int(np.argmax(U @ count_b))
        b[t] = int(np.argmin(count_a @ U))
        count_a[a[t]] += 1
        count_b[b[t]] += 1
    return np.eye(m1)[a], np.eye(m2)[b]


def fictitious_play(U, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Fictitious play (Brown 1951), simultaneous; returns the average strategies over T
    rounds. Round 1: both play action 0; then each plays a pure best response to the
    average of the opponent's past actions."""
    mus, nus = fictitious_play_rounds(U, T)
    return mus.mean(0), nus.mean(0)


def regret_matching_rounds(U, T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-round strategies of regret matching and the final cumulative regret vectors.

    Round 1: both play action 0 (pure). After each round each player adds its
    instantaneous regret, computed with expected payoffs against the opponent's mixed
    strategy (row: ``(U nu_t)_i - mu_t^T U nu_t``; column: ``-(mu_t^T U)_j + mu_t^T U
    nu_t``), then plays its positive cumulative regrets normalized, or uniform if none is
    positive. Returns ``(mus (T, m1), nus (T, m2), R_mu (m1,), R_nu (m2,))``.
    """
    U, T = _payoff(U), _rounds(T)
    m1, m2 = U.shape
    mus, nus = np.zeros((T, m1)), np.zeros((T, m2))
    mu, nu = np.eye(m1)[0], np.eye(m2)[0]
    R_mu, R_nu = np.zeros(m1), np.zeros(m2)
    for t in range(T):
        mus[t], nus[t] = mu, nu
        row_values = U @ nu  # payoff of each row action against nu
        col_values = mu @ U  # row's payoff for each column action
        value = float(mu @ row_values)
        R_mu += row_values - value
        R_nu += value - col_values
        mu, nu = _regret_matching_strategy(R_mu), _regret_matching_strategy(R_nu)
    return mus, nus, R_mu, R_nu


def _regret_matching_strategy(regret: np.ndarray) -> np.ndarray:
    pos = np.maximum(regret, 0.0)
    total = pos.sum()
    return pos / total if total > 0 else np.full(len(regret), 1.0 / len(regret))


def regret_matching(U, T: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Regret matching for both players (see :func:`regret_matching_rounds`).

    Returns ``(mu_bar, nu_bar, reg_mu, reg_nu)``: the average strategies over T rounds
    and the two average external regrets ``max_a R_T(a) / T`` (may be negative).
    """
    mus, nus, R_mu, R_nu = regret_matching_rounds(U, T)
    T = len(mus)
    return mus.mean(0), nus.mean(0), float(R_mu.max() / T), float(R_nu.max() / T)


def running_average(strategies: np.ndarray) -> np.ndarray:
    """Row t = average of rounds 1..t+1."""
    return np.cumsum(strategies, axis=0) / np.arange(1, len(strategies) + 1)[:, None]


def solve_zero_sum(U) -> tuple[np.ndarray, np.ndarray, float]:
    """A Nash equilibrium ``(mu, nu, value)`` of the zero-sum game by linear programming.

    Row: maximize v s.t. ``(mu^T U)_j >= v`` for all j, mu in the simplex; the column
    player solves the same problem for ``-U^T``. Constant-sum tables (win rates) work too.
    """
    U = _payoff(U)
    mu, value = _maximin(U)
    nu, _ = _maximin(-U.T)
    return mu, nu, value


def _maximin(U: np.ndarray) -> tuple[np.ndarray, float]:
    from scipy.optimize import linprog

    m1, m2 = U.shape
    # variables x = (mu_1..mu_m1, v); minimize -v
    c = np.zeros(m1 + 1)
    c[-1] = -1.0
    A_ub = np.hstack([-U.T, np.ones((m2, 1))])  # v - (mu^T U)_j <= 0
    b_ub = np.zeros(m2)
    A_eq = np.hstack([np.ones((1, m1)), np.zeros((1, 1))])
    bounds = [(0.0, None)] * m1 + [(None, None)]
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=[1.0], bounds=bounds,
                  method="highs")
    if not res.success:  # cannot happen for a finite matrix; be loud if it does
        raise RuntimeError(f"linear program failed: {res.message}")
    mu = np.clip(res.x[:m1], 0.0, None)
    return mu / mu.sum(), float(res.x[-1])


META_SOLVERS = ("last", "uniform", "nash")


def meta_strategy(payoffs, solver: str = "nash") -> np.ndarray:
    """The row population's mixture for the meta-game ``payoffs[i, j]`` (row member i's
    payoff against column member j; a constant-sum table such as win rates works too):
    ``last`` (iterated best response), ``uniform`` (fictitious play) or ``nash``.

    For a symmetric league pass the square table of each checkpoint against each other.
    For the column population call it with ``-payoffs.T``.
    """
    U = np.asarray(payoffs, dtype=float)
    if U.ndim != 2 or U.size == 0 or not np.all(np.isfinite(U)):
        raise ValueError(f"meta-game payoffs must be a finite non-empty 2-D table, "
                         f"got shape {U.shape}")
    n = U.shape[0]
    if solver == "last":
        return np.eye(n)[n - 1]
    if solver == "uniform":
        return np.full(n, 1.0 / n)
    if solver == "nash":
        mu, _, _ = solve_zero_sum(U)
        return mu
    raise ValueError(f"unknown meta-solver {solver!r}; choose one of {', '.join(META_SOLVERS)}")


def __getattr__(name: str):
    if name == "exploitability":  # games.exploitability.exploitability is the extensive-form one
        raise AttributeError("matrix_games.exploitability is matrix_exploitability(U, mu, nu); "
                             "lmselfplay.games.exploitability.exploitability(game, policy) is the extensive-form one")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
