"""The one answer format: parsing never raises, and every move round-trips."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmselfplay.games import Invalid, make
from lmselfplay.games.base import random_playout
from lmselfplay.games.text import ANSWER_INSTRUCTION, format_answer

GAMES = ["nim", "nim_misere", "tictactoe", "kuhn_poker"]


def _decision_states(name, n=30):
    game = make(name)
    out = []
    for seed in range(n):
        out += [s for s in random_playout(game, seed) if game.current_player(s) >= 0]
    return game, out


@pytest.mark.parametrize("name", GAMES)
def test_every_legal_move_round_trips(name):
    game, states = _decision_states(name)
    for s in states:
        for a in game.legal_actions(s):
            assert game.parse_action(s, format_answer(game.action_text(a))) == a
            prose = f"I think about it.\nMaybe <move>x</move>? No: {format_answer(game.action_text(a))}"
            assert game.parse_action(s, prose) == a  # the last <move> counts


@pytest.mark.parametrize("name", GAMES)
def test_observation_lists_legal_moves_and_format(name):
    game, states = _decision_states(name, 5)
    for s in states:
        text = game.observation_text(s, game.current_player(s))
        assert ANSWER_INSTRUCTION in text
        legal_line = [line for line in text.splitlines() if line.startswith("Legal moves:")][0]
        assert legal_line.split(":", 1)[1].split() == [game.action_text(a) for a in game.legal_actions(s)]


@pytest.mark.parametrize("name", GAMES)
@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=300), st.binary(max_size=100).map(lambda b: b.decode("latin-1")),
                      st.text(max_size=50).map(lambda t: f"<move>{t}</move>"),
                      st.text(max_size=20).map(lambda t: f"<move>{t}")))
def test_parser_never_raises(name, text):
    game, states = _CACHE.setdefault(name, _decision_states(name, 3))
    for s in states[:4]:
        result = game.parse_action(s, text)
        assert isinstance(result, Invalid) or result in game.legal_actions(s)


_CACHE: dict = {}


def test_parser_hostile_inputs():
    game = make("tictactoe")
    s = game.new_initial_state()
    for bad in ["", None, 5, b"<move>1</move>", "<move></move>", "<move>10</move>", "<move>x" * 10**5,
                "</move><move>", "<move>" + "1" * 10**6 + "</move>", "<move>５</move>", "\x00<move>\x00"]:
        assert isinstance(game.parse_action(s, bad), Invalid)
    s2 = game.apply(s, 4)
    assert isinstance(game.parse_action(s2, "<move>5</move>"), Invalid)  # occupied
    assert game.parse_action(s2, "<MOVE>1</MOVE> <move> 1 </move>") == 0
    kuhn = make("kuhn_poker")
    ks = kuhn.new_initial_state(seed=0)
    assert kuhn.parse_action(ks, "<move>BET</move>") == 1
    assert isinstance(kuhn.parse_action(kuhn.new_initial_state(), "<move>bet</move>"), Invalid)
    reason = game.parse_action(s2, "<move>5</move>").reason
    assert "not a legal move" in reason
