"""CFR / CFR+ against OpenSpiel (same algorithm, same numbers) and against Kuhn's
closed-form equilibrium family."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyspiel
import pytest
from open_spiel.python import policy as os_policy
from open_spiel.python.algorithms import cfr as os_cfr

from lmselfplay.game_theory.cfr import CFRPlusSolver, CFRSolver
from lmselfplay.game_theory.matrix_games import BIASED_RPS
from lmselfplay.games.base import TERMINAL
from lmselfplay.games.exploitability import nash_conv, policy_value
from lmselfplay.games.kuhn_poker import KuhnPoker

OS_KUHN = pyspiel.load_game("kuhn_poker")


def ours_key(openspiel_key: str) -> str:
    """OpenSpiel "0pb" (card index + betting) -> ours "J:pb"."""
    return "JQK"[int(openspiel_key[0])] + ":" + openspiel_key[1:]


def to_openspiel(ours: dict[str, np.ndarray]) -> os_policy.TabularPolicy:
    tab = os_policy.TabularPolicy(OS_KUHN)
    for key, row in tab.state_lookup.items():
        tab.action_probability_array[row] = ours[ours_key(key)]
    return tab


def pyspiel_nash_conv(ours: dict[str, np.ndarray]) -> float:
    return pyspiel.nash_conv(OS_KUHN, os_policy.python_policy_to_pyspiel_policy(to_openspiel(ours)))


def max_policy_gap(theirs: os_policy.TabularPolicy, ours: dict[str, np.ndarray]) -> float:
    return max(float(np.abs(theirs.action_probability_array[i] - ours[ours_key(k)]).max())
               for k, i in theirs.state_lookup.items())


@pytest.mark.parametrize("ours_cls, theirs", [
    (CFRSolver, lambda g: os_cfr.CFRSolver(g)),
    (CFRPlusSolver, lambda g: os_cfr.CFRPlusSolver(g)),
    (lambda g: CFRSolver(g, alternating_updates=False),
     lambda g: os_cfr._CFRSolver(g, alternating_updates=False, linear_averaging=False,
                                 regret_matching_plus=False)),
])
def test_same_iterates_as_openspiel_python_solver(ours_cls, theirs):
    ours, ref = ours_cls(KuhnPoker()), theirs(OS_KUHN)
    for it in range(1, 61):
        ours.evaluate_and_update_policy()
        ref.evaluate_and_update_policy()
        if it in (1, 2, 7, 60):
            assert max_policy_gap(ref.current_policy(), ours.current_policy()) < 1e-12
            assert max_policy_gap(ref.average_policy(), ours.average_policy()) < 1e-12


@pytest.mark.parametrize("solver, iterations", [(CFRSolver, 2500), (CFRPlusSolver, 400)])
def test_nash_conv_matches_pyspiel_and_falls_below_1e3(solver, iterations):
    s = solver(KuhnPoker())
    s.run(10)
    early = s.average_policy()
    assert nash_conv(KuhnPoker(), early) == pytest.approx(pyspiel_nash_conv(early), abs=1e-12)
    assert s.nash_conv() > 1e-2  # not converged after 10 iterations
    s.run(iterations - 10)
    avg = s.average_policy()
    ours, theirs = s.nash_conv(), pyspiel_nash_conv(avg)
    assert ours == pytest.approx(theirs, abs=1e-12)
    assert ours < 1e-3 and theirs < 1e-3
    assert s.exploitability() == pytest.approx(ours / 2)


def test_cfr_plus_reaches_kuhns_equilibrium_family():
    """Kuhn (1950): player 1 bets J with alpha in [0, 1/3], bets K with 3 alpha, and with
    Q calls a bet after passing with alpha + 1/3; game value -1/18 for player 1."""
    avg = CFRPlusSolver(KuhnPoker()).run(1500).average_policy()
    alpha = avg["J:"][1]
    assert 0.0 <= alpha <= 1 / 3 + 1e-3
    assert avg["K:"][1] == pytest.approx(3 * alpha, abs=1e-2)
    assert avg["Q:pb"][1] == pytest.approx(alpha + 1 / 3, abs=1e-2)
    assert avg["K:b"][1] == pytest.approx(1.0, abs=1e-4)  # always call with the king
    assert avg["J:b"][0] == pytest.approx(1.0, abs=1e-4)  # always fold the jack
    assert policy_value(KuhnPoker(), avg)[0] == pytest.approx(-1 / 18, abs=1e-4)


@dataclass(frozen=True)
class _RPSState:
    moves: tuple[int, ...] = ()


class HiddenBiasedRPS:
    """Biased RPS as an extensive-form game: player 1 moves without seeing player 0's
    move. ``n_actions`` = 4 with action 3 never legal, to exercise the legal mask."""

    name = "hidden_biased_rps"
    n_actions = 4
    perfect_information = False

    def new_initial_state(self, seed=None):
        return _RPSState()

    def is_terminal(self, s):
        return len(s.moves) == 2

    def current_player(self, s):
        return TERMINAL if self.is_terminal(s) else len(s.moves)

    def legal_actions(self, s):
        return [] if self.is_terminal(s) else [0, 1, 2]

    def chance_outcomes(self, s):
        return []

    def apply(self, s, a):
        return _RPSState(s.moves + (a,))

    def returns(self, s):
        u = float(BIASED_RPS[s.moves[0], s.moves[1]])
        return [u, -u]

    def information_state(self, s, player):
        return f"p{player}"


def test_cfr_on_a_matrix_game_with_an_illegal_action():
    s = CFRPlusSolver(HiddenBiasedRPS()).run(2000)
    avg = s.average_policy()
    for key in ("p0", "p1"):
        assert avg[key][3] == 0.0
        np.testing.assert_allclose(avg[key][:3], [0.25, 0.5, 0.25], atol=5e-3)
    assert s.nash_conv() < 1e-2


def test_rejects_game_without_information_states():
    from lmselfplay.games.tictactoe import TicTacToe

    with pytest.raises(TypeError, match="information_state"):
        CFRSolver(TicTacToe())
