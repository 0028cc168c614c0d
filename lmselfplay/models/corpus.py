"""The embedded model's corpus of game text: turns of random legal play, reading and judge-format
questions, generated from a ``random.Random`` (no data download), so a given seed always gives
the same text. The word problems and programs it also trains on are the project's shared task
generators (:mod:`lmselfplay.tasks`).

* :func:`game_turns` — (prompt, answer) pairs from uniformly random legal play of any
  game that follows the Game protocol, in the exact text protocol the rollouts use;
* :func:`reading_task` — "repeat line k of this game text": makes the model READ its
  observation (see the function for why random-move turns alone do not);
* :func:`grid_reading_task` / :func:`two_option_task` — board-cell questions and the
  debate judge's A/B format.
"""

from __future__ import annotations

import random
import re
from typing import Any

from lmselfplay.games.base import CHANCE, random_legal_reset, resolve_chance
from lmselfplay.games.text import format_answer
from lmselfplay.tasks.arithmetic import arithmetic_problem

# --- game turns -----------------------------------------------------------------------

def game_decisions(game: Any, rng: random.Random, n: int,
                   max_reset_plies: int = 12) -> list[tuple[Any, int, int]]:
    """``n`` (state, player, action) decision points of uniformly random legal play.

    Each playout starts from :func:`~lmselfplay.games.base.random_legal_reset` (so late
    positions are as common as early ones), then plays random legal moves to the end;
    every turn of either player is one decision point.
    """
    out: list[tuple[Any, int, int]] = []
    while len(out) < n:
        state = random_legal_reset(game, rng, max_reset_plies)
        while not game.is_terminal(state) and len(out) < n:
            player = game.current_player(state)
            if player == CHANCE:
                state = resolve_chance(game, state, rng)
                continue
            action = rng.choice(game.legal_actions(state))
            out.append((state, player, action))
            state = resolve_chance(game, game.apply(state, action), rng)
    return out


def reset_plies(game: Any, default: int = 12) -> int:
    """How deep a random-play playout may start: ``default`` plies, or half the game's ply
    cap when it has one (Go: 81 of 162 on 9x9), because a playout contributes only its
    first turns to a buffer and long games would otherwise be seen only in their opening."""
    cap = getattr(game, "max_plies", None)
    return max(default, int(cap) // 2) if cap else default


def scripted_turns(game: Any, rng: random.Random, n: int) -> list[tuple[str, str]]:
    """``n`` (prompt, answer) turns of games played by ``game.scripted_action`` on every
    seat from a random chance draw (Taboo: a random secret word), in the text protocol."""
    out: list[tuple[str, str]] = []
    while len(out) < n:
        state = resolve_chance(game, game.new_initial_state(), rng)
        while not game.is_terminal(state) and len(out) < n:
            player = game.current_player(state)
            action = game.scripted_action(state, rng)
            out.append((game.observation_text(state, player), format_answer(game.action_text(action))))
            state = resolve_chance(game, game.apply(state, action), rng)
    return out


def game_turns(game: Any, rng: random.Random, n: int, max_reset_plies: int = 12) -> list[tuple[str, str]]:
    """``n`` (prompt, answer) pairs of uniformly random legal play, in the text protocol:
    ``observation_text(state, player)`` and ``format_answer(action_text(a))`` for the
    random legal action ``a`` played there (see :func:`game_decisions`)."""
    return [(game.observation_text(s, p), format_answer(game.action_text(a)))
            for s, p, a in game_decisions(game, rng, n, max_reset_plies)]



READING_QUESTION = 'Question: repeat the line above that starts with "{cue}".'


def reading_task(game: Any, rng: random.Random, max_reset_plies: int = 12) -> tuple[str, str]:
    """(prompt, answer): a player's observation at a random decision point of random play,
    then "repeat the line that starts with <its first words>"; the answer is that line.

    Why: the move targets of :func:`game_turns` are uniform over the legal moves, and the
    legal moves are listed in the prompt, so a model trained on them alone learns to copy
    the list and ignore the rest. In Kuhn poker the list never changes: the built model was
    exactly card-blind, and neither RL nor even supervised card-dependent targets (60 full
    batches at lr 1e-3) moved it. Finding a line by its first words and copying it (an
    induction task) makes the answer position attend to every part of the observation
    (cards, board rows, history): the routing RL later needs. It teaches no strategy: the
    answer is in the prompt. The cue is the shortest word prefix naming one line only.
    """
    for _ in range(100):
        state, player, _ = game_decisions(game, rng, 1, reset_plies(game, max_reset_plies))[0]
        lines = [ln.strip() for ln in game.observation_text(state, player).splitlines() if ln.strip()]
        for k in rng.sample(range(len(lines)), len(lines)):
            if "<move>" in lines[k]:  # the answer-format line: copying it would teach tags
                continue
            words = lines[k].split()
            for n in range(1, len(words)):
                cue = " ".join(words[:n])
                if sum(ln.startswith(cue) for ln in lines) == 1:
                    return f"{chr(10).join(lines)}\n{READING_QUESTION.format(cue=cue)}", lines[k]
    raise ValueError(f"{game.name}: no observation line can be named by a unique prefix of its words")


# --- grid reading (a lever for board games; weight 0 in the default build) ----------

GRID_CELL_QUESTION = "Question: what is in cell {k} of the board (counting row by row from 1)?"
GRID_LINE_QUESTION = "Question: which empty cells would complete a full line of {mark}?"


NAMED_CELL = re.compile(r"[1-9][^\d\s]")  # a cell that names itself: "5X" (tic-tac-toe's cells text)


def board_row(line: str) -> list[str] | None:
    """The cells of one board row, or None: n >= 3 one-character cells separated by spaces
    (``X 2 O``), or n >= 3 named cells written together (``1X2_3O``: digit, then content)."""
    cells = line.split()
    if len(cells) >= 3 and all(len(c) == 1 for c in cells):
        return cells
    named = NAMED_CELL.findall(line)
    return named if len(named) >= 3 and "".join(named) == line.strip() else None


def board_grid(text: str) -> list[list[str]] | None:
    """The square board in an observation: the longest run of consecutive lines that are
    board rows (:func:`board_row`) of the same number n >= 3 of cells, with n such lines; else None."""
    best: list[list[str]] = []
    run: list[list[str]] = []
    for line in text.splitlines():
        cells = board_row(line)
        if cells is not None and (not run or len(cells) == len(run[0])):
            run.append(cells)
        else:
            run = [cells] if cells is not None else []
        if len(run) > len(best):
            best = list(run)
    return best if best and len(best) == len(best[0]) else None


def cell_content(cell: str) -> str:
    """What a shown cell holds: its symbol, or a named cell's content (``5X`` -> ``X``); a
    digit, ``.`` or ``_`` is an empty cell."""
    return cell[-1]


def is_empty_cell(cell: str) -> bool:
    content = cell_content(cell)
    return content.isdigit() or content in "._"


def grid_lines(n: int) -> list[list[int]]:
    """Rows, columns and both diagonals of an n x n grid, as row-major cell indices."""
    rows = [[r * n + c for c in range(n)] for r in range(n)]
    cols = [[r * n + c for r in range(n)] for c in range(n)]
    return rows + cols + [[i * n + i for i in range(n)], [i * n + n - 1 - i for i in range(n)]]


def grid_reading_task(game: Any, rng: random.Random, max_reset_plies: int = 12) -> tuple[str, str] | None:
    """(prompt, answer) reading a square board at a random decision point, or None when the
    game's observation shows no square board.

    Two questions, half each: what is in cell k (the cell as shown: ``X``, ``7``, or a named
    cell ``7_``), and which empty cells would complete a full line (row, column, diagonal)
    of one mark, given as those cells as shown, ascending, or ``none``. Why: tic-tac-toe
    positions are decided by threats, and a model that only ever saw the legal-move list
    copied need not see them (the supervised control in
    ``benchmarks/bench_ttt_representation.py``). It is still reading, not strategy: no
    question says which move is good, and no answer is a move. A cell is empty when it
    shows a digit, ``.`` or ``_`` (:func:`is_empty_cell`); marks are the other contents.
    """
    state, player, _ = game_decisions(game, rng, 1, max_reset_plies)[0]
    text = game.observation_text(state, player)
    grid = board_grid(text)
    if grid is None:
        return None
    cells = [c for row in grid for c in row]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "<move>" not in ln]
    if rng.random() < 0.5:
        k = rng.randrange(len(cells))
        return f"{chr(10).join(lines)}\n{GRID_CELL_QUESTION.format(k=k + 1)}", cells[k]
    empty = [is_empty_cell(c) for c in cells]
    marks = sorted({cell_content(c) for c, e in zip(cells, empty) if not e}) or ["X"]
    mark = rng.choice(marks)
    done = set()
    for line in grid_lines(len(grid)):
        holes = [i for i in line if empty[i]]
        if len(holes) == 1 and all(cell_content(cells[i]) == mark for i in line if i != holes[0]):
            done.add(holes[0])
    answer = " ".join(cells[i] for i in sorted(done)) or "none"
    return f"{chr(10).join(lines)}\n{GRID_LINE_QUESTION.format(mark=mark)}", answer


# --- two-option questions (the judge's format: pick the correct one of two answers) -----

TWO_OPTION_QUESTION = "Which answer is correct? Reply A or B."


def near_wrong(value: int, rng: random.Random) -> int:
    """A wrong answer close to ``value`` (off by 1-3, never negative when value is not)."""
    while True:
        wrong = value + rng.choice((-3, -2, -1, 1, 2, 3))
        if wrong != value and (wrong >= 0 or value < 0):
            return wrong


def two_option_task(rng: random.Random) -> tuple[str, str]:
    """(prompt, label): an arithmetic word problem WITH its worked lines, two labelled final
    answers (the correct one and a near miss, in random order) and the question which is
    correct; the label is ``A`` or ``B``.

    Why: the debate judge reads exactly this shape (question, evidence, ``A: ..``, ``B: ..``,
    "Reply A or B") and a model never trained on it answers at chance whatever the
    speeches say. The worked lines are in the prompt, so the task is reading the evidence
    and matching it to an option (the last line's number), not solving the problem.
    """
    p = arithmetic_problem(rng)
    right = int(p["final"])
    options = [str(right), str(near_wrong(right, rng))]
    first = rng.random() < 0.5
    if not first:
        options.reverse()
    work = p["answer"].rsplit("####", 1)[0].strip()
    lines = [f"Question: {p['prompt']}", "Context:", work, f"A: {options[0]}", f"B: {options[1]}",
             TWO_OPTION_QUESTION]
    return "\n".join(lines), "A" if first else "B"
