"""Scripted Taboo players, and the short transcripts they play for the tiny model's corpus.

Both bots read one small hand-written table, ``data/taboo_associations.tsv`` (a word and five
clue words). They are functions ``(game, state, rng) -> utterance``, the shape of
``lmselfplay.games.bots.BotPlayer.act``; :func:`scripted_bot` plays whichever role is to move,
so it can sit in either seat.

* Attacker: its k-th utterance gives the target's k-th clue in a short template ("Think of
  wings."). For a word outside the table it says its length, first and last letter.
* Defender: scores every table word by how many of its clues the attacker has said. With a
  unique best word backed by two clues (or one, on its last turn) it guesses it in the fixed
  form; with one clue it still guesses with probability ``eager`` (a random best word: wrong
  guesses happen). With probability ``careless`` it asks "Is it about <word>?" instead of
  guessing, which says the word (an attacker win when right). Otherwise it asks for a hint.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from typing import Any

from lmselfplay.games.taboo_referee import ATTACKER, said
from lmselfplay.games.text import format_answer

Bot = Callable[[Any, Any, random.Random], str]

CLUE_TEMPLATES = ("Think of {}.", "It goes with {}.", "It is related to {}.", "Picture {}.",
                  "You may link it to {}.")
ASK_TEMPLATES = ("Give me another hint.", "Tell me more.", "Hmm, what else?", "Go on.")


@lru_cache(maxsize=1)
def associations() -> dict[str, tuple[str, ...]]:
    """``{word: clues}`` from the shipped table."""
    text = resources.files("lmselfplay.games").joinpath("data/taboo_associations.tsv").read_text("utf-8")
    table = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            word, clues = line.split("\t")
            table[word] = tuple(clues.split())
    return table


@lru_cache(maxsize=1)
def _clue_index() -> dict[str, tuple[str, ...]]:
    index: dict[str, list[str]] = {}
    for word, clues in associations().items():
        for c in clues:
            index.setdefault(c, []).append(word)
    return {c: tuple(ws) for c, ws in index.items()}


def attacker_bot(game: Any, state: Any, rng: random.Random) -> str:
    target = state.target or ""
    k = len(state.utterances) // 2
    clues = associations().get(target)
    if clues:
        return rng.choice(CLUE_TEMPLATES).format(clues[k % len(clues)])
    spelled = (f"It has {len(target)} letters.", f"It starts with the letter {target[:1]}.",
               f"It ends with the letter {target[-1:]}.", "It is a common word.")
    return spelled[k % len(spelled)]


def candidates(state: Any) -> dict[str, int]:
    """Table words scored by the number of their clues the attacker has said."""
    heard = set()
    for u in state.utterances[ATTACKER::2]:
        heard |= said(u, 16)
    scores: dict[str, int] = {}
    for clue, words in _clue_index().items():
        if clue in heard:
            for w in words:
                scores[w] = scores.get(w, 0) + 1
    return scores


def make_defender_bot(careless: float = 0.1, eager: float = 0.2) -> Bot:
    def defender_bot(game: Any, state: Any, rng: random.Random) -> str:
        scores = candidates(state)
        last_turn = len(state.utterances) // 2 + 1 >= game.max_turns
        if scores:
            best = max(scores.values())
            top = sorted(w for w, v in scores.items() if v == best)
            sure = len(top) == 1 and (best >= 2 or last_turn)
            if sure or rng.random() < eager:
                word = rng.choice(top)
                if rng.random() < careless:
                    return f"Is it about {word}?"
                return f"I know the word! It is {word}."
        return rng.choice(ASK_TEMPLATES)

    return defender_bot


defender_bot = make_defender_bot()


def scripted_bot(game: Any, state: Any, rng: random.Random) -> str:
    """The attacker bot or the defender bot, whichever role is to move."""
    bot = attacker_bot if game.current_player(state) == ATTACKER else defender_bot
    return bot(game, state, rng)


def play_bot_game(game: Any, target: str, rng: random.Random,
                  attacker: Bot = attacker_bot,
                  defender: Bot = defender_bot) -> tuple[list[tuple[Any, str]], Any]:
    """One game from ``target``: every (state before the move, utterance), and the end."""
    state = game.state_for(target)
    moves = []
    while not game.is_terminal(state):
        bot = attacker if game.current_player(state) == ATTACKER else defender
        u = bot(game, state, rng)
        moves.append((state, u))
        state = game.apply(state, u)
    return moves, state


def bot_transcripts(game: Any, n_games: int, seed: int = 0, careless: float = 0.1,
                    eager: float = 0.2) -> list[tuple[str, str]]:
    """(prompt, answer) pairs of ``n_games`` bot-vs-bot games in the text protocol: the
    mover's ``observation_text`` and ``<move>utterance</move>``. Targets are drawn from the
    game's words with ``seed`` (give it the association table's words,
    ``Taboo(words=sorted(associations()))``, so the bots have clues)."""
    rng = random.Random(seed)
    defender = make_defender_bot(careless, eager)
    pairs = []
    for _ in range(n_games):
        moves, _ = play_bot_game(game, rng.choice(game.words), rng, defender=defender)
        for state, u in moves:
            player = game.current_player(state)
            pairs.append((game.observation_text(state, player), format_answer(game.action_text(u))))
    return pairs

