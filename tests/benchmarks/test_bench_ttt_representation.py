"""The board renderings of ``benchmarks/bench_ttt_representation.py`` (a control's levers)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from lmselfplay.games import make

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_ttt_representation import move_token_data, render  # noqa: E402


def _position():
    g = make("tictactoe")
    s = g.new_initial_state()
    for a in (0, 4, 8):  # X 1, O 5, X 9: O to move
        s = g.apply(s, a)
    return g, s


def test_default_is_the_games_own_text():
    g, s = _position()
    assert render(g, s, 1) == g.observation_text(s, 1)


def test_formats_show_every_cell_and_last_puts_the_board_before_the_answer():
    g, s = _position()
    assert render(g, s, 1, "grid").splitlines()[2:5] == ["X..", ".O.", "..X"]
    assert render(g, s, 1, "named").splitlines()[2:5] == ["1X 2. 3.", "4. 5O 6.", "7. 8. 9X"]
    last = render(g, s, 1, "grid_last").splitlines()
    assert last[1].startswith("Legal moves: 2 3 4 6 7 8") and last[-4:] == ["You play O.", "X..", ".O.", "..X"]
    with pytest.raises(ValueError, match="unknown format"):
        render(g, s, 1, "nope")


def test_rows_end_with_the_move_token_and_name_only_optimal_legal_moves():
    from lm_fixtures import tiny_tokenizer

    tok = copy.deepcopy(tiny_tokenizer())  # the fixture is shared: add the move token to a copy
    tok.add_special_tokens({"additional_special_tokens": ["<move>"]})
    rows = move_token_data(tok, make("tictactoe"), fmt="grid_last")
    assert len(rows) == 4520
    open_id = tok.convert_tokens_to_ids("<move>")
    for ids, legal, opt, threats in rows[:200]:
        assert ids[-1] == open_id and set(opt) <= set(legal) and opt and set(threats) <= set(legal)


def test_set_loss_is_minus_log_of_the_mass_on_the_optimal_moves():
    import torch
    from bench_ttt_representation import target_loss

    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5]])
    target = torch.tensor([[0.5, 0.0, 0.0, 0.5]])
    p = torch.softmax(logits, -1)[0]
    assert torch.isclose(target_loss(logits, target, "set"), -torch.log(p[0] + p[3]))
    assert torch.isclose(target_loss(logits, target, "uniform"), -(torch.log(p[0]) + torch.log(p[3])) / 2)
    with pytest.raises(ValueError, match="unknown loss"):
        target_loss(logits, target, "nope")


def test_threat_moves_win_first_then_block_then_anything():
    from bench_ttt_representation import threat_moves

    from lmselfplay.games.tictactoe import TicTacToeState

    # X X . / O O . / . . . : X to move wins at 3 (not the block at 6)
    assert threat_moves(TicTacToeState((1, 1, 0, 2, 2, 0, 0, 0, 0))) == [2]
    # X X . / O . . / . . . : O to move must block at 3
    assert threat_moves(TicTacToeState((1, 1, 0, 2, 0, 0, 0, 0, 0))) == [2]
    # X . . / . . . / . . . : no threat, every empty cell
    assert threat_moves(TicTacToeState((1, 0, 0, 0, 0, 0, 0, 0, 0))) == list(range(1, 9))


def _small_cfg():
    from lmselfplay.models.tiny import TinyConfig

    return TinyConfig(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64, max_seq_len=128)


def _first_block_input(model, arch, ids):
    import torch

    blocks = model.transformer.h if arch == "gpt2" else model.model.layers
    seen = {}

    def grab(module, args, kwargs):
        seen["x"] = (args[0] if args else kwargs["hidden_states"]).detach()

    hook = blocks[0].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        hook.remove()
    return seen["x"]


def test_every_arch_gives_move_logits_and_only_abspos_and_gpt2_put_position_in_the_embedding():
    import torch
    from bench_ttt_representation import fresh_model, move_logits
    from lm_fixtures import tiny_tokenizer

    tok = tiny_tokenizer()
    ids = torch.tensor([[5, 5, 5]])
    rows = [([5, 6, 7], [], [], []), ([5, 6], [], [], [])]
    for arch, positional in (("llama", False), ("llama_abspos", True), ("gpt2", True)):
        torch.manual_seed(0)
        model = fresh_model(arch, _small_cfg(), tok)
        assert model.lm_head.weight is model.get_input_embeddings().weight  # tied, as the embedded model
        emb = _first_block_input(model, arch, ids)  # what the model itself feeds its first block
        assert (not torch.allclose(emb[0, 0], emb[0, 2])) == positional, arch
        assert move_logits(model, rows, tok.pad_token_id).shape == (2, len(tok))
    with pytest.raises(ValueError, match="unknown arch"):
        fresh_model("nope", _small_cfg(), tok)


def test_abspos_keeps_the_tied_head_and_trains_its_positions():
    from bench_ttt_representation import fresh_model, move_logits
    from lm_fixtures import tiny_tokenizer

    tok = tiny_tokenizer()
    model = fresh_model("llama_abspos", _small_cfg(), tok)
    assert model.lm_head.weight is model.model.embed_tokens.embed.weight
    move_logits(model, [([5, 6, 7], [], [], [])], tok.pad_token_id).sum().backward()
    assert model.model.embed_tokens.positions.weight.grad[:3].abs().sum() > 0


def test_cell_tokens_make_every_named_cell_one_token():
    from bench_ttt_representation import add_cell_tokens
    from lm_fixtures import tiny_tokenizer

    tok = copy.deepcopy(tiny_tokenizer())
    tok.add_special_tokens({"additional_special_tokens": ["<move>"]})
    add_cell_tokens(tok)
    cells = {tok.convert_tokens_to_ids(f"{i}{m}") for i in range(1, 10) for m in "XO."}
    assert len(cells) == 27
    for ids, *_ in move_token_data(tok, make("tictactoe"), fmt="named_only")[:50]:
        assert sum(t in cells for t in ids) == 9
