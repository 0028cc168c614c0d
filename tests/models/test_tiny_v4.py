"""The v4 embedded build's code path at tiny size: the "cells" tokenizer (one token per
board cell, digit and move name), the build selected by name, the judge-format corpus task,
and a killed build that resumes to the same weights as an uninterrupted one."""

from __future__ import annotations

import json
import random

import pytest
import torch

from lmselfplay import games
from lmselfplay.games.text import format_answer
from lmselfplay.lm.prompt import encode_completion
from lmselfplay.models import cache as tiny_cache
from lmselfplay.models import corpus, pretrain, tiny
from lmselfplay.models import tokenizer as tiny_tokenizer

SMALL = dict(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64, train_steps=6,
             batch_size=8, warmup_steps=2, tokenizer_texts=400, vocab_size=1024, max_seq_len=512)


def small_v4(**kw) -> tiny.TinyConfig:
    return tiny.build_config("v4", **(SMALL | kw))


@pytest.fixture(scope="module")
def cells_tok():
    cfg = small_v4()
    rng = random.Random(0)
    c = pretrain.Corpus(cfg, rng)
    texts = [p + "\n" + a for p, a, _ in (c.sample() for _ in range(cfg.tokenizer_texts))]
    return tiny_tokenizer.train_tokenizer(cfg, texts, tiny_tokenizer.move_names(cfg))


def _tokens(tok, text):
    return tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])


def test_a_board_cell_is_one_token_whatever_its_neighbours(cells_tok):
    rows = ["X O 3", "4 X O", "O 8 X"]
    ids = [cells_tok(r, add_special_tokens=False)["input_ids"] for r in rows]
    assert all(len(i) == 5 for i in ids)  # 3 cells + 2 spaces, every row
    x = cells_tok("X", add_special_tokens=False)["input_ids"][0]
    assert ids[0][0] == x and ids[1][2] == x and ids[2][4] == x  # row start, middle, end
    bpe = tiny_tokenizer.train_tokenizer(tiny.TinyConfig(**SMALL), ["1 X 3\nX 5 X\n" * 50, "Legal moves: 1 2"])
    glued = bpe("X 5 X", add_special_tokens=False)["input_ids"]
    assert len(glued) != 5  # the v3 tokenizer glues " X": the layout v4 fixes


def test_every_move_name_and_digit_is_one_token(cells_tok):
    cfg = small_v4()
    for name in cfg.game_names():
        game = games.make(name)
        if getattr(game, "action_space", "discrete") == "text":
            continue
        for a in range(game.n_actions):
            text = game.action_text(a)
            ids = encode_completion(cells_tok, format_answer(text), eos=False)
            assert len(ids) == 3, (name, text, _tokens(cells_tok, format_answer(text)))
    assert _tokens(cells_tok, "127") == ["1", "2", "7"]
    assert "D4" in _tokens(cells_tok, "answer a point like D4 or pass.")


def test_cells_tokenizer_round_trips_every_corpus_kind(cells_tok):
    c = pretrain.Corpus(small_v4(), random.Random(3))
    for _ in range(200):
        prompt, answer, _ = c.sample()
        for text in (prompt, answer):
            assert cells_tok.decode(cells_tok(text, add_special_tokens=False)["input_ids"]) == text


def test_two_option_task_label_names_the_option_the_context_shows():
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        prompt, label = corpus.two_option_task(rng)
        lines = prompt.splitlines()
        options = {ln[0]: ln[3:] for ln in lines if ln[:3] in ("A: ", "B: ")}
        last_number = lines[lines.index("Context:") + 1 : -3][-1].split("= ")[-1]
        assert options[label] == last_number and options["A"] != options["B"]
        assert lines[-1] == corpus.TWO_OPTION_QUESTION
        seen.add(label)
    assert seen == {"A", "B"}


def test_named_builds_and_the_v3_key_is_unchanged():
    assert tiny.build_config("v3").key() == tiny.TinyConfig().key()
    v4 = tiny.build_config("v4")
    assert v4.tokenizer == "cells" and v4.weights()["two_option"] > 0 and v4.weights()["grid_reading"] > 0
    assert v4.key() != tiny.TinyConfig().key()
    assert tiny.TinyConfig(checkpoint_every=7).key() == tiny.TinyConfig().key()  # not semantic
    with pytest.raises(ValueError, match="unknown build"):
        tiny.build_config("v9")
    with pytest.raises(ValueError, match="unknown tokenizer"):
        tiny.TinyConfig(tokenizer="words").key()


def test_bootstrap_selects_the_build_by_name(tmp_path, capsys):
    args = ["--build", "v4", "--cache-dir", str(tmp_path), "--quiet", "--num_layers", "1",
            "--hidden_size", "32", "--num_heads", "2", "--intermediate_size", "64", "--train_steps", "2",
            "--batch_size", "4", "--tokenizer_texts", "300", "--max_seq_len", "512"]
    path = tiny_cache.bootstrap_main(args)
    info = json.loads((path / tiny.INFO_FILE).read_text())
    assert info["config"]["tokenizer"] == "cells" and "two_option" in info["config"]["task_weights"]
    assert info["config"]["train_steps"] == 2  # an explicit option beats the build's value
    with pytest.raises(SystemExit):
        tiny_cache.bootstrap_main([*args, "--build", "v9"])


def _weights(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def test_a_killed_build_resumes_to_the_uninterrupted_weights(tmp_path):
    cfg = small_v4(checkpoint_every=2)
    whole = pretrain.build_tiny_model(cfg, tmp_path / "whole", progress=False)
    assert "resumed_at_step" not in whole
    state = tmp_path / "state"
    stopped = pretrain.build_tiny_model(cfg, tmp_path / "resumed", progress=False, resume_dir=state, stop_after=3)
    assert stopped["stopped_at"] == 3 and (state / pretrain.RESUME_FILE).is_file()
    assert not tiny_cache.is_complete(tmp_path / "resumed")  # a kill leaves no model, only the state
    info = pretrain.build_tiny_model(cfg, tmp_path / "resumed", progress=False, resume_dir=state)
    assert info["resumed_at_step"] == 3 and info["tokens_seen"] == whole["tokens_seen"]
    assert not state.exists()  # done: the state is gone
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_state_of_another_key_or_a_damaged_one_is_ignored(tmp_path):
    state = tmp_path / "state"
    pretrain.build_tiny_model(small_v4(checkpoint_every=1), tmp_path / "a", progress=False, resume_dir=state,
                          stop_after=1)
    assert pretrain.load_build_state(state, small_v4(seed=5).key()) is None
    assert pretrain.load_build_state(state, small_v4().key())["step"] == 1
    (state / pretrain.RESUME_FILE).write_bytes(b"not a torch file")
    assert pretrain.load_build_state(state, small_v4().key()) is None


def test_ensure_tiny_model_continues_a_killed_build(tmp_path):
    cfg = small_v4(checkpoint_every=2, train_steps=4)
    state = tiny_cache.resume_dir(tiny_cache.model_dir(cfg, tmp_path))
    pretrain.build_tiny_model(cfg, tmp_path / "killed", progress=False, resume_dir=state, stop_after=2)
    path = tiny_cache.ensure_tiny_model(cfg=cfg, progress=False, cache_dir=tmp_path)
    info = json.loads((path / tiny.INFO_FILE).read_text())
    assert info["resumed_at_step"] == 2 and not state.exists()


def continue_default(**fields):
    """A TinyConfig continuing the shipped default build: its inherited fields (shape,
    tokenizer, game texts) as the default's, ``fields`` on top."""
    inherited = {f: getattr(tiny.build_config(), f) for f in tiny.INHERITED}
    return tiny.TinyConfig(continue_from=tiny.DEFAULT_BUILD, **(inherited | fields))


def test_a_continued_build_starts_from_its_base_and_keeps_its_tokenizer(tmp_path):
    base = tiny_cache.ensure_tiny_model(progress=False)  # the shipped default build
    cfg = continue_default(train_steps=2, batch_size=4, warmup_steps=1,
                         task_weights="arithmetic=1,tictactoe=0,reading=0")
    assert cfg.key() != tiny.build_config().key() != tiny.build_config(train_steps=2).key()
    pretrain.build_tiny_model(cfg, tmp_path / "v", progress=False, base=base)
    assert (tmp_path / "v" / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    a, b = _weights(base), _weights(tmp_path / "v")
    assert a.keys() == b.keys() and not all(torch.equal(a[k], b[k]) for k in a)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 0.05  # two small steps, not a new model
    with pytest.raises(ValueError, match="takes its hidden_size"):
        continue_default(hidden_size=64).key()


def test_a_killed_continued_build_resumes_to_the_uninterrupted_weights(tmp_path):
    # v6 is a continued build: one must resume and repeat like a build from scratch
    cfg = continue_default(train_steps=4, batch_size=4, warmup_steps=1,
                         checkpoint_every=2, num_threads=1, task_weights="arithmetic=1,tictactoe=1,reading=0")
    base = tiny_cache.base_of(cfg, progress=False)
    pretrain.build_tiny_model(cfg, tmp_path / "whole", progress=False, base=base)
    again = pretrain.build_tiny_model(cfg, tmp_path / "again", progress=False, base=base)
    state = tmp_path / "state"
    pretrain.build_tiny_model(cfg, tmp_path / "resumed", progress=False, resume_dir=state, stop_after=3, base=base)
    info = pretrain.build_tiny_model(cfg, tmp_path / "resumed", progress=False, resume_dir=state, base=base)
    assert info["resumed_at_step"] == 3 and info["tokens_seen"] == again["tokens_seen"]
    a, b, c = (_weights(tmp_path / d) for d in ("whole", "again", "resumed"))
    assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)
