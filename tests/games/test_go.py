"""Go rules on hand positions with known answers, symmetries, and the text face."""

import pickle
import random

import numpy as np
import pytest
from go_positions import KO, MULTI, SEKI, TRIPLE_KO_CYCLE, play, setup_actions, triple_ko

from lmselfplay.games import Game, Invalid, make
from lmselfplay.games.go import Go
from lmselfplay.games.text import format_answer


def answer(game, state, text):
    return game.parse_action(state, format_answer(text))


def names(game, state):
    return {game.action_text(a) for a in game.legal_actions(state)}


def test_simple_ko_cannot_be_retaken_at_once():
    g = Go(5)
    s = g.from_rows(KO)
    s = g.apply(s, g.point("C4"))  # Black captures B4
    assert s.captures == (1, 0) and s.board[g.point("B4")] == 0
    assert "B4" not in names(g, s)
    reason = answer(g, s, "B4")
    assert isinstance(reason, Invalid) and "superko" in reason.reason
    s = play(g, [g.point("E1"), g.point("E2")], s)  # a ko threat and its answer
    assert "B4" in names(g, s)
    s = g.apply(s, g.point("B4"))  # White retakes: C4 is captured
    assert s.captures == (1, 1) and s.board[g.point("C4")] == 0


def test_triple_ko_cycle_is_stopped_by_positional_superko():
    g = Go(9)
    s = play(g, setup_actions(g, triple_ko("OXO")))
    start = s.zhash
    for name in TRIPLE_KO_CYCLE[:-1]:  # each move retakes a ko that was not just taken
        assert name in names(g, s)
        s = g.apply(s, g.point(name))
    # The sixth capture would bring back the start position: forbidden.
    assert "G8" not in names(g, s)
    bad = answer(g, s, "G8")
    assert isinstance(bad, Invalid) and "superko" in bad.reason
    with pytest.raises(ValueError, match="superko"):
        g.apply(s, g.point("G8"))
    # It is the position, not the move: the same capture with an extra stone is fine.
    s = play(g, [g.point("J1"), g.point("G8")], s)
    assert s.zhash != start


def test_single_stone_suicide_is_illegal():
    g = Go(5)
    s = g.from_rows([". X . . .",
                     "X X . . .",
                     ". . . . .",
                     ". . . . .",
                     ". . . . ."], to_play=1)
    assert "A5" not in names(g, s)
    bad = answer(g, s, "A5")
    assert isinstance(bad, Invalid) and "suicide" in bad.reason


def test_multi_stone_move_without_liberties_is_legal_when_it_captures():
    g = Go(5)
    s = g.from_rows(MULTI, to_play=1)
    assert "C5" in names(g, s)
    s = g.apply(s, g.point("C5"))  # B5-C5 would have no liberty, but D5 is captured
    assert s.captures == (0, 1) and s.board[g.point("D5")] == 0
    head = s.chain[g.point("C5")]
    assert s.chain[g.point("B5")] == head
    assert s.groups[head][1] == {g.point("D5")}


def test_multi_stone_suicide_without_capture_is_illegal():
    g = Go(5)
    rows = list(MULTI)
    rows[0] = "X O . X ."  # D5 now has a liberty at E5: nothing is captured
    s = g.from_rows(rows, to_play=1)
    bad = answer(g, s, "C5")
    assert isinstance(bad, Invalid) and "suicide" in bad.reason


def test_snapback():
    g = Go(5)
    s = g.from_rows([". . . . .",
                     ". . . . .",
                     "X X X . .",
                     "O O X . .",
                     ". . X . ."])
    s = g.apply(s, g.point("A1"))  # throw-in: the stone can be taken at once
    s = g.apply(s, g.point("B1"))  # White takes it, and is left with one liberty (A1)
    assert s.captures == (0, 1)
    assert "A1" in names(g, s)  # not a ko repetition: three stones come off
    s = g.apply(s, g.point("A1"))
    assert s.captures == (3, 1)
    assert [s.board[g.point(p)] for p in ("A2", "B2", "B1")] == [0, 0, 0]


def test_seki_shared_liberties_count_for_nobody():
    g = Go(7, komi=0.5)
    s = g.from_rows(SEKI)
    # Stones: X 24, O 19; A1, G1 are Black's, A7, G7 White's; A4 and G4 count for nobody.
    assert g.area_score(s) == 26 - 21 - 0.5
    s = play(g, [g.pass_action, g.pass_action], s)
    assert g.returns(s) == [1.0, -1.0]
    # Seki: whoever fills a shared liberty is captured through the other one.
    for mover, fill, take, lost in ((0, "A4", "G4", 13), (1, "G4", "A4", 8)):
        t = g.from_rows(SEKI, to_play=mover)
        t = g.apply(t, g.point(fill))
        before = t.captures[1 - mover]
        t = g.apply(t, g.point(take))
        assert t.captures[1 - mover] - before == lost


def test_large_capture_frees_the_area():
    g = Go(9)
    rows = [". " * 9] * 5 + ["X " * 9] + ["O " * 9] * 2 + [". " + "O " * 8]
    s = play(g, setup_actions(g, rows))
    assert len(g.legal_actions(s)) == 5 * 9 + 1 + 1  # the empty top, A1, pass
    s = g.apply(s, g.point("A1"))
    assert s.captures == (26, 0)
    assert len(g.legal_actions(s)) == 5 * 9 + 26 + 1
    head = s.chain[g.point("A4")]
    assert len(s.groups[head][1]) == 9 + 9  # row 5 and row 3 are its liberties


def test_two_passes_end_the_game_and_area_scoring():
    g = Go(5, komi=7.5)
    s = g.from_rows([". X O . .",
                     ". X O . .",
                     ". X O . .",
                     ". X O . .",
                     ". X O . ."])
    s = play(g, [g.pass_action, g.pass_action], s)
    assert g.is_terminal(s) and g.legal_actions(s) == []
    assert g.area_score(s) == 10 - 15 - 7.5
    assert g.returns(s) == [-1.0, 1.0]
    assert make("go", size=5, komi=-5.5).returns(s) == [1.0, -1.0]


def test_ply_cap_ends_the_game():
    g = Go(5)
    rng = random.Random(0)
    s = g.new_initial_state()
    while not g.is_terminal(s):
        moves = [a for a in g.legal_actions(s) if a != g.pass_action] or [g.pass_action]
        s = g.apply(s, rng.choice(moves))
    assert s.ply <= 2 * 25 and (s.ply == 50 or s.passes == 2)


def random_game(game, seed):
    rng = random.Random(seed)
    s, actions = game.new_initial_state(), []
    while not game.is_terminal(s):
        a = rng.choice(game.legal_actions(s))
        actions.append(a)
        s = game.apply(s, a)
    return actions


@pytest.mark.parametrize("seed", range(6))
def test_eight_symmetries_preserve_legal_sets_scores_and_planes(seed):
    g = Go(7 if seed % 2 else 9, area_planes=seed >= 4)
    actions = random_game(g, seed)
    for k in range(8):
        perm = g.symmetry_actions(k)
        assert perm[g.pass_action] == g.pass_action and sorted(perm) == list(range(g.n_actions))
        s, t = g.new_initial_state(), g.new_initial_state()
        for a in actions:
            assert sorted(perm[g.legal_actions(s)]) == g.legal_actions(t)
            np.testing.assert_array_equal(g.transform_planes(g.encode(s), k), g.encode(t))
            s, t = g.apply(s, a), g.apply(t, int(perm[a]))
        assert g.is_terminal(t) and g.area_score(s) == g.area_score(t)
        assert g.returns(s) == g.returns(t)


def test_symmetries_are_the_dihedral_group():
    g = Go(9)
    images = {tuple(g.symmetry_actions(k)) for k in range(8)}
    assert len(images) == 8
    d4 = g.point("D4")
    assert {g.action_text(int(g.symmetry_actions(k)[d4])) for k in range(8)} == {
        "D4", "F4", "D6", "F6"}


def test_states_are_immutable_hashable_and_pickle():
    g = Go(9)
    actions = random_game(g, 3)[:30]
    s = play(g, actions)
    again = play(g, actions)
    assert s == again and hash(s) == hash(again) and len({s, again}) == 1
    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(AttributeError):
        s.ply = 3
    assert g.apply(s, g.pass_action) != s


def test_encode_planes():
    g = Go(9)
    s = play(g, [g.point("D4"), g.point("E5")])
    x = g.encode(s)
    assert x.shape == (11, 9, 9) and x.dtype == np.float32
    assert x[0, 3, 3] == 1 and x[1, 4, 4] == 1  # Black to move: own D4, their E5
    assert x[2].sum() == 1 and x[3].sum() == 0  # one ply earlier: only D4
    assert not x[8].any() and x[9].all() and x[10].all()
    t = g.apply(s, g.pass_action)
    assert g.encode(t)[1, 3, 3] == 1 and not g.encode(t)[9].any()


def test_area_planes_hold_the_area_count_as_the_board_stands():
    """Mover's area, opponent's area (stones + empty regions touching one colour only),
    tanh(mover's margin with komi / 10) and whether that margin is positive; the other
    planes are the default encoding's."""
    g, plain = Go(9, area_planes=True), Go(9)
    rows = ["...OX...."] * 8 + ["...O.X..."]  # E1 touches both colours: nobody's
    black = g.from_rows(rows, to_play=0)
    owner = g.area_map(black.board)
    assert (owner == 1).sum() == 44 and (owner == 2).sum() == 36 and owner[g.point("E1")] == 0
    assert g._areas(black.board) == (44, 36, 1) and g.area_score(black) == 44 - 36 - 7.5
    x = g.encode(black)
    assert x.shape == (15, 9, 9)
    assert x[8].sum() == 44 and x[9].sum() == 36 and x[8, 0, 4] == 0 and x[9, 0, 4] == 0
    assert np.allclose(x[10], np.tanh(0.5 / 10)) and x[11].all()  # Black is ahead by 0.5
    np.testing.assert_array_equal(np.delete(x, [8, 9, 10, 11], axis=0), plain.encode(black))
    y = g.encode(g.from_rows(rows, to_play=1))
    assert y[8].sum() == 36 and y[9].sum() == 44 and np.allclose(y[10], np.tanh(-0.5 / 10))
    assert not y[11].any()


def test_encode_tells_whether_a_pass_ends_the_game():
    """The same boards with and without the opponent's pass are different positions (a
    pass ends one of them): the planes must differ, and only the pass plane does."""
    g = Go(9)
    s = play(g, [g.point("D4"), g.point("E5"), g.point("C3")])  # White to move
    after_pass = play(g, [g.point("D4"), g.point("E5"), g.point("C3"), g.pass_action,
                          g.point("F6"), g.pass_action])  # Black to move after White's pass
    placed = play(g, [g.point("D4"), g.point("E5"), g.point("C3"), g.point("F6")])
    x, y = g.encode(after_pass), g.encode(placed)
    assert y[8].sum() == 0 and x[8].all()  # only after a pass may a pass end the game
    assert not g.encode(s)[8].any()
    assert not g.is_terminal(g.apply(placed, g.pass_action))
    assert g.is_terminal(g.apply(after_pass, g.pass_action))


@pytest.mark.parametrize("size", [9, 19])
def test_every_move_round_trips_through_text(size):
    g = make("go", size=size)
    s = g.new_initial_state()
    assert len(g.legal_actions(s)) == size * size + 1
    for a in g.legal_actions(s):
        name = g.action_text(a)
        assert answer(g, s, name) == a
        assert answer(g, s, name.lower()) == a
    mid = play(g, random_game(g, 5)[:40])
    for a in g.legal_actions(mid):
        assert answer(g, mid, g.action_text(a)) == a


def test_invalid_answers_have_reasons():
    g = make("go9")
    s = play(g, [g.point("D4")])
    cases = {"Z99": "not a point", "d 4": "not a point", "passs": "not a point",
             "D04": "not a point", "I5": "not a point", "D4.": "not a point",
             "K1": "off the 9x9", "A10": "off the 9x9", "D4": "occupied"}
    for text, why in cases.items():
        r = answer(g, s, text)
        assert isinstance(r, Invalid) and why in r.reason, (text, r)
    for text in ["", "no tags here", None, 7, "<move></move>", "<move>" + "a" * 80 + "</move>"]:
        assert isinstance(g.parse_action(s, text), Invalid)
    assert g.parse_action(s, "I think <move>pass</move>") == g.pass_action
    done = play(g, [g.pass_action, g.pass_action], s)
    r = answer(g, done, "E5")
    assert isinstance(r, Invalid) and "over" in r.reason


def test_observation_text():
    g = make("go9")
    s = play(g, [g.point("D4"), g.point("E5"), g.point("C3")])
    text = g.observation_text(s, 1)
    assert "You play O." in text and "Komi 7.5" in text and "Last move: X C3" in text
    lines = text.splitlines()
    assert "  A B C D E F G H J" in lines
    assert "3 . . x . . . . . ." in lines  # the last stone is lower case
    assert "4 . . . X . . . . ." in lines and "5 . . . . O . . . ." in lines
    assert lines[-2].startswith("Legal moves: A1 B1") and lines[-2].endswith("pass")
    assert "Captured: X 0, O 0" in text


def test_registry():
    assert make("go9").size == 9 and make("go", size=13).n_actions == 170
    assert make("go9").exact_metric == "win_rates" and isinstance(make("go9"), Game)
    with pytest.raises(ValueError):
        make("go", size=4)


def test_move_history_replays_the_game():
    g = Go(9)
    actions = random_game(g, 7)[:25]
    root, moves = g.move_history(play(g, actions))
    assert root == bytes(81) and moves == actions
    five = Go(5)
    start = five.from_rows(KO)
    root, moves = five.move_history(five.apply(start, five.point("C4")))
    assert root == start.board and moves == [five.point("C4")]
