"""OpenSpiel games as games of this project (games/openspiel.py), against pyspiel itself."""

import random

import numpy as np
import pytest

from lmselfplay.games import Invalid, is_game_name, make, split_names
from lmselfplay.games.base import (
    CHANCE,
    EXPLOITABILITY,
    OPTIMAL_MOVES,
    WIN_RATES,
    move_text,
    random_playout,
)
from lmselfplay.games.bots import reference_bots
from lmselfplay.games.exploitability import exploitability, nash_conv, uniform_policy
from lmselfplay.games.text import format_answer

pyspiel = pytest.importorskip("pyspiel")


def _same_game(game, spec, n, seed):
    """Random playouts stepping the adapter and pyspiel with the same action ids."""
    rng = random.Random(seed)
    theirs = pyspiel.load_game(spec)
    for _ in range(n):
        s, t = game.new_initial_state(), theirs.new_initial_state()
        while not t.is_terminal():
            assert not game.is_terminal(s)
            if t.is_chance_node():
                assert game.current_player(s) == CHANCE
                assert game.chance_outcomes(s) == [(a, p) for a, p in t.chance_outcomes()]
                a = rng.choice([a for a, _ in t.chance_outcomes()])
            else:
                assert game.current_player(s) == t.current_player()
                assert game.legal_actions(s) == list(t.legal_actions())
                a = rng.choice(game.legal_actions(s))
                assert game.parse_action(s, format_answer(move_text(game, s, a))) == a
            s = game.apply(s, a)
            t.apply_action(a)
        assert game.is_terminal(s)
        assert game.returns(s) == pytest.approx(list(t.returns()))
        assert sum(game.returns(s)) == pytest.approx(0.0)


@pytest.mark.parametrize("spec", ["kuhn_poker", "leduc_poker", "tic_tac_toe", "liars_dice(numdice=1)",
                                  "connect_four"])
def test_adapter_steps_as_openspiel(spec):
    _same_game(make(f"openspiel:{spec}"), spec, 30, seed=0)


def test_names_resolve_in_the_registry():
    game = make("openspiel:liars_dice(numdice=1)")
    assert game.name == "openspiel:liars_dice(numdice=1)"
    assert is_game_name("openspiel:leduc_poker") and is_game_name("nim")
    assert not is_game_name("openspiel:") and not is_game_name("chess")
    assert split_names("nim, openspiel:goofspiel(num_cards=4,players=2),openspiel:leduc_poker") == [
        "nim", "openspiel:goofspiel(num_cards=4,players=2)", "openspiel:leduc_poker"]
    with pytest.raises(ValueError, match="openspiel:no_such_game: .*"):
        make("openspiel:no_such_game")
    with pytest.raises(ValueError, match="mcts_budgets"):
        make("openspiel:connect_four", mcts_budgets="0")
    with pytest.raises(ValueError, match="bad parameters"):
        make("openspiel:kuhn_poker", colour="red")


@pytest.mark.parametrize("spec, why", [
    ("goofspiel", "simultaneous moves"),
    ("kuhn_poker(players=3)", "3 players"),
    ("catch", "1 players"),
    ("trade_comm", "not zero-sum"),
])
def test_refusals_say_why_in_one_line(spec, why):
    with pytest.raises(ValueError) as e:
        make(f"openspiel:{spec}")
    assert why in str(e.value) and "\n" not in str(e.value)


def test_hidden_information_stays_hidden():
    """Leduc: two deals that differ only in the opponent's card read the same to the player."""
    game = make("openspiel:leduc_poker")
    root = game.new_initial_state()
    a = game.apply(game.apply(root, 0), 2)  # player 0 holds card 0, player 1 card 2
    b = game.apply(game.apply(root, 0), 4)  # player 1 holds card 4
    assert game.observation_text(a, 0) == game.observation_text(b, 0)
    assert game.observation_text(a, 1) != game.observation_text(b, 1)
    assert game.information_state(a, 0) == game.spiel_state(a).information_state_string(0)


def test_parse_never_raises_and_names_are_the_players():
    game = make("openspiel:tic_tac_toe")
    s = game.new_initial_state()
    s = game.apply(s, 4)  # X in the centre: O to move
    assert game.parse_action(s, "<move>o(0,0)</move>") == 0
    assert game.parse_action(s, "<move>O(0,0)</move>") == 0
    for junk in ["<move>x(0,0)</move>", "<move>o(1,1)</move>", "", None, 17, "<move></move>", "o(0,0)"]:
        assert isinstance(game.parse_action(s, junk), Invalid)
    end = random_playout(game, seed=1)[-1]
    assert isinstance(game.parse_action(end, "<move>o(0,0)</move>"), Invalid)


def test_exact_metric_follows_the_size():
    assert make("openspiel:kuhn_poker").exact_metric == EXPLOITABILITY
    assert make("openspiel:leduc_poker").exact_metric == EXPLOITABILITY
    assert make("openspiel:tic_tac_toe").exact_metric == OPTIMAL_MOVES
    big = make("openspiel:connect_four", mcts_budgets="2,8")
    assert big.exact_metric == WIN_RATES
    bots = reference_bots(big)
    assert {"random", "mcts2", "mcts8"} <= set(bots)
    s = big.new_initial_state()
    assert bots["mcts8"].act(big, s, random.Random(0)) in big.legal_actions(s)


def test_ismcts_bot_plays_hidden_information(monkeypatch):
    """IS-MCTS where OpenSpiel resamples information states (Leduc, sized as too large to solve);
    none where it cannot (Liar's dice: plain MCTS would read the opponent's dice)."""
    import lmselfplay.games.openspiel as adapter

    monkeypatch.setattr(adapter, "MAX_INFOSETS", 10)
    game = make("openspiel:leduc_poker", mcts_budgets="4")
    assert game.exact_metric == WIN_RATES
    s = game.new_initial_state(seed=0)
    bot = reference_bots(game)["mcts4"]
    assert bot.act(game, s, random.Random(0)) in game.legal_actions(s)
    assert set(reference_bots(make("openspiel:liars_dice(numdice=1)"))) == {"random"}


@pytest.mark.parametrize("spec", ["kuhn_poker", "leduc_poker"])
def test_uniform_exploitability_equals_openspiels(spec):
    """The project's best response (games/exploitability.py) on the adapter against OpenSpiel's
    exploitability on OpenSpiel's own game: the uniform policy and a random tabular one."""
    from open_spiel.python import policy as os_policy
    from open_spiel.python.algorithms import exploitability as os_expl

    game = make(f"openspiel:{spec}")
    theirs = pyspiel.load_game(spec)
    assert nash_conv(game, uniform_policy(game)) / 2 == pytest.approx(
        os_expl.exploitability(theirs, os_policy.UniformRandomPolicy(theirs)), abs=1e-9)
    tab = os_policy.TabularPolicy(theirs)
    rng = np.random.default_rng(0)
    tab.action_probability_array = rng.random(tab.action_probability_array.shape) * tab.legal_actions_mask
    tab.action_probability_array /= tab.action_probability_array.sum(axis=1, keepdims=True)
    ours = {k: tab.action_probability_array[i] for k, i in tab.state_lookup.items()}
    expected = os_expl.exploitability(theirs, tab)
    assert nash_conv(game, ours) / 2 == pytest.approx(expected, abs=1e-9)
    assert exploitability(game, ours) == pytest.approx(expected, abs=1e-9)  # OpenSpiel's, by the adapter


def test_cfr_through_the_adapter_matches_openspiel_cfr():
    from open_spiel.python.algorithms import cfr as os_cfr
    from open_spiel.python.algorithms import exploitability as os_expl

    from lmselfplay.game_theory.cfr import CFRPlusSolver

    game = make("openspiel:leduc_poker")
    ours = CFRPlusSolver(game).run(3)
    theirs = os_cfr.CFRPlusSolver(game.game)
    for _ in range(3):
        theirs.evaluate_and_update_policy()
    assert ours.exploitability() == pytest.approx(
        os_expl.exploitability(game.game, theirs.average_policy()), abs=1e-9)


@pytest.mark.slow
def test_every_game_the_table_says_loads_plays():
    """Every OpenSpiel registry game listed as loading (docs/bring_your_own_game.md) is built and played
    for up to 60 plies: each move's name parses back to it, and the returns are zero-sum."""
    from lmselfplay.games.openspiel import registry_rows

    for name, status in registry_rows():
        if status != "loads":
            continue
        game = make(f"openspiel:{name}")
        rng = random.Random(0)
        s = game.new_initial_state(seed=0)
        for _ in range(60):
            if game.is_terminal(s):
                break
            if game.current_player(s) == CHANCE:
                s = game.apply(s, rng.choice([a for a, _ in game.chance_outcomes(s)]))
                continue
            assert game.observation_text(s, game.current_player(s))
            a = rng.choice(game.legal_actions(s))
            assert game.parse_action(s, format_answer(move_text(game, s, a))) == a, name
            s = game.apply(s, a)
        assert sum(game.returns(s)) == pytest.approx(0.0), name
