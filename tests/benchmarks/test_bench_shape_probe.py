"""``benchmarks/bench_shape_probe.py``: its board formats, its rows and its step timing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lmselfplay.games import make

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_shape_probe import (  # noqa: E402
    FORMATS,
    GRIDS,
    control_data,
    encode,
    main_job_step_seconds,
    main_job_turns,
    parse_row,
    train_row,
    vocabulary,
)


def _position():
    g = make("tictactoe")
    s = g.new_initial_state()
    for a in (0, 4):  # X on 1, O on 5: X to move
        s = g.apply(s, a)
    return s


def _words(ids):
    names = {i: w for w, i in vocabulary().items()}
    return [names[i] for i in ids]


def test_each_format_writes_the_board_its_docstring_says():
    s = _position()
    v = vocabulary()
    assert _words(encode(s, "cells", v)) == ["<bos>", "X", "|", "X", ".", ".", "\n", ".", "O", ".", "\n",
                                             ".", ".", ".", "\n", "A"]
    assert _words(encode(s, "digits", v))[3:7] == ["X", "2", "3", "\n"]
    assert _words(encode(s, "named2", v))[3:9] == ["1", "X", "2", ".", "3", "."]
    assert _words(encode(s, "fused", v))[3:10] == ["1X", "2.", "3.", "\n", "4.", "5O", "6."]
    assert _words(encode(s, "fused", v, legal_list=True))[-9:] == ["|", "2", "3", "4", "6", "7", "8", "9", "A"]


def test_a_fused_token_names_its_cell_and_content_and_no_two_cells_share_one():
    v = vocabulary()
    ids, att, legal, target = control_data("fused")
    assert ids.shape == (4520, 16) and bool(att.all())
    cell_ids = ids[:, 3:15][:, [k for k in range(12) if k % 4 != 3]]  # the 9 cells, without the newlines
    for k in range(9):  # cell k's column holds only cell k's three tokens
        assert set(cell_ids[:, k].tolist()) <= {v[f"{k + 1}{m}"] for m in ".XO"}
    assert torch.allclose(target.sum(-1), torch.ones(4520)) and bool((target > 0).le(legal).all())


def test_legal_lists_left_pad_so_the_answer_slot_is_the_last_column():
    ids, att, legal, _ = control_data("digits", legal_list=True)
    assert bool((ids[:, -1] == vocabulary()["A"]).all())
    assert (att.sum(-1) == 16 + 1 + legal.sum(-1)).all()  # prompt + "|" + one token per legal move


def test_every_grid_row_parses_and_a_bad_row_is_a_one_line_error():
    for rows in GRIDS.values():
        for text in rows:
            assert parse_row(text)["format"] in FORMATS
    with pytest.raises(SystemExit, match="unknown row key 'depth'"):
        parse_row("depth=2")
    with pytest.raises(SystemExit, match="unknown format 'grid'"):
        parse_row("format=grid")


def test_a_row_trains_and_repeats_exactly():
    torch.set_num_threads(1)
    curve, params = train_row(parse_row("layers=1,width=16,heads=2"), [2])
    again, _ = train_row(parse_row("layers=1,width=16,heads=2"), [2])
    assert [c["step"] for c in curve] == [0, 2] and params > 0
    assert [c["p_optimal"] for c in curve] == [c["p_optimal"] for c in again]
    assert 0.0 < curve[-1]["p_optimal"] < 1.0


@pytest.mark.parametrize("row", ["arch=gpt2,layers=1,width=16,heads=2,prior_steps=1",
                                 "arch=mlp,layers=1,width=16,format=fused"])
def test_every_architecture_trains(row):
    torch.set_num_threads(1)
    curve, _ = train_row(parse_row(row), [1])
    assert curve[-1]["p_optimal"] != curve[0]["p_optimal"]


def test_the_step_workload_is_the_main_jobs_mix_and_is_timed():
    turns = main_job_turns({"nim": 2, "tictactoe": 1, "kuhn_poker": 2})
    assert any(t.startswith("Game: nim") for t in turns) and any("tictactoe" in t for t in turns)
    assert sum("kuhn_poker" in t for t in turns) >= 2  # every Kuhn hand has at least two turns
    assert main_job_step_seconds(parse_row("layers=1,width=32"), turns[:4], answer_tokens=2) > 0
    assert main_job_step_seconds(parse_row("arch=mlp"), turns) is None
