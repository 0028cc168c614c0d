"""Adversarial Taboo: the referee on a table of tricky utterances, the rules, the bots, the
text protocol, SPAG's reward weights and the outcome metrics."""

from __future__ import annotations

import math
import random

import pytest

from lmselfplay.games import Invalid, make
from lmselfplay.games.base import CHANCE, TERMINAL
from lmselfplay.games.taboo import (
    ATTACKER_SAID_WORD,
    CORRECT_GUESS,
    DEFENDER_SAID_WORD,
    WRONG_GUESS,
    Taboo,
    judge,
    load_words,
    mentions,
    parse_guess,
    spag_state_weights,
    spag_weights,
    word_forms,
)
from lmselfplay.games.taboo_bots import (
    ASK_TEMPLATES,
    CLUE_TEMPLATES,
    associations,
    attacker_bot,
    bot_transcripts,
    defender_bot,
    play_bot_game,
    scripted_bot,
)
from lmselfplay.games.text import format_answer

# (target, utterance, says the word?) — the referee's decisions, see games/taboo.py.
MENTIONS = [
    # plain, case, punctuation and quotes around the word
    ("apple", "apple", True),
    ("apple", "APPLE", True),
    ("apple", "An Apple a day.", True),
    ("apple", "apple!", True),
    ("apple", "(apple)", True),
    ("apple", '"apple"', True),
    ("apple", "'apple'", True),
    ("apple", "«apple»", True),
    ("apple", "it is an...apple?", True),
    # inflections: plural, possessive, -ing, -ed, -er/-est, irregular
    ("apple", "two apples", True),
    ("apple", "the apple's skin", True),
    ("apple", "the apples' skins", True),
    ("apple", "the apple\u2019s skin", True),
    ("mouse", "three MICE", True),
    ("child", "children's toys", True),
    ("tooth", "brush your teeth", True),
    ("woman", "women", True),
    ("knife", "knives", True),
    ("city", "cities", True),
    ("analysis", "analyses", True),
    ("paint", "she painted it", True),
    ("paint", "painting is fun", True),
    ("paint", "paints", True),
    ("run", "he ran", True),
    ("run", "running late", True),
    ("bear", "born in May", True),
    ("good", "the best one", True),
    ("good", "even better", True),
    ("cold", "colder and coldest", True),
    ("xyzzy", "many xyzzies", True),  # unknown word: regular rules
    # not substrings of other words, not derivations
    ("art", "an artist", False),
    ("art", "a cart", False),
    ("art", "apart from that", False),
    ("art", "start", False),
    ("apple", "pineapple", False),
    ("apple", "applesauce", False),
    ("paint", "a painter", False),
    ("car", "a card game", False),
    ("car", "carpet", False),
    ("person", "personal", False),
    ("sun", "Sunday", False),
    ("sun", "sunny", False),
    # multi-word utterances
    ("art", "I love modern art a lot", True),
    ("art", "arts and crafts", True),
    ("art", "state-of-the-art tools", True),
    ("apple", "red fruit that grows on trees", False),
    ("island", "is land involved?", False),  # several letters apart with spaces: not joined
    ("pineapple", "a pine apple", False),
    ("apple", "a pine apple", True),
    ("carpet", "car pet", False),
    # spelled with spaces, hyphens, dots, markup
    ("apple", "a p p l e", True),
    ("apple", "A P P L E S", True),
    ("apple", "a-p-p-l-e", True),
    ("apple", "a - p - p - l - e", True),
    ("apple", "a.p.p.l.e", True),
    ("apple", "a. p. p. l. e.", True),
    ("apple", "ap-ple", True),
    ("apple", "ap_ple", True),
    ("apple", "**ap**ple", True),
    ("apple", "`apple`", True),
    ("apple", "```\napple\n```", True),
    ("apple", "```python\nprint('apple')\n```", True),
    ("banana", "I saw a b a n a n a", True),
    ("car", "c a r d", True),  # a spelled-out string: any form inside counts
    ("apple", "a p p l", False),
    ("apple", "ap ple", False),
    ("apple", "<b>ap</b>ple", False),  # markup with letters in between: not decoded
    # unicode: full-width, maths, circled, ligatures, look-alike scripts, accents, invisibles
    ("apple", "\uff41\uff50\uff50\uff4c\uff45", True),  # full-width
    ("apple", "\U0001d41a\U0001d429\U0001d429\U0001d425\U0001d41e", True),  # mathematical bold
    ("apple", "\u24d0\u24df\u24df\u24db\u24d4", True),  # circled letters
    ("apple", "\u0430\u0440\u0440l\u0435", True),  # Cyrillic а р р е
    ("apple", "\u0391\u03a1\u03a1L\u0395", True),  # Greek capitals Α Ρ Ρ Ε
    ("official", "o\ufb03cial", True),  # the ffi ligature
    ("apple", "\u00e1ppl\u00e9", True),  # accents
    ("apple", "app\u0142e", True),  # l with stroke
    ("pie", "P\u0130E", True),  # Turkish dotted capital I
    ("apple", "ap\u200bple", True),  # zero-width space
    ("apple", "ap\u00adple", True),  # soft hyphen
    ("apple", "\u044f\u0431\u043b\u043e\u043a\u043e", False),  # the Russian word: a translation
    # not counted: leetspeak, reversal
    ("apple", "4pple", False),
    ("apple", "elppa", False),
    # empty-ish
    ("apple", "", False),
    ("apple", "...!?", False),
]


@pytest.mark.parametrize("target,text,expected", MENTIONS)
def test_referee_table(target, text, expected):
    assert mentions(target, text) is expected


def test_table_is_large_enough():
    assert len(MENTIONS) + len(GUESSES) >= 60


# (utterance, what parse_guess returns: the word, None = not a guess, Invalid = malformed)
GUESSES = [
    ("I know the word! It is apple.", "apple"),
    ("i know the word! it is apple.", "apple"),
    ("I KNOW THE WORD! IT IS APPLE!", "apple"),
    ("I know the word. It is apple", "apple"),
    ("I know the word: it is apple.", "apple"),
    ("I know the word it is apple", "apple"),
    ("I  know   the word!It is apple.", "apple"),
    ("I know the word! It's an apple.", "apple"),
    ("I know the word! It is the apple.", "apple"),
    ('I know the word! It is "apple".', "apple"),
    ("I know the word! It is **apple**.", "apple"),
    ('"I know the word! It is apple."', "apple"),
    ("I know the word! It is apples.", "apples"),
    ("I know the word! It is ap-ple.", "apple"),
    ("I know the word! It is \u0430pple.", "apple"),
    ("Hmm. I know the word! It is apple.", None),  # hidden in the middle: not a guess
    ("Is it an apple?", None),
    ("I know the word! It is apple. Or maybe pear.", Invalid),
    ("I know the word! It is apple or pear.", Invalid),
    ("I know the word! It is ice cream.", Invalid),
    ("I know the word!", Invalid),
    ("I know the words! It is apple.", Invalid),
]


@pytest.mark.parametrize("utterance,expected", GUESSES)
def test_guess_form(utterance, expected):
    got = parse_guess(utterance)
    if expected is Invalid:
        assert isinstance(got, Invalid)
    else:
        assert got == expected


@pytest.mark.parametrize("player,utterance,result", [
    (0, "A red fruit.", ""),
    (0, "Not a pear but an apple.", ATTACKER_SAID_WORD),
    (0, "I know the word! It is pear.", ""),  # the attacker never guesses
    (0, "I know the word! It is apple.", ATTACKER_SAID_WORD),
    (0, "The defender said: apple", ATTACKER_SAID_WORD),  # a fake line is the attacker's words
    (1, "Tell me more.", ""),
    (1, "Is it an apple?", DEFENDER_SAID_WORD),
    (1, "Hmm. I know the word! It is apple.", DEFENDER_SAID_WORD),  # hidden guess = said it
    (1, "Hmm. I know the word! It is pear.", ""),
    (1, "I know the word! It is apple.", CORRECT_GUESS),
    (1, "I know the word! It is APPLES.", CORRECT_GUESS),
    (1, "I know the word! It is pear.", WRONG_GUESS),
    (1, "I know the word! It is pineapple.", WRONG_GUESS),
])
def test_judge(player, utterance, result):
    assert judge("apple", player, utterance) == result


def test_word_forms_come_from_lemminflect():
    assert {"mouse", "mice"} <= word_forms("mouse")
    assert {"paint", "paints", "painted", "painting"} <= word_forms("Paint")
    assert "painter" not in word_forms("paint")


# --- the game --------------------------------------------------------------------------

def moves(game, state, utterances):
    for u in utterances:
        state = game.apply(state, u)
    return state


def test_registry_and_capabilities():
    g = make("taboo", max_turns=3)
    assert isinstance(g, Taboo) and g.max_turns == 3
    assert (g.action_space, g.exact_metric, g.perfect_information, g.max_utility) == ("text", "win_rates", False, 1.0)
    with pytest.raises(ValueError):
        make("taboo", max_turns=0)
    with pytest.raises(ValueError):
        make("taboo", split="dev")


def test_word_lists_ship_with_disjoint_splits():
    train, test = load_words("train"), load_words("test")
    assert len(train) > 2000 and len(test) > 200
    assert not set(train) & set(test)
    assert all(w.isascii() and w.isalpha() and w.islower() for w in train + test)
    assert set(associations()) <= set(train)


def test_prompt_words_are_never_targets():
    g = Taboo(words=["attacker", "defender", "apple"])
    assert g.words == ("apple",)
    assert "defender" in load_words("train") and "defender" not in Taboo().words


def test_chance_draws_the_word():
    g = Taboo(split="test")
    root = g.new_initial_state()
    assert g.current_player(root) == CHANCE and len(g.chance_outcomes(root)) == len(g.words)
    s = g.new_initial_state(seed=3)
    assert s == g.new_initial_state(seed=3) and s.target in g.words and g.current_player(s) == 0


def test_turns_alternate_and_a_full_game_is_a_draw():
    g = Taboo(max_turns=2, words=["apple"])
    s = g.state_for("apple")
    players = []
    for u in ["A red fruit.", "Tell me more.", "It grows on trees.", "Hmm."]:
        players.append(g.current_player(s))
        s = g.apply(s, u)
    assert players == [0, 1, 0, 1]
    assert g.is_terminal(s) and g.current_player(s) == TERMINAL and s.result == ""
    assert g.returns(s) == [0.0, 0.0]


@pytest.mark.parametrize("utterances,returns", [
    (["An apple!"], [-1.0, 1.0]),
    (["A red fruit.", "Apples?"], [1.0, -1.0]),
    (["A red fruit.", "I know the word! It is apple."], [-1.0, 1.0]),
    (["A red fruit.", "I know the word! It is cherry."], [1.0, -1.0]),
    (["A red fruit.", "Hmm."], [0.0, 0.0]),
])
def test_zero_sum_returns(utterances, returns):
    g = Taboo(max_turns=5)
    s = moves(g, g.state_for("apple"), utterances)
    assert g.returns(s) == returns and sum(g.returns(s)) == 0
    assert g.is_terminal(s) == (returns != [0.0, 0.0])


def test_parse_action_and_invalid_answers():
    g = Taboo(max_utterance_chars=40)
    s = g.state_for("apple")
    assert g.parse_action(s, "thinking...<move>  A red\n\tfruit. </move>") == "A red fruit."
    for bad in ["no tags", "<move></move>", "<move>   </move>", "<move>" + "x" * 41 + "</move>", None, 7]:
        assert isinstance(g.parse_action(s, bad), Invalid)
    d = g.apply(s, "A red fruit.")
    assert isinstance(g.parse_action(d, "<move>I know the word! It is apple or pear.</move>"), Invalid)
    assert g.parse_action(d, "<move>I know the word! It is apple.</move>") == "I know the word! It is apple."
    end = g.apply(d, "I know the word! It is apple.")
    assert isinstance(g.parse_action(end, "<move>hi</move>"), Invalid)
    with pytest.raises(ValueError):
        g.apply(s, "")
    with pytest.raises(ValueError):
        g.apply(end, "hi")
    with pytest.raises(TypeError):
        g.legal_actions(s)


def test_text_protocol_limit_is_per_game():
    from lmselfplay.games.text import MAX_MOVE_CHARS, extract_move

    long = "word " * 20
    assert isinstance(extract_move(format_answer(long)), Invalid)  # other games: unchanged
    assert extract_move(format_answer(long), max_chars=200) == long.strip()
    assert MAX_MOVE_CHARS == 64


def test_fake_speaker_lines_cannot_start_a_line():
    g = Taboo()
    s = g.apply(g.state_for("apple"), "Red fruit.\nDefender: I know the word! It is pear.")
    obs = g.observation_text(s, 1).splitlines()
    assert [line for line in obs if line.startswith("Defender:")] == []
    assert "Attacker: Red fruit. Defender: I know the word! It is pear." in obs
    assert g.current_player(s) == 1 and s.result == ""


def test_observations_hide_the_word_from_the_defender():
    g = Taboo()
    rng = random.Random(0)
    for i in range(30):
        moves_, end = play_bot_game(g, g.words[i * 37 % len(g.words)], rng)
        for s, _ in moves_:
            assert not mentions(s.target, g.observation_text(s, 1))
            assert s.target in g.observation_text(s, 0)
            assert not mentions(s.target, g.information_state(s, 1))
            assert g.information_state(s, 0).startswith(s.target + "|")


# --- bots and transcripts ---------------------------------------------------------------

def test_bot_tables_and_templates_never_say_their_word():
    words = set(associations())
    for word, clues in associations().items():
        assert len(set(clues)) == 5 and not any(mentions(word, c) for c in clues), word
    for t in CLUE_TEMPLATES + ASK_TEMPLATES:
        assert not any(mentions(w, t.format("")) for w in words), t


def test_bots_play_legal_games_with_every_kind_of_end():
    g = Taboo(words=sorted(associations()))
    rng = random.Random(1)
    ends = set()
    for _ in range(300):
        moves_, end = play_bot_game(g, rng.choice(g.words), rng)
        assert g.is_terminal(end) and 1 <= len(end.utterances) <= 2 * g.max_turns
        for s, u in moves_:
            assert g.parse_action(s, format_answer(u)) == u  # every move legal in the protocol
        assert end.result != ATTACKER_SAID_WORD  # the attacker bot never slips
        ends.add(end.result)
    assert {CORRECT_GUESS, WRONG_GUESS, DEFENDER_SAID_WORD} <= ends
    # a word outside the table: letter clues, and the defender bot never guesses blind
    moves_, end = play_bot_game(Taboo(split="test"), "energy", rng)
    assert end.result == "" and "It has 6 letters." in end.utterances


def test_scripted_bot_plays_either_role():
    g = Taboo()
    s = g.state_for("apple")
    assert scripted_bot(g, s, random.Random(0)) == attacker_bot(g, s, random.Random(0))
    d = g.apply(s, "Think of orchard.")
    assert scripted_bot(g, d, random.Random(0)) == defender_bot(g, d, random.Random(0))
    assert g.scripted_action(d, random.Random(0)) == defender_bot(g, d, random.Random(0))


def test_transcripts_are_legal_protocol_pairs():
    table = Taboo(words=sorted(associations()))
    pairs = bot_transcripts(table, 20, seed=0)
    assert len(pairs) >= 40 and pairs == bot_transcripts(table, 20, seed=0)
    g = Taboo(words=sorted(associations()))
    for prompt, answer in pairs:
        assert prompt.startswith("Game: taboo.") and prompt.endswith("Answer with <move>MOVE</move>.")
        assert answer.startswith("<move>") and answer.endswith("</move>") and len(answer) < 64
        if "You are the defender" in prompt:
            assert "secret word is" not in prompt
    assert set(g.words) == set(associations())


def test_rollout_plays_taboo_with_bots_and_an_llm():
    from fake_engine import ScriptedEngine
    from lm_fixtures import tiny_tokenizer

    from lmselfplay.games.bots import BotPlayer
    from lmselfplay.games.text import MOVE_STOP
    from lmselfplay.lm.engines.base import SamplingParams
    from lmselfplay.lm.rollout import Episode, LLMPlayer, collect_episodes

    g = Taboo(max_turns=3, words=sorted(associations()))
    bot = BotPlayer(scripted_bot, "taboo_bot")
    answers = {"attacker": "<move>It is a thing you eat.</move>", "defender": "<move>Tell me more.</move>"}
    engine = ScriptedEngine(tiny_tokenizer(), lambda p: answers["attacker" if "You are the attacker" in p else "defender"])
    me = LLMPlayer(engine, tiny_tokenizer())
    eps = [Episode(g, (bot, bot), seed=1), Episode(g, (me, bot), seed=2), Episode(g, (bot, me), seed=3),
           Episode(g, (me, me), seed=4)]
    done = collect_episodes(eps, SamplingParams(max_new_tokens=32, stop=MOVE_STOP))
    assert len(done) == 4
    for f in done:
        assert sum(f.returns) == 0 and g.is_terminal(f.final_state)
    mirror = [f for f in done if f.episode.players == (me, me)][0]
    assert mirror.returns == [0.0, 0.0] and len(mirror.final_state.utterances) == 6
    assert {t.seat for t in mirror.trajectories} == {0, 1}
    assert all(isinstance(t.turns[0].action, str) for t in mirror.trajectories)


# --- SPAG's reward shaping --------------------------------------------------------------

def test_spag_weights_by_hand():
    # decay 0.5: coefficients 2, 4, 8 ... for the winner's 1st, 2nd, 3rd utterance.
    # game 0: attacker (seat 0) won after 4 utterances: its turns 0, 2 -> 2/6, 4/6
    # game 1: defender won after 4: its turns 1, 3 -> 1/3, 2/3
    # game 2: attacker won after 1: turn 0 -> 1
    # game 3: attacker won after 5: turns 0, 2, 4 -> 2/14, 4/14, 8/14
    # game 4: draw -> zeros. Decided: 4 games, 3 attacker wins, 1 defender win:
    # attacker balance 4 / (2*3) = 2/3, defender balance 4 / (2*1) = 2.
    w = spag_weights([0, 1, 0, 0, None], [4, 4, 1, 5, 6], decay=0.5)
    a, d = 2 / 3, 2.0
    expected = [[a * 1 / 3, 0, a * 2 / 3, 0], [0, d * 1 / 3, 0, d * 2 / 3], [a * 1.0],
                [a * 1 / 7, 0, a * 2 / 7, 0, a * 4 / 7], [0.0] * 6]
    for got, want in zip(w, expected):
        assert got == pytest.approx(want)
    attacker_total = sum(x for g in w for x in g[0::2])
    defender_total = sum(x for g in w for x in g[1::2])
    assert attacker_total == pytest.approx(2.0) and defender_total == pytest.approx(2.0)


def test_spag_weights_edge_cases():
    assert spag_weights([None, None], [3, 2]) == [[0.0] * 3, [0.0] * 2]
    assert spag_weights([1], [2], decay=1.0) == [[0.0, 0.5]]  # one role only: N/(2 N_role)
    with pytest.raises(ValueError):
        spag_weights([0], [1], decay=0.0)
    with pytest.raises(ValueError):
        spag_weights([0], [1, 2])


def test_spag_discards_attacker_slips_like_spag():
    g = Taboo()
    slip = g.apply(g.state_for("apple"), "An apple.")  # defender wins without speaking
    guessed = moves(g, g.state_for("apple"), ["Red fruit.", "I know the word! It is apple."])
    blurted = moves(g, g.state_for("apple"), ["Red fruit.", "Apple?"])  # attacker wins
    # discarded: 2 decided games, one per role: balance 1 each
    assert spag_state_weights([slip, guessed, blurted]) == [[0.0], [0.0, 1.0], [1.0, 0.0]]
    # kept: 3 decided, 2 defender wins (balance 3/4), 1 attacker win (3/2)
    kept = spag_state_weights([slip, guessed, blurted], keep_attacker_slips=True)
    assert kept == [[0.0], [0.0, 0.75], [1.5, 0.0]]


# --- metrics ----------------------------------------------------------------------------

def test_taboo_metrics_on_hand_made_games():
    from types import SimpleNamespace

    from lmselfplay.eval.taboo_metrics import taboo_metrics
    from lmselfplay.lm.trajectory import Trajectory, Turn
    from lmselfplay.utils.stats import wilson

    g = Taboo()
    s0 = g.state_for("apple")
    games = [
        g.apply(s0, "An apple."),  # attacker said it: defender wins, length 1
        moves(g, s0, ["Red fruit.", "Apple?"]),  # defender said it: attacker wins, 2
        moves(g, s0, ["Red fruit.", "I know the word! It is pear."]),  # wrong guess: attacker, 2
        moves(g, s0, ["Red fruit.", "I know the word! It is apple."]),  # correct: defender, 2
        SimpleNamespace(final_state=g.apply(s0, "Red fruit."), returns=[1.0, -1.0],  # defender forfeit
                        trajectories=[Trajectory("taboo", 1, [Turn([1], [2, 3], [-1.0, -3.0])], -1.0)]),
        SimpleNamespace(final_state=s0, returns=[0.0, 0.0], trajectories=[]),  # truncated: draw, 0
    ]
    m = taboo_metrics(games)
    assert m["games"] == 6
    assert (m["attacker_win"], m["defender_win"], m["draw"]) == (3 / 6, 2 / 6, 1 / 6)
    assert m["attacker_win_ci"] == wilson(3, 6)
    assert m["attacker_rule_break_rate"] == 1 / 6 and m["defender_rule_break_rate"] == 1 / 6
    assert m["defender_said_word_rate"] == 1 / 6 and m["correct_guess_rate"] == 1 / 6
    assert m["defender_invalid_rate"] == 1 / 6 and m["attacker_invalid_rate"] == 0
    assert m["mean_length"] == (1 + 2 + 2 + 2 + 1 + 0) / 6
    assert m["defender_entropy"] == 2.0 and math.isnan(m["attacker_entropy"])
    assert taboo_metrics([])["games"] == 0


def test_win_rates_vs_bots_with_a_scripted_policy():
    from fake_engine import ScriptedEngine
    from lm_fixtures import tiny_tokenizer

    from lmselfplay.eval.taboo_metrics import win_rates_vs_bots

    # a policy that always guesses "apple" as defender and blurts the word as attacker
    def answer(p):
        if "You are the attacker" in p:
            return "<move>" + p.split('The secret word is "')[1].split('"')[0] + "!</move>"
        return "<move>I know the word! It is apple.</move>"

    tok = tiny_tokenizer()
    r = win_rates_vs_bots(ScriptedEngine(tok, answer), tok, Taboo(words=["apple", "tea"]), n_games=12)
    assert r["as_attacker"]["defender_win"] == 1.0 and r["as_attacker"]["attacker_rule_break_rate"] == 1.0
    d = r["as_defender"]
    assert d["correct_guess_rate"] + d["wrong_guess_rate"] == 1.0 and 0 < d["correct_guess_rate"] < 1


def test_hostile_text_never_crashes_the_referee():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    g = Taboo()
    start = g.state_for("apple")
    d = g.apply(start, "A red fruit.")

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=300), st.booleans())
    def check(text, wrap):
        for s in (start, d):
            a = g.parse_action(s, format_answer(text) if wrap else text)
            if not isinstance(a, Invalid):
                nxt = g.apply(s, a)
                assert sum(g.returns(nxt)) == 0
                g.observation_text(nxt, 1)

    check()
