"""The offline task generators: answers are correct, game turns are legal random play."""

from __future__ import annotations

import ast
import random
import re
from collections import Counter

import pytest
from scipy.stats import chisquare

from lmselfplay import games
from lmselfplay.games.base import CHANCE, all_states
from lmselfplay.games.text import format_answer
from lmselfplay.models import corpus as st
from lmselfplay.tasks.arithmetic import arithmetic_problem
from lmselfplay.tasks.programs import MAX_OUTPUT_CHARS, python_program


def test_arithmetic_answers_are_correct():
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    rng = random.Random(0)
    for _ in range(500):
        p = arithmetic_problem(rng)
        *steps, last = p["answer"].split("\n")
        assert last == f"#### {p['final']}"
        value = None
        for line in steps:
            m = re.fullmatch(r"(\d+) ([-+*/]) (\d+) = (-?\d+)", line)
            assert m, line
            a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
            if op == "/":
                assert a % b == 0 and a // b == c
            else:
                assert ops[op](a, b) == c
            # every number in an equation appears in the question or the previous step
            for n in (a, b):
                assert str(n) in re.findall(r"\d+", p["prompt"]) or n == value
            value = c
        assert str(value) == p["final"] and value >= 0


def test_program_outputs_are_correct_and_reproducible():
    rng = random.Random(1)
    kinds = Counter()
    for _ in range(300):
        t = python_program(rng)
        ns: dict = {}
        exec(t["code"], {}, ns)  # our own generated code, with full builtins this time
        arg = ast.literal_eval(t["input"])
        assert repr(ns["f"](arg)) == t["output"]
        assert t["code"].startswith("def f(x):\n")
        kinds[type(arg).__name__] += 1
        assert len(t["output"]) <= MAX_OUTPUT_CHARS
    assert set(kinds) == {"int", "list", "str"}
    again = random.Random(1)
    assert python_program(again) == python_program(random.Random(1))


def _prompt_index(game):
    """Every reachable decision point's prompt -> state (prompts of distinct states may
    coincide for hidden-information games; any of them has the same legal moves)."""
    index = {}
    for s in all_states(game):
        p = game.current_player(s)
        if not game.is_terminal(s) and p != CHANCE:
            index.setdefault(game.observation_text(s, p), s)
    return index


@pytest.mark.parametrize("name", ["nim", "nim_misere", "tictactoe", "kuhn_poker"])
def test_game_turns_are_legal_positions_in_the_text_protocol(name):
    game = games.make(name)
    index = _prompt_index(game)
    pairs = st.game_turns(game, random.Random(2), 3000)
    assert len(pairs) == 3000
    for prompt, answer in pairs:
        assert prompt in index, prompt
        action = game.parse_action(index[prompt], answer)
        assert not isinstance(action, games.Invalid), (prompt, answer)
        assert answer == format_answer(game.action_text(action))
    seen = {p for p, _ in pairs}
    # Random resets reach every position of the small games (tic-tac-toe: most of 4520).
    if name == "tictactoe":
        assert len(seen) > 1500
    else:
        assert seen == set(index)


def test_game_turns_follow_a_uniform_random_prior():
    game = games.make("tictactoe")
    root = game.observation_text(game.new_initial_state(), 0)
    pairs = st.game_turns(game, random.Random(3), 40000)
    first = Counter(a for p, a in pairs if p == root)
    assert len(first) == 9 and sum(first.values()) > 900
    assert chisquare(list(first.values())).pvalue > 1e-3
    nim = games.make("nim")
    counts = Counter(a for p, a in st.game_turns(nim, random.Random(4), 6000)
                     if "Stones: 1." not in p and "Stones: 2." not in p)
    assert chisquare([counts[format_answer(str(k))] for k in (1, 2, 3)]).pvalue > 1e-3


def test_every_registered_game_works_generically():
    for name in games.REGISTRY:
        if getattr(games.REGISTRY[name], "action_space", "discrete") == "text":
            continue  # free text (Taboo): no legal moves to sample; tests/games/test_taboo.py
        pairs = st.game_turns(games.make(name), random.Random(5), 50)
        assert len(pairs) == 50 and all(a.startswith("<move>") for _, a in pairs)


@pytest.mark.parametrize("name", ["nim", "tictactoe", "kuhn_poker"])
def test_reading_task_answer_is_the_one_line_named_by_its_cue(name):
    """The answer is a line of the observation, the cue names that line only, and no
    answer copies the answer-format line (it would teach move tags out of place)."""
    game, rng = games.make(name), random.Random(0)
    lines_seen = Counter()
    for _ in range(300):
        prompt, answer = st.reading_task(game, rng)
        *obs, question = prompt.split("\n")
        cue = re.fullmatch(r'Question: repeat the line above that starts with "(.+)"\.', question)[1]
        assert answer in obs and answer.startswith(cue) and answer != cue
        assert [ln for ln in obs if ln.startswith(cue)] == [answer]
        assert "<move>" not in answer
        lines_seen[obs.index(answer)] += 1
    # every informative line gets asked (Kuhn: rules, seat + card, betting, legal moves)
    assert len(lines_seen) >= 3
    if name == "kuhn_poker":
        cards = {st.reading_task(game, random.Random(i))[1] for i in range(200)}
        assert {f"You are player {p}. Your card: {c}." for p in (1, 2) for c in "JQK"} <= cards


def test_generated_corpus_and_tasks_are_unchanged_by_seed():
    """The corpus text and the seed tasks a seed generates are pinned: the embedded model's
    build (and the shipped copy's key) depends on every byte of them. Hashes recorded before
    the task generators moved to lmselfplay.tasks."""
    import hashlib
    import json

    from lmselfplay.models import pretrain, tiny

    def digest(value) -> str:
        return hashlib.sha256(json.dumps(value).encode()).hexdigest()

    pinned = {"v3": "e40ffae4d67c7b684e336bce613944b3c0c146c76aa9c8450beda0060c0498d5",
              "v4": "cb3c2d8d4bf4ac38c3f86987232a4d99b00bfb7663ee13fa8fb187c46fb8c1d5"}
    for build, expected in pinned.items():
        corpus = pretrain.Corpus(tiny.build_config(build), random.Random(1234))
        assert digest([corpus.sample() for _ in range(400)]) == expected, build
    rng = random.Random(7)
    tasks = [[arithmetic_problem(rng), python_program(rng)] for _ in range(200)]
    kinds = {a.pop("kind") for a, _ in tasks}  # the problem's kind is a label beside the pinned text
    assert digest(tasks) == "488a682d24392cea6f8bb0abb48f471ac748a87e2f5088516742e8a24d81c9dc"
    assert kinds == {"addition", "subtraction", "multiplication", "division", "add-then-subtract", "multiply-then-add"}
