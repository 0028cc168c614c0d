"""The v7 embedded build's code path at tiny size: tic-tac-toe's cells text (one token per cell
that names it), the tokenizer that holds its 27 cell strings as one token each, the board-reading
questions on those cells, the build config, and the game parameters a build records and every
recipe and evaluation reads back (v7 is the default build; v6 and hub models keep the game's own text)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from lmselfplay import games
from lmselfplay.games import model_texts
from lmselfplay.games.base import Invalid
from lmselfplay.games.text import ANSWER_INSTRUCTION, format_answer
from lmselfplay.games.tictactoe import CELL_STRINGS, TicTacToe
from lmselfplay.lm.prompt import encode_completion, encode_prompt
from lmselfplay.models import cache as tiny_cache
from lmselfplay.models import corpus, pretrain, tiny
from lmselfplay.models import tokenizer as tiny_tokenizer
from lmselfplay.models.policy import resolve_model_path

SMALL = dict(hidden_size=32, num_heads=2, intermediate_size=64, train_steps=4, batch_size=8, warmup_steps=2,
             tokenizer_texts=400, vocab_size=1024, max_seq_len=512)


def small_v7(**kw) -> tiny.TinyConfig:
    return tiny.build_config("v7", **(SMALL | kw))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("v7") / "model"
    pretrain.build_tiny_model(small_v7(), out, progress=False)
    return out


@pytest.fixture(scope="module")
def tok(built):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(built)


def _after(s, *moves):
    g = TicTacToe(board="cells")
    for m in moves:
        s = g.apply(s, m)
    return s


def test_the_cells_text_names_every_cell_and_puts_the_board_by_the_answer():
    g = TicTacToe(board="cells")
    s = _after(g.new_initial_state(), 4, 0, 8)  # X 5, O 1, X 9; O to move
    assert g.board_text(s) == ["1O2_3_", "4_5X6_", "7_8_9X"]
    lines = g.observation_text(s, 1).splitlines()
    assert lines == ["Game: tictactoe. Get three in a row.", ANSWER_INSTRUCTION, "You play O.", "1O2_3_", "4_5X6_",
                     "7_8_9X"]
    empty = [c[0] for c in corpus.NAMED_CELL.findall("".join(lines[-3:])) if c.endswith("_")]
    assert empty == [g.action_text(a) for a in g.legal_actions(s)]  # the board names every legal move
    assert len(CELL_STRINGS) == 27 and len(set(CELL_STRINGS)) == 27


def test_the_default_text_is_the_games_own():
    g = games.make("tictactoe")
    assert g.board == "digits" and g.token_strings == ()
    s = _after(g.new_initial_state(), 4, 0)
    assert g.observation_text(s, 0) == ("Game: tictactoe. Get three in a row.\nYou play X.\nO 2 3\n4 X 6\n7 8 9\n"
                                        f"Legal moves: 2 3 4 6 7 8 9\n{ANSWER_INSTRUCTION}")
    with pytest.raises(ValueError, match="unknown tic-tac-toe board text"):
        games.make("tictactoe", board="hex")


def test_the_cells_text_parses_every_legal_answer_and_never_raises():
    g = TicTacToe(board="cells")
    s = _after(g.new_initial_state(), 4, 0)
    for a in g.legal_actions(s):
        assert g.parse_action(s, format_answer(g.action_text(a))) == a
    for bad in ("<move>5</move>", "<move>1</move>", "<move>5X</move>", "<move>2_</move>", "", None, 7,
                "<move></move>", "<move>" * 40, "</move><move>3"):
        assert isinstance(g.parse_action(s, bad), Invalid)


def test_every_cell_string_is_one_token_and_no_other_text_gains_one(tok):
    for cell in CELL_STRINGS:
        assert len(tok(cell, add_special_tokens=False)["input_ids"]) == 1, cell
    assert tok.convert_ids_to_tokens(tok("1X2_3O", add_special_tokens=False)["input_ids"]) == ["1X", "2_", "3O"]
    arithmetic = "She pays 12.5 dollars for 3 pens. 7 - 2 = 5."
    assert not set(tok.convert_ids_to_tokens(tok(arithmetic, add_special_tokens=False)["input_ids"])) & set(CELL_STRINGS)
    for a in range(9):  # every move stays one token after <move>
        assert len(encode_completion(tok, format_answer(str(a + 1)), eos=False)) == 3


def test_the_tokenizer_round_trips_every_corpus_kind(tok):
    c = pretrain.Corpus(small_v7(), random.Random(3))
    ttt = 0
    for _ in range(300):
        prompt, answer, _ = c.sample()
        ttt += "Game: tictactoe" in prompt
        for text in (prompt, answer):
            assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    assert ttt > 0


def test_the_corpus_plays_the_cells_text_toward_the_random_prior(tok):
    c = pretrain.Corpus(small_v7(), random.Random(5))
    g = c.games["tictactoe"]
    assert g.board == "cells"
    prompt, answer, legal = next(t for t in (c.sample() for _ in range(2000)) if "Game: tictactoe" in t[0])
    assert prompt.splitlines()[-4].startswith("You play") and answer in legal
    last = prompt.splitlines()[-1]
    assert tok.convert_ids_to_tokens(tok(last, add_special_tokens=False)["input_ids"]) == corpus.NAMED_CELL.findall(last)
    assert len(encode_prompt(tok, prompt)) < 45  # the whole turn is short: the board dominates it


def test_grid_reading_reads_named_cells():
    g = TicTacToe(board="cells")
    seen = set()
    rng = random.Random(0)
    for _ in range(200):
        prompt, answer = corpus.grid_reading_task(g, rng)
        rows = [r for r in prompt.splitlines() if corpus.board_row(r)]
        cells = [c for r in rows for c in corpus.board_row(r)]
        assert len(cells) == 9
        if "what is in cell" in prompt:
            k = int(prompt.split("cell ")[1].split()[0])
            assert answer == cells[k - 1] and answer in CELL_STRINGS
            seen.add("cell")
        else:
            mark = prompt.split("line of ")[1].rstrip("?")
            for hole in ([] if answer == "none" else answer.split()):
                assert hole.endswith("_") and hole in cells
                k = int(hole[0]) - 1
                assert any(k in line and all(cells[i][-1] == mark for i in line if i != k)
                           for line in corpus.grid_lines(3))
            seen.add("line")
    assert seen == {"cell", "line"}
    # the game's own board reads as before
    assert corpus.board_grid("X 2 O\n4 X 6\n7 8 O") == [["X", "2", "O"], ["4", "X", "6"], ["7", "8", "O"]]


def test_the_build_records_its_game_text_and_every_reader_makes_the_game_with_it(built):
    config = json.loads((built / "config.json").read_text())
    assert config[model_texts.GAME_PARAMS_ATTR] == "tictactoe.board=cells"
    assert config["num_hidden_layers"] == 2 and config["num_attention_heads"] == 2  # SMALL's heads
    assert model_texts.game_params_of(built) == {"tictactoe": {"board": "cells"}}
    assert model_texts.make_game_for("tictactoe", built).board == "cells"
    assert model_texts.make_game_for("nim", built).name == "nim"
    assert model_texts.make_game_for("tictactoe", resolve_model_path(None)).board == "cells"  # the default build (v7)
    assert model_texts.make_game_for("tictactoe", resolve_model_path("embedded")).board == "cells"
    assert model_texts.make_game_for("tictactoe", None).board == "digits"  # no model folder: the registry's text
    assert model_texts.game_params_of("org/some-hub-model") == {}
    assert model_texts.make_game_for("tictactoe", "org/some-hub-model").board == "digits"
    from lmselfplay.selfplay_games.steps import make_games

    assert [g.board for g in make_games("nim,tictactoe", str(built)) if g.name == "tictactoe"] == ["cells"]
    assert [g.board for g in make_games("tictactoe")] == ["cells"]
    assert [g.board for g in make_games("tictactoe", "org/some-hub-model")] == ["digits"]


def test_a_checkpoint_saved_from_the_build_keeps_its_game_text(built, tmp_path):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(built).save_pretrained(tmp_path / "trained")
    assert model_texts.game_params_of(tmp_path / "trained") == {"tictactoe": {"board": "cells"}}


def test_the_v7_config_and_earlier_keys():
    v7 = tiny.build_config("v7")
    assert (v7.num_layers, v7.hidden_size, v7.num_heads, v7.intermediate_size) == (2, 128, 8, 256)
    assert v7.weights()["grid_reading"] > 0 and v7.game_kwargs() == {"tictactoe": {"board": "cells"}}
    assert tiny_tokenizer.whole_strings(v7) == list(CELL_STRINGS)
    assert tiny_tokenizer.whole_strings(tiny.build_config("v6")) == []
    assert tiny.build_config("v3").key() == tiny.TinyConfig().key() == tiny.TinyConfig(game_params="").key()
    assert tiny.build_config("v6").key() == "51de028e3c98"  # v6's key is unchanged
    assert tiny.DEFAULT_BUILD == "v7" and tiny.build_config().key() == "92ae7ac73836"  # the shipped build
    with pytest.raises(ValueError, match="game.param=value"):
        model_texts.parse_game_params("tictactoe=cells")
    with pytest.raises(ValueError, match="unknown tic-tac-toe board text"):
        tiny.TinyConfig(game_params="tictactoe.board=hex").make_game("tictactoe")


def _weights(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def test_a_killed_v7_build_resumes_to_the_uninterrupted_weights(built, tmp_path):
    state = tmp_path / "state"
    stopped = pretrain.build_tiny_model(small_v7(checkpoint_every=2), tmp_path / "resumed", progress=False,
                                    resume_dir=state, stop_after=2)
    assert stopped["stopped_at"] == 2
    info = pretrain.build_tiny_model(small_v7(checkpoint_every=2), tmp_path / "resumed", progress=False,
                                 resume_dir=state)
    assert info["resumed_at_step"] == 2
    a, b = _weights(built), _weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bootstrap_builds_v7_by_name(tmp_path):
    args = ["--build", "v7", "--cache-dir", str(tmp_path), "--quiet", "--hidden_size", "32", "--num_heads", "2",
            "--intermediate_size", "64", "--train_steps", "1", "--batch_size", "4", "--tokenizer_texts", "300"]
    path = tiny_cache.bootstrap_main(args)
    assert model_texts.game_params_of(path) == {"tictactoe": {"board": "cells"}}
    assert json.loads((path / tiny.INFO_FILE).read_text())["config"]["num_layers"] == 2
