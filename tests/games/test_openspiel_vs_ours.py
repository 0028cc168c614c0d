"""Differential tests: ``openspiel:kuhn_poker`` and ``openspiel:tic_tac_toe`` (games/openspiel.py)
against this project's own Kuhn poker and tic-tac-toe: the same legal moves, and the same exact
metrics of the embedded model's policy."""

import random

import pytest

from lmselfplay.games import KuhnPoker, TicTacToe, make
from lmselfplay.games.base import CHANCE
from lmselfplay.games.exploitability import nash_conv
from lmselfplay.games.solve import optimal_actions

pytest.importorskip("pyspiel")


def _step_both(ours, adapter, n, seed):
    rng = random.Random(seed)
    for _ in range(n):
        s, t = ours.new_initial_state(), adapter.new_initial_state()
        while not ours.is_terminal(s):
            assert ours.current_player(s) == adapter.current_player(t)
            if ours.current_player(s) == CHANCE:
                assert ours.chance_outcomes(s) == adapter.chance_outcomes(t)
            assert ours.legal_actions(s) == adapter.legal_actions(t)
            a = rng.choice(ours.legal_actions(s))
            s, t = ours.apply(s, a), adapter.apply(t, a)
        assert adapter.is_terminal(t)
        assert ours.returns(s) == adapter.returns(t)


def test_same_moves_as_our_kuhn_and_tictactoe():
    _step_both(KuhnPoker(), make("openspiel:kuhn_poker"), 500, seed=0)
    _step_both(TicTacToe(), make("openspiel:tic_tac_toe"), 500, seed=1)


def _openspiel_key(ours_key: str) -> str:
    """Our Kuhn information state ``K:pb`` as OpenSpiel's ``2pb``."""
    card, history = ours_key.split(":")
    return str("JQK".index(card)) + history


@pytest.fixture(scope="module")
def embedded():
    from lmselfplay.lm.engines import HFEngine
    from lmselfplay.models.policy import load_policy

    model, tok = load_policy(model_name_or_path=None)
    return HFEngine(model, tok), tok


def test_embedded_models_kuhn_exploitability_is_the_adapters(embedded):
    """The embedded model's Kuhn policy, read on our Kuhn poker: our exploitability (our best
    response) equals the adapter's (OpenSpiel's on a TabularPolicy) to 1e-9."""
    from lmselfplay.eval.game_metrics import policy_exploitability

    engine, tok = embedded
    ours = policy_exploitability(engine, tok, KuhnPoker())
    policy = {_openspiel_key(k): v for k, v in ours["policy"].items()}
    adapter = make("openspiel:kuhn_poker")
    assert len(policy) == 12
    assert adapter.exact_exploitability(policy) == pytest.approx(ours["exploitability"], abs=1e-9)
    assert nash_conv(adapter, policy) / 2 == pytest.approx(ours["exploitability"], abs=1e-9)
    assert ours["exploitability"] > 0.01  # a real, imperfect policy: the comparison can fail


def _adapter_state(adapter, board):
    """The adapter's position with our tic-tac-toe ``board`` (X's and O's cells interleaved)."""
    xs = [i for i, c in enumerate(board) if c == 1]
    os_ = [i for i, c in enumerate(board) if c == 2]
    t = adapter.new_initial_state()
    for k in range(len(xs) + len(os_)):
        t = adapter.apply(t, xs[k // 2] if k % 2 == 0 else os_[k // 2])
    return t


def test_embedded_models_tictactoe_optimal_move_rates_are_the_adapters(embedded):
    """The embedded model's answer distribution over 300 of our positions: the expected optimal-move
    probability and the argmax rate by our solver equal those by the adapter's (minimax over
    OpenSpiel's rules) on the same positions."""
    from lmselfplay.lm.readout import answer_distribution, sampled_decision_states

    engine, tok = embedded
    ours = TicTacToe()
    adapter = make("openspiel:tic_tac_toe")
    states = sampled_decision_states(ours, 300, seed=0)
    dist = answer_distribution(engine, tok, ours, states)
    rates = {}
    for name, opt in [("ours", [set(optimal_actions(ours, s)) for s in states]),
                      ("adapter", [set(adapter.optimal_actions(_adapter_state(adapter, s.board))) for s in states])]:
        rates[name] = (sum(sum(p for a, p in d.items() if a in o) for d, o in zip(dist, opt)) / len(states),
                       sum(max(d, key=d.get) in o for d, o in zip(dist, opt)) / len(states))
    assert rates["ours"] == pytest.approx(rates["adapter"], abs=1e-12)
    assert 0.05 < rates["ours"][0] < 0.99
