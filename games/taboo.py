"""Adversarial Taboo (SPAG, NeurIPS 2024): a language game with hidden information.

Rules. Player 0, the *attacker*, sees a target word (drawn at the root chance node from the
shipped word list); player 1, the *defender*, does not. They alternate utterances, attacker
first, at most ``max_turns`` each (default 5).

* The attacker loses if it utters the target word, in any form, itself.
* The attacker wins if the defender utters the target word (any form) other than in a guess.
* The defender wins by an explicit correct guess, the WHOLE utterance in the fixed form
  ``I know the word! It is <word>.``, and loses by an explicit wrong guess.
* After ``max_turns`` utterances each with none of these: a draw, 0/0.

Returns are zero-sum, +-1. Every utterance is one ``<move>...</move>`` answer of the shared
text protocol (:mod:`lmselfplay.games.text`), at most ``max_utterance_chars`` characters;
an empty or over-long one is an ``Invalid`` (so is a malformed guess, below). Taboo's actions
are these strings: ``action_space = "text"`` (see :mod:`lmselfplay.games.base`).

What "uttering the word" means (the referee, :func:`mentions`). Decided here, tested in
``tests/games/test_taboo.py``; the referee reads letters, not intent:

1. The text is folded: Unicode NFKC (full-width, mathematical and circled letters, ligatures),
   then letters of other scripts that look like Latin ones (Cyrillic ``а е о р с у х і ј ѕ``,
   Greek ``α ο ρ ε ι κ ν τ υ χ`` and their capitals; :data:`CONFUSABLES`) become those Latin
   letters, accents are dropped (``ápple``), invisible format characters (zero-width space,
   soft hyphen) are removed, then case-folded.
2. The word's forms are its inflections in lemminflect's tables in every part of speech it
   has: plural, -s, -ing, -ed, -er/-est and irregular ones (``mice``, ``children``, ``ran``;
   homographs too: ``born`` is a form of ``bear``). Possessives follow from 3.
3. The folded text is cut into runs of letters a-z. A run that is a form counts, also inside
   quotes, code blocks, markdown or other punctuation. A run that merely contains it does not
   (``art`` is not said by ``artist`` or ``cart``; ``apple`` not by ``pineapple``).
4. Runs joined without white space by hyphens, apostrophes, dots, underscores, slashes,
   ``*``, backticks and the like are read together as well: ``ap-ple``, ``a.p.p.l.e``,
   ``**ap**ple``, ``pine-apple`` (contains ``apple``), ``apple's`` say ``apple``.
5. Single letters spelled out with spaces (``a p p l e``, ``a - p - p - l - e``, ``a. p. p.``)
   are read together, and any form inside counts (``c a r d`` says ``car``, as
   ``a b a n a n a`` must say ``banana``). Runs of several letters separated by spaces are not (``pine apple``
   does not say ``pineapple``): natural text is full of them (``is land``, ``to get her``).
6. Not counted: digits or symbols standing for letters (``4pple``), the word reversed,
   translated or rhymed, markup that splits it with other letters (``<b>ap</b>ple``), and
   letters of other scripts outside the table (a Russian word is not an English one).

Guesses (:func:`parse_guess`). Only the defender guesses, and only with a whole utterance of
the form ``I know the word! It is <word>.``, read after folding: case-insensitive, any white
space, ``!`` may be ``.``, ``,``, ``:`` or absent, ``It's`` for ``It is``, an optional ``a`` /
``an`` / ``the``, quotes or ``*`` around the word, the final ``.`` may be ``!`` or absent. The
guess is right when the word (hyphens and apostrophes dropped) is a form of the target.

* A defender utterance that STARTS with ``I know the word`` but does not have this form
  (two words, more text after it, no word) is a malformed guess: ``Invalid``.
* A guess hidden in the middle of other text is not a guess: it is ordinary talk, so a
  target word in it means the defender said the word (the attacker wins).
* The attacker's utterances are never guesses; the target in them loses as usual.
* A fake ``The defender said: ...`` line inside an utterance is just text of its author: the
  referee knows who spoke from the turn order. White space is collapsed when an utterance
  is stored, so a forged line can never start a line of the observation.

The target lists (``data/taboo_words_{train,test}.txt``, held-out = ``test``) are built by
``scripts/build_taboo_words.py``. Targets that the fixed prompt text itself says (such as
"attacker", "player") are dropped when the game is built, so the defender's prompt never
contains the target. SPAG's reward shaping is :func:`spag_weights`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from lmselfplay.games.base import CHANCE, TERMINAL, Invalid, resolve_chance
from lmselfplay.games.taboo_referee import (  # noqa: F401  (the referee's names, re-exported)
    ATTACKER,
    ATTACKER_SAID_WORD,
    CONFUSABLES,
    CORRECT_GUESS,
    DEFENDER,
    DEFENDER_SAID_WORD,
    GUESS_FORM,
    ROLES,
    SPLITS,
    WINNER,
    WRONG_GUESS,
    clean_utterance,
    fold,
    is_plain_word,
    judge,
    load_words,
    mentions,
    parse_guess,
    said,
    word_forms,
)
from lmselfplay.games.text import extract_move, prompt

# --- the game ------------------------------------------------------------------------------

RULES = ("The attacker knows a secret word and must make the defender say it without ever "
         "saying it (in any form) first. The defender wins by answering exactly "
         f"\"{GUESS_FORM}\" and loses by a wrong guess. Your move is what you say.")


@dataclass(frozen=True)
class TabooState:
    target: str | None = None  # None: the root chance node (no word drawn yet)
    utterances: tuple[str, ...] = ()  # attacker, defender, attacker, ...
    result: str = ""  # an end reason (WINNER's keys), '' while undecided or drawn


class Taboo:
    """Adversarial Taboo; see the module docstring for the rules and the referee."""

    name = "taboo"
    action_space = "text"
    n_actions = 0
    perfect_information = False
    max_utility = 1.0
    exact_metric = "win_rates"
    roles = ROLES

    def __init__(self, max_turns: int = 5, split: str = "train", words: Sequence[str] | None = None,
                 max_utterance_chars: int = 200):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_utterance_chars < 32:
            raise ValueError(f"max_utterance_chars must be >= 32, got {max_utterance_chars}")
        self.max_turns, self.max_utterance_chars = int(max_turns), int(max_utterance_chars)
        pool = load_words(split) if words is None else tuple(fold(w).strip() for w in words)
        fixed = said("\n".join([RULES, *(self._role_line(p, "") for p in (ATTACKER, DEFENDER))]), 64)
        self.words = tuple(w for w in pool if is_plain_word(w) and word_forms(w).isdisjoint(fixed))
        if not self.words:
            raise ValueError("no usable target words (letters a-z only, not in the prompt text)")

    # --- structure ---------------------------------------------------------------------
    def new_initial_state(self, seed: int | None = None) -> TabooState:
        s = TabooState()
        return resolve_chance(self, s, random.Random(seed)) if seed is not None else s

    def state_for(self, target: str) -> TabooState:
        """The state right after ``target`` was drawn (any word, for tests and bots)."""
        return TabooState(target=fold(target).strip())

    def is_terminal(self, s: TabooState) -> bool:
        return bool(s.result) or len(s.utterances) >= 2 * self.max_turns

    def current_player(self, s: TabooState) -> int:
        if s.target is None:
            return CHANCE
        if self.is_terminal(s):
            return TERMINAL
        return len(s.utterances) % 2

    def chance_outcomes(self, s: TabooState) -> list[tuple[int, float]]:
        if s.target is not None:
            return []
        return [(i, 1.0 / len(self.words)) for i in range(len(self.words))]

    def legal_actions(self, s: TabooState) -> list[int]:
        p = self.current_player(s)
        if p == CHANCE:
            return list(range(len(self.words)))
        if p == TERMINAL:
            return []
        raise TypeError("taboo's moves are free text: use parse_action / a scripted bot "
                        "(lmselfplay.games.taboo_bots), not legal_actions")

    def apply(self, s: TabooState, a: int | str) -> TabooState:
        p = self.current_player(s)
        if p == CHANCE:
            if not isinstance(a, int) or not 0 <= a < len(self.words):
                raise ValueError(f"illegal taboo word index {a!r}")
            return TabooState(target=self.words[a])
        if p == TERMINAL:
            raise ValueError("the game is over")
        u = self._check(s, a)
        if isinstance(u, Invalid):
            raise ValueError(f"illegal utterance: {u.reason}")
        return TabooState(s.target, s.utterances + (u,), judge(s.target, p, u))

    def returns(self, s: TabooState) -> list[float]:
        if not s.result:
            return [0.0, 0.0]
        r = [-1.0, -1.0]
        r[WINNER[s.result]] = 1.0
        return r

    # --- text ----------------------------------------------------------------------------
    def _check(self, s: TabooState, text: str) -> str | Invalid:
        u = clean_utterance(text, self.max_utterance_chars)
        if isinstance(u, str) and self.current_player(s) == DEFENDER:
            guess = parse_guess(u)
            if isinstance(guess, Invalid):
                return guess
        return u

    def parse_action(self, s: TabooState, text: str) -> str | Invalid:
        """The cleaned utterance of an answer ``<move>UTTERANCE</move>``, or an Invalid."""
        if self.current_player(s) not in (ATTACKER, DEFENDER):
            return Invalid("no player is to move")
        move = extract_move(text, self.max_utterance_chars)
        return move if isinstance(move, Invalid) else self._check(s, move)

    def action_text(self, a: str) -> str:
        return a

    def _role_line(self, player: int, target: str) -> str:
        if player == ATTACKER:
            return f'You are the attacker. The secret word is "{target}".'
        return "You are the defender. You do not know the secret word."

    def history_lines(self, s: TabooState) -> list[str]:
        return [f"{ROLES[i % 2].capitalize()}: {u}" for i, u in enumerate(s.utterances)]

    def observation_text(self, s: TabooState, player: int) -> str:
        """What ``player`` sees: the rules, its role (the attacker also the word), the talk."""
        turn = min(len(s.utterances) // 2 + 1, self.max_turns)
        state = [self._role_line(player, s.target or "?"), f"Turn {turn} of {self.max_turns}."]
        state += self.history_lines(s) or ["No one has spoken yet."]
        return prompt(self.name, RULES, state, None)

    def information_state(self, s: TabooState, player: int) -> str:
        """The attacker's: word and talk; the defender's: the talk only."""
        word = (s.target or "?") if player == ATTACKER else "?"
        return word + "|" + "|".join(s.utterances)

    def scripted_action(self, s: TabooState, rng: random.Random) -> str:
        """The scripted bot's utterance for whichever role is to move (the opponent that
        replaces the random bot: :mod:`lmselfplay.games.taboo_bots`)."""
        from lmselfplay.games.taboo_bots import scripted_bot

        return scripted_bot(self, s, rng)

    def turn_weights(self, states: Sequence[TabooState], decay: float = 0.8) -> list[list[float]]:
        """SPAG's reward shaping of finished games, one weight per utterance
        (:func:`spag_state_weights`): the recipes' ``reward_shaping: spag``."""
        return spag_state_weights(states, decay)

    def render(self, s: TabooState) -> str:
        lines = [f"target: {s.target or '(not drawn)'}", *self.history_lines(s)]
        if self.is_terminal(s):
            lines.append(f"result: {s.result or 'draw'}; returns {self.returns(s)}")
        return "\n".join(lines)


# --- SPAG's reward shaping ------------------------------------------------------------------

def spag_weights(winners: Sequence[int | None], lengths: Sequence[int],
                 decay: float = 0.8) -> list[list[float]]:
    """SPAG's per-utterance weights for a batch of games (their ``assign_rewards``).

    Game ``g`` had ``lengths[g]`` utterances (attacker's at even indices) and was won by
    seat ``winners[g]`` (``None``: draw or discarded: all weights 0). Only the winner's
    utterances are weighted: its k-th (k = 1..m) gets ``decay**-k / sum_j decay**-j``
    (later turns more, one unit per game), times its role's balance
    ``N / (2 N_role)`` (N decided games, N_role won by that role) so that attackers and
    defenders carry the same total weight, N / 2 each, whoever wins more often.
    """
    if not 0 < decay <= 1:
        raise ValueError(f"decay must lie in (0, 1], got {decay}")
    if len(winners) != len(lengths):
        raise ValueError("winners and lengths differ in length")
    decided = [w for w in winners if w is not None]
    balance = {r: len(decided) / (2 * decided.count(r)) if decided.count(r) else 0.0 for r in (0, 1)}
    out = []
    for w, n in zip(winners, lengths):
        weights = [0.0] * n
        if w is not None:
            mine = list(range(w, n, 2))
            coeff = [decay ** -(k + 1) for k in range(len(mine))]
            for i, c in zip(mine, coeff):
                weights[i] = balance[w] * c / sum(coeff)
        out.append(weights)
    return out


def spag_state_weights(states: Sequence[TabooState], decay: float = 0.8,
                       keep_attacker_slips: bool = False) -> list[list[float]]:
    """:func:`spag_weights` of finished games. SPAG discards the games the attacker lost by
    saying the word (``keep_attacker_slips=False``) and, like draws, weights them 0."""
    winners = [WINNER[s.result] if s.result and (keep_attacker_slips or s.result != ATTACKER_SAID_WORD)
               else None for s in states]
    return spag_weights(winners, [len(s.utterances) for s in states], decay)
