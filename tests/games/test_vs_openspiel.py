"""Differential tests: our rules against OpenSpiel's (`pyspiel`) as the oracle."""

import random

import numpy as np
import pytest

from lmselfplay.games import KuhnPoker, TicTacToe
from lmselfplay.games.base import CHANCE
from lmselfplay.games.exploitability import exploitability

pyspiel = pytest.importorskip("pyspiel")


def _playouts(ours, theirs, n, seed):
    """Random playouts stepping both implementations with the same action ids."""
    rng = random.Random(seed)
    for _ in range(n):
        s, t = ours.new_initial_state(), theirs.new_initial_state()
        while True:
            assert ours.is_terminal(s) == t.is_terminal()
            if t.is_terminal():
                assert ours.returns(s) == pytest.approx(t.returns())
                break
            if t.is_chance_node():
                assert ours.current_player(s) == CHANCE
                outcomes = t.chance_outcomes()
                ours_out = sorted(ours.chance_outcomes(s))
                assert [a for a, _ in ours_out] == [a for a, _ in sorted(outcomes)]
                assert [p for _, p in ours_out] == pytest.approx([p for _, p in sorted(outcomes)])
                a = rng.choice([a for a, _ in outcomes])
            else:
                assert ours.current_player(s) == t.current_player()
                assert ours.legal_actions(s) == list(t.legal_actions())
                a = rng.choice(ours.legal_actions(s))
            s = ours.apply(s, a)
            t.apply_action(a)


def test_tictactoe_matches_openspiel():
    _playouts(TicTacToe(), pyspiel.load_game("tic_tac_toe"), 3000, seed=0)


def test_kuhn_matches_openspiel():
    _playouts(KuhnPoker(), pyspiel.load_game("kuhn_poker"), 3000, seed=1)


def _openspiel_infostate_to_ours(key: str) -> str:
    # OpenSpiel: "<card 0..2><history of p/b>", ours: "<J|Q|K>:<history>"
    return "JQK"[int(key[0])] + ":" + key[1:]


@pytest.mark.parametrize("seed", range(5))
def test_kuhn_exploitability_matches_openspiel(seed):
    from open_spiel.python import policy as os_policy
    from open_spiel.python.algorithms import exploitability as os_expl

    game = pyspiel.load_game("kuhn_poker")
    tab = os_policy.TabularPolicy(game)
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet([1.0, 1.0], size=tab.action_probability_array.shape[0])
    if seed == 0:
        probs[:] = 0.5  # the uniform policy: 0.458333...
    tab.action_probability_array[:] = probs
    ours = {_openspiel_infostate_to_ours(k): probs[i] for k, i in tab.state_lookup.items()}
    expected = os_expl.exploitability(game, tab)
    assert exploitability(KuhnPoker(), ours) == pytest.approx(expected, abs=1e-9)
    if seed == 0:
        assert expected == pytest.approx(0.4583333333333333, abs=1e-12)
