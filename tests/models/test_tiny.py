"""The embedded tiny model: a reduced-size build in seconds, loaded back with the Auto*
classes, deterministic, cached, rebuilt on --force, atomic, trained on THE formatter."""

from __future__ import annotations

import json
import random

import pytest
import torch

from lmselfplay import games
from lmselfplay.games.text import format_answer
from lmselfplay.lm.prompt import encode_completion, encode_prompt
from lmselfplay.models import cache as tiny_cache
from lmselfplay.models import pretrain, tiny

SMALL = dict(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64, train_steps=4,
             batch_size=8, warmup_steps=2, tokenizer_texts=400, vocab_size=1024, max_seq_len=256)


def small(**kw) -> tiny.TinyConfig:
    return tiny.TinyConfig(**(SMALL | kw))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    return tiny_cache.ensure_tiny_model(cfg=small(), progress=False, cache_dir=root)


@pytest.fixture(scope="module")
def tok(built):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(built)


def test_build_loads_back_with_auto_classes(built, tok):
    from transformers import AutoModelForCausalLM

    assert built.name == f"tiny-{small().key()}"
    model = AutoModelForCausalLM.from_pretrained(built)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_hidden_layers == 1 and model.config.hidden_size == 32
    assert model.config.vocab_size == len(tok)
    assert tok.bos_token == "<bos>" and tok.eos_token == "<eos>" and tok.pad_token == "<pad>"
    assert not getattr(tok, "chat_template", None)  # -> the plain format of policy.py
    info = json.loads((built / tiny.INFO_FILE).read_text())
    assert info["key"] == small().key() and info["tokens_seen"] > 0
    ids = torch.tensor([encode_prompt(tok, "Game: nim.")])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                         do_sample=False)
    assert out.shape == (1, ids.shape[1] + 3) or out[0, -1] == tok.eos_token_id


def test_load_policy_uses_the_build(built):
    from lmselfplay.models.policy import load_policy

    model, tok = load_policy(model_name_or_path=str(built), device="cpu")
    assert tok.padding_side == "left" and model.config.num_hidden_layers == 1


def test_every_move_name_is_one_token(tok):
    move_open, move_close = tok.convert_tokens_to_ids(["<move>", "</move>"])
    for name in ("nim", "nim_misere", "tictactoe", "kuhn_poker"):
        game = games.make(name)
        for a in range(game.n_actions):
            ids = encode_completion(tok, format_answer(game.action_text(a)))
            assert len(ids) == 4, (name, a, tok.convert_ids_to_tokens(ids))
            assert ids[0] == move_open and ids[2] == move_close and ids[3] == tok.eos_token_id
            assert tok.decode(ids, skip_special_tokens=True) == format_answer(game.action_text(a))
    # digits are split one by one (Nim stones, arithmetic), so "<move>5" never merges
    assert tok.tokenize("12345") == list("12345")


def test_examples_use_the_one_formatter(tok):
    prompt, answer = "Game: nim. Stones: 3.\nLegal moves: 1 2 3", "<move>2</move>"
    ids, is_answer = pretrain.encode_example(tok, prompt, answer)
    p, c = encode_prompt(tok, prompt), encode_completion(tok, answer)
    assert ids == p + c and is_answer == [0] * len(p) + [1] * len(c)
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id

    class Fixed:  # a corpus that cycles through known pairs
        pairs = [(prompt, answer), ("What is 2 + 2?", "2 + 2 = 4\n#### 4"), ("x", "y")]
        i = 0

        def sample(self):
            self.i += 1
            return (*self.pairs[self.i % 3], None)

    cfg = small(batch_size=4)
    batch_ids, att, w, soft = next(pretrain.batches(cfg, tok, Fixed(), random.Random(0), chunk=2))
    assert soft == []
    for row, m, wt in zip(batch_ids, att, w):
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any()  # right padding for training
        match = [(q, a) for q, a in Fixed.pairs
                 if row[:n].tolist() == encode_prompt(tok, q) + encode_completion(tok, a)]
        assert len(match) == 1
        assert row[:n][wt[:n] > 0].tolist() == encode_completion(tok, match[0][1])  # answer only


def test_game_turns_get_the_uniform_legal_target(tok):
    prompt, answer = "Legal moves: 1 3", "<move>3</move>"
    alts = ["<move>1</move>", "<move>3</move>"]
    [(pos, toks, probs)] = pretrain.soft_target(tok, prompt, answer, alts)
    ids, _ = pretrain.encode_example(tok, prompt, answer)
    assert ids[pos] == tok.convert_tokens_to_ids("3")
    assert toks == sorted(tok.convert_tokens_to_ids(["1", "3"])) and probs == [0.5, 0.5]
    assert pretrain.soft_target(tok, prompt, answer, None) == []
    assert pretrain.soft_target(tok, prompt, answer, ["<move>3</move>"]) == []  # one legal move
    # the real corpus: every game turn of the built-in games gets a soft target, with
    # exactly the legal moves
    corpus = pretrain.Corpus(small(games="nim,nim_misere,tictactoe,kuhn_poker",
                               task_weights="arithmetic=0,programs=0,reading=0"), random.Random(0))
    for _ in range(200):
        prompt, answer, alts = corpus.sample()
        legal = prompt.split("Legal moves: ")[1].split("\n")[0].split()
        assert sorted(alts) == sorted(format_answer(m) for m in legal) and answer in alts
        if len(alts) > 1:
            [(pos, toks, probs)] = pretrain.soft_target(tok, prompt, answer, alts)
            assert sorted(tok.decode([t]) for t in toks) == sorted(legal)


def test_multi_token_moves_get_the_random_prior_token_by_token(tok):
    """"3" vs "10": digits are split, so the first digit is 1 or 3 (1/2 each) and, after
    "1", the second is 0 or 1 (1/2 each); a lone "3" then has nothing left to choose."""
    d = tok.convert_tokens_to_ids
    alts = ["<move>3</move>", "<move>10</move>", "<move>11</move>"]
    prompt_len = len(pretrain.encode_example(tok, "P", "<move>10</move>")[0]) - len(
        encode_completion(tok, "<move>10</move>"))
    got = pretrain.soft_target(tok, "P", "<move>10</move>", alts)
    (p1, t1, w1), (p2, t2, w2) = got
    ids, _ = pretrain.encode_example(tok, "P", "<move>10</move>")
    assert ids[p1] == d("1") and ids[p2] == d("0") and p2 == p1 + 1 and p1 > prompt_len
    assert dict(zip(t1, w1)) == {d("1"): 2 / 3, d("3"): 1 / 3}
    assert dict(zip(t2, w2)) == {d("0"): 0.5, d("1"): 0.5}
    assert len(pretrain.soft_target(tok, "P", "<move>3</move>", alts)) == 1


def test_go_turns_get_column_then_row_targets(tok):
    """A Go move is a column letter then a row digit: two soft positions whose targets
    are the uniform prior over the legal points (and pass)."""
    from lmselfplay import games

    go = games.make("go9")
    state = go.new_initial_state()
    legal = [format_answer(go.action_text(a)) for a in go.legal_actions(state)]
    got = pretrain.soft_target(tok, "P", "<move>D4</move>", legal)
    assert len(legal) == 82 and len(got) == 2
    (_, cols, w_col), (_, rows, w_row) = got
    d = tok.encode("<move>D4", add_special_tokens=False)
    col, row = d[-2], d[-1]
    assert abs(dict(zip(cols, w_col))[col] - 9 / 82) < 1e-12 and abs(sum(w_col) - 1) < 1e-12
    assert len(rows) == 9 and dict(zip(rows, w_row))[row] == 1 / 9


def test_text_games_enter_the_corpus_as_scripted_turns():
    corpus = pretrain.Corpus(small(games="taboo", task_weights="arithmetic=0,programs=0,reading=0"),
                         random.Random(0))
    for _ in range(50):
        prompt, answer, alts = corpus.sample()
        assert prompt.startswith("Game: taboo.") and alts is None
        assert answer.startswith("<move>") and answer.endswith("</move>")


def test_weighted_loss_matches_cross_entropy(built, tok):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(built)
    ids, is_answer = pretrain.encode_example(tok, "Stones: 3.", "<move>1</move>")
    x = torch.tensor([ids])
    w = torch.tensor([is_answer], dtype=torch.float32)
    got = pretrain.weighted_lm_loss(model, x, torch.ones_like(x), w)
    logits = model(input_ids=x).logits[0, :-1]
    mask = w[0, 1:] > 0
    want = torch.nn.functional.cross_entropy(logits[mask], x[0, 1:][mask])
    assert torch.allclose(got, want, atol=1e-5)
    # soft target at the move token: mean NLL of the legal moves there
    pos = ids.index(tok.convert_tokens_to_ids("1"), len(ids) - 4)
    legal = tok.convert_tokens_to_ids(["1", "2", "3"])
    w2 = w.clone()
    w2[0, pos] = 0
    got = pretrain.weighted_lm_loss(model, x, torch.ones_like(x), w2, [(0, pos, legal, [1 / 3] * 3)])
    logp = torch.log_softmax(logits, -1)
    others = [j for j in range(len(ids) - 1) if mask[j] and j != pos - 1]
    want = (-logp[others, x[0, 1:][others]].sum() - logp[pos - 1, legal].mean()) / (len(others) + 1)
    assert torch.allclose(got, want, atol=1e-5)


def _state(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def test_build_is_deterministic_from_the_seed(built, tmp_path):
    again = tiny_cache.ensure_tiny_model(cfg=small(), progress=False, cache_dir=tmp_path / "a")
    other = tiny_cache.ensure_tiny_model(cfg=small(seed=1), progress=False, cache_dir=tmp_path / "b")
    assert (again / "tokenizer.json").read_text() == (built / "tokenizer.json").read_text()
    a, b, c = _state(built), _state(again), _state(other)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a if a[k].shape == c[k].shape)


def test_cache_reuse_force_and_atomic_failure(tmp_path, monkeypatch):
    calls = []
    real = pretrain.build_tiny_model

    def counting(cfg, out_dir, progress=True, **kw):
        calls.append(out_dir)
        return real(cfg, out_dir, progress=progress, **kw)

    monkeypatch.setattr(tiny_cache, "build_tiny_model", counting)
    monkeypatch.setenv("LMSELFPLAY_CACHE", str(tmp_path))
    cfg = small(seed=7)
    p1 = tiny_cache.ensure_tiny_model(cfg=cfg, progress=False)
    assert p1.parent == tmp_path and len(calls) == 1
    assert tiny_cache.ensure_tiny_model(cfg=cfg, progress=False) == p1 and len(calls) == 1
    assert tiny_cache.ensure_tiny_model(force=True, cfg=cfg, progress=False) == p1 and len(calls) == 2
    assert tiny_cache.is_complete(p1)

    def dies(cfg, out_dir, progress=True, **kw):
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt  # a build killed half-way

    stale = tmp_path / f".{tiny_cache.model_dir(cfg).name}.tmp-killed"  # a SIGKILLed build's leftovers
    stale.mkdir()
    assert tiny_cache.ensure_tiny_model(force=True, cfg=cfg, progress=False) == p1 and len(calls) == 3
    assert not stale.exists()

    monkeypatch.setattr(tiny_cache, "build_tiny_model", dies)
    with pytest.raises(KeyboardInterrupt):
        tiny_cache.ensure_tiny_model(cfg=small(seed=8), progress=False)
    assert not tiny_cache.model_dir(small(seed=8)).exists()
    assert tiny_cache.is_complete(p1)  # a failed --force never destroys the cached model
    with pytest.raises(KeyboardInterrupt):
        tiny_cache.ensure_tiny_model(force=True, cfg=cfg, progress=False)
    assert tiny_cache.is_complete(p1)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [p1.name]


def test_bootstrap_cli(tmp_path, capsys):
    args = ["--build", "v3", "--cache-dir", str(tmp_path), "--quiet", "--num_layers", "1", "--hidden_size", "32",
            "--num_heads", "2", "--intermediate_size", "64", "--train_steps", "2",
            "--batch_size", "4", "--tokenizer_texts", "300", "--vocab_size", "300"]
    path = tiny_cache.bootstrap_main(args)
    assert path.parent == tmp_path and tiny_cache.is_complete(path)
    assert str(path) in capsys.readouterr().out
    stamp = (path / tiny.INFO_FILE).stat().st_mtime_ns
    assert tiny_cache.bootstrap_main(args) == path
    assert (path / tiny.INFO_FILE).stat().st_mtime_ns == stamp  # reused
    assert tiny_cache.bootstrap_main([*args, "--force"]) == path
    assert (path / tiny.INFO_FILE).stat().st_mtime_ns != stamp  # rebuilt
    out = tmp_path / "explicit"
    assert tiny_cache.bootstrap_main([*args, "--out", str(out)]) == out and tiny_cache.is_complete(out)
    with pytest.raises(SystemExit):
        tiny_cache.bootstrap_main([*args, "--games", "chess"])


def test_config_validation_and_keys():
    assert tiny.TinyConfig().key() == tiny.TinyConfig(num_threads=2).key()  # not semantic
    assert tiny.TinyConfig().key() != tiny.TinyConfig(seed=1).key()
    assert tiny.TinyConfig(games="nim, tictactoe").game_names() == ["nim", "tictactoe"]
    with pytest.raises(ValueError, match="unknown game"):
        tiny.TinyConfig(games="nim,chess").key()
    with pytest.raises(ValueError, match="bad task_weights"):
        tiny.TinyConfig(task_weights="poker=2").weights()
    with pytest.raises(ValueError, match="not a number"):
        tiny.TinyConfig(task_weights="nim=lots").weights()
    w = tiny.TinyConfig().weights()
    assert set(w) == {"nim", "nim_misere", "tictactoe", "kuhn_poker", "go9", "taboo", "arithmetic",
                      "programs", "reading", "grid_reading", "two_option", "reasoning_gym", "sum_writing"}
    assert w["grid_reading"] == 0 and w["two_option"] == 0 and w["sum_writing"] == 0  # off in the default build
    assert "taboo" in tiny.TinyConfig(games="all").game_names()  # free text, scripted players
    assert w["tictactoe"] == 8 and w["reading"] == 3


def test_grid_reading_task_reads_cells_and_open_lines():
    from lmselfplay.models import corpus

    text = "You play O.\nX X 3\n4 O 6\n7 8 O\nLegal moves: 3 4 6 7 8"
    grid = corpus.board_grid(text)
    assert grid == [["X", "X", "3"], ["4", "O", "6"], ["7", "8", "O"]]
    assert corpus.board_grid("Stones: 15. You are player 1.") is None
    game = games.make("tictactoe")
    rng = random.Random(0)
    for _ in range(200):
        prompt, answer = corpus.grid_reading_task(game, rng)
        cells = [c for row in corpus.board_grid(prompt) for c in row]
        if "what is in cell" in prompt:
            k = int(prompt.split("cell ")[1].split()[0])
            assert answer == cells[k - 1]
        else:
            mark = prompt.rstrip("?").split()[-1]
            want = []
            for i, c in enumerate(cells):  # brute force: does placing mark at i complete a line?
                if c in "XO":
                    continue
                trial = cells[:i] + [mark] + cells[i + 1 :]
                lines = corpus.grid_lines(3)
                if any(i in ln and all(trial[j] == mark for j in ln) for ln in lines):
                    want.append(c)
            assert answer == (" ".join(want) or "none")
