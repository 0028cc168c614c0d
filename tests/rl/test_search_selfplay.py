"""Search-distilled self-play: the LLM evaluator, the search it drives, the distillation
loss, the replay's labels and exact resume."""

from __future__ import annotations

import copy
import functools
import random

import numpy as np
import pytest
import torch
from lm_fixtures import tiny_tokenizer

from lmselfplay.alphazero.adapter import SearchGame
from lmselfplay.alphazero.batched_mcts import BatchedMCTS
from lmselfplay.alphazero.mcts import mcts, uniform_prior, zero_value
from lmselfplay.games import make
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.prompt import encode_completion, encode_prompt
from lmselfplay.lm.readout import answer_distribution, decision_states
from lmselfplay.lm.search_eval import LLMEvaluator, QHead, ValueHead, load_head, move_tokens
from lmselfplay.rl.trainer import PolicyTrainer, TargetLossConfig, TrainerConfig
from lmselfplay.search_selfplay.search_targets import (
    LEARNER,
    blended_q_target,
    collect,
    distill_samples,
    plan_games,
    q_loss,
)


@functools.cache
def move_tokenizer():
    """The test tokenizer with <move> / </move> as single added tokens (as in the
    embedded tokenizer), so every Nim / tic-tac-toe answer is <move> + 1 token + </move>."""
    from tokenizers import AddedToken

    tok = copy.deepcopy(tiny_tokenizer())
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<move>", "</move>")])
    return tok


def move_model(seed: int = 0, width: int = 32):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = move_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(cfg).eval()


def positions(game, n=8):
    states = decision_states(game)
    return [states[i] for i in np.linspace(0, len(states) - 1, n).astype(int)]


@pytest.mark.parametrize("name", ["nim", "tictactoe"])
def test_prior_equals_normalized_teacher_forced_move_token(name):
    game, tok, model = make(name), move_tokenizer(), move_model()
    ev = LLMEvaluator(model, tok, game, batch_size=5)  # several chunks, ragged padding
    assert ev.tokens is not None
    face = SearchGame(game)
    states = positions(game)
    prior, values = ev([face.position(s) for s in states])
    assert np.all(values == 0.0)  # no value head: value 0
    # independent path: the engine's teacher-forced log-prob of the answer prefix <move> t_a
    engine = HFEngine(model, tok)
    for s, row in zip(states, prior):
        legal = game.legal_actions(s)
        p = encode_prompt(tok, game.observation_text(s, game.current_player(s)))
        comps = [encode_completion(tok, "<move>" + game.action_text(a), eos=False) for a in legal]
        lp = [sum(x) for x in engine.score([p] * len(legal), comps)]
        z = np.exp(lp - np.max(lp))
        want = z / z.sum()
        got = row[legal] / row[legal].sum()
        assert np.allclose(got, want, atol=1e-5), (got, want)


def test_fallback_prior_is_answer_distribution():
    from lm_fixtures import tiny_model

    game, tok, model = make("tictactoe"), tiny_tokenizer(), tiny_model().eval()
    ev = LLMEvaluator(model, tok, game)
    ev.tokens = None  # as for a tokenizer that splits move names: whole answers are scored
    face = SearchGame(game)
    states = positions(game, 6)
    prior, _ = ev([face.position(s) for s in states])
    for row, d in zip(prior, answer_distribution(HFEngine(model, tok), tok, game, states)):
        for a, p in d.items():
            assert abs(row[a] - p) < 1e-5


def test_cache_evaluates_identical_states_once():
    game, tok = make("nim"), move_tokenizer()
    ev = LLMEvaluator(move_model(), tok, game)
    face = SearchGame(game)
    s = face.position(game.new_initial_state())
    ev([s, s, s])
    ev([s])
    assert ev.forwards == 1
    ev.clear()
    ev([s])
    assert ev.forwards == 2


class ConstantLM(torch.nn.Module):
    """A scripted "LLM": the same logits for every token (uniform prior), hidden state 0."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False):
        from types import SimpleNamespace

        b, t = input_ids.shape
        logits = torch.zeros(b, t, self.vocab) + 0 * self.w
        return SimpleNamespace(logits=logits, hidden_states=(torch.zeros(b, t, 4),))


@pytest.mark.parametrize("name", ["nim", "tictactoe"])
def test_search_with_scripted_uniform_llm_matches_reference_mcts(name):
    game, tok = make(name), move_tokenizer()
    face = SearchGame(game)
    ev = LLMEvaluator(ConstantLM(len(tok)), tok, game)
    roots = [face.position(s) for s in positions(game, 5)]
    search = BatchedMCTS(face, ev, c_puct=1.5, capacity=64)
    search.set_roots(roots)
    N, Q = search.search(40)
    for i, r in enumerate(roots):
        n_ref, q_ref = mcts(face, r, uniform_prior, zero_value, 40, c_puct=1.5)
        assert np.array_equal(N[i], n_ref)
        assert np.allclose(Q[i], q_ref)


def test_distillation_gradient_equals_hand_computed():
    """d loss / d logits at the move position = (softmax(logits) - pi) / n_targets,
    zero at every other position (beta = 0, advantage 0: only the target term)."""
    game, tok = make("tictactoe"), move_tokenizer()
    model = move_model(seed=3)
    trainer = PolicyTrainer(model, tok, TrainerConfig(beta=0.0, num_iterations=1, learning_rate=0.0,
                                                      merge_identical=False), target_loss=TargetLossConfig())
    state = game.apply(game.new_initial_state(), 4)
    from lmselfplay.search_selfplay.search_targets import Record

    legal = game.legal_actions(state)
    pi = np.zeros(game.n_actions)
    pi[legal] = np.arange(1, len(legal) + 1, dtype=float)
    pi /= pi.sum()
    ev = LLMEvaluator(model, tok, game)
    rec = Record(ev.prompt_ids(state), legal, pi.tolist(), [0.0] * game.n_actions, z=1.0)
    sample = distill_samples([rec], tok, game, ev.tokens)[0]
    grads = []

    def keep_grad(module, inputs, out):  # every lm_head output's gradient, summed below
        if out.requires_grad:
            out.register_hook(lambda g: grads.append(g.detach().clone()))

    handle = model.lm_head.register_forward_hook(keep_grad)
    try:
        trainer.step([sample])
    finally:
        handle.remove()
    pos = len(sample.prompt_ids) - 1 + sample.target[0]
    with torch.no_grad():
        ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
        logits = model(input_ids=ids).logits[0, pos]
    want = torch.softmax(logits, -1)
    want[[ev.tokens[a] for a in legal]] -= torch.tensor(pi[legal], dtype=torch.float)
    total = sum(g[0] for g in grads)
    assert torch.allclose(total[pos], want, atol=1e-6)
    other = torch.ones(total.shape[0], dtype=torch.bool)
    other[pos] = False
    assert torch.count_nonzero(total[other]) == 0


def test_only_learner_turns_enter_the_replay():
    """Frozen seats search (with their own weights) but never give labels."""
    game, tok = make("nim"), move_tokenizer()
    face = SearchGame(game)
    learner = LLMEvaluator(move_model(0), tok, game)
    frozen = LLMEvaluator(move_model(1), tok, game)
    rng = random.Random(0)
    games = plan_games(face, 12, rng, lambda r: "snap" if r.random() < 0.5 else "mirror")
    records, _ = collect(face, games, {LEARNER: learner, "snap": frozen}, 4, rng)
    assert {g.opponent for g in games} == {"snap", "mirror"}
    assert frozen.forwards > 0  # the frozen side did search
    k = 0
    for g in games:  # records come game by game, in play order; play starts with player 1
        seats = [ply % 2 for ply in range(g.ply) if ply % 2 in g.learner]
        mine = records[k : k + len(seats)]
        k += len(seats)
        assert [r.opponent for r in mine] == [g.opponent] * len(seats)
        for r, seat in zip(mine, seats):
            assert f"You are player {seat + 1}." in tok.decode(r.prompt_ids)
            assert r.z == g.result[seat]
            assert abs(sum(r.pi) - 1) < 1e-9
    assert k == len(records)


def test_value_head_round_trip(tmp_path):
    head = ValueHead(32, 8)
    head.save(tmp_path)
    back = ValueHead.load(tmp_path)
    x = torch.randn(3, 32)
    assert torch.equal(head(x), back(x))


def test_q_head_round_trip_and_load_head_finds_it(tmp_path):
    head = QHead(32, 9, 8)
    head.save(tmp_path)
    back = load_head(tmp_path)
    assert isinstance(back, QHead) and back.n_actions == 9
    x = torch.randn(3, 32)
    assert torch.equal(head(x), back(x)) and head(x).shape == (3, 9)
    assert load_head(tmp_path / "nothing") is None


# --- the optional Q head ---------------------------------------------------------------

def test_blended_q_target_by_hand():
    """c = N / (N + 4): N = 0 -> the prior exactly; 4 visits -> half and half; 12 -> 3/4 search."""
    n = np.array([0.0, 4.0, 12.0, 0.0])
    q_search = np.array([0.0, 0.6, -0.2, 0.0])  # the search reports 0 for an unvisited move
    q_prior = np.array([0.3, -0.4, 0.2, 0.9])
    legal = np.array([True, True, True, False])
    got = blended_q_target(n, q_search, q_prior, legal, lam=4.0)
    assert np.allclose(got, [0.3, 0.5 * 0.6 + 0.5 * -0.4, 0.75 * -0.2 + 0.25 * 0.2, 0.0])
    with pytest.raises(ValueError):
        blended_q_target(n, q_search, q_prior, legal, lam=0.0)


def test_q_loss_by_hand():
    q = torch.tensor([[0.5, -0.5, 0.9]])
    prior = torch.tensor([[0.2, 0.6, 0.7]])  # the illegal third move carries no weight in V
    legal = torch.tensor([[1.0, 1.0, 0.0]])
    target = torch.tensor([[0.1, -0.1, 0.0]])
    v = 0.25 * 0.5 + 0.75 * -0.5
    want = ((0.4**2 + 0.4**2) / 2) + (1.0 - v) ** 2
    assert float(q_loss(q, prior, legal, target, torch.tensor([1.0]))) == pytest.approx(want)


def test_q_head_value_is_prior_weighted_q():
    """V(s) = sum_a pi(a|s) Q(s, a), pi the LLM's prior renormalized over legal moves."""
    game, tok = make("tictactoe"), move_tokenizer()
    torch.manual_seed(0)
    head = QHead(32, game.n_actions, 8)
    ev = LLMEvaluator(move_model(), tok, game, head, batch_size=3)
    face = SearchGame(game)
    states = positions(game, 5)
    prior, values = ev([face.position(s) for s in states])
    q = ev.q_values([face.position(s) for s in states])
    for s, p, v, qs in zip(states, prior, values, q):
        legal = game.legal_actions(s)
        _, hidden = ev.forward([ev.prompt_ids(s)])
        assert np.allclose(qs, head(hidden)[0].detach().numpy(), atol=1e-6)
        assert v == pytest.approx(float(np.dot(p[legal] / p[legal].sum(), qs[legal])), abs=1e-9)
        assert -1 <= v <= 1


def test_collected_q_targets_blend_search_and_prior():
    """Every learner record's Q target is c Q_PUCT + (1 - c) Q_prior at its root: an
    unvisited legal move keeps the head's own Q (the anchor), not the search's 0."""
    game, tok = make("tictactoe"), move_tokenizer()
    face = SearchGame(game)
    torch.manual_seed(1)
    ev = LLMEvaluator(move_model(), tok, game, QHead(32, game.n_actions, 8))
    rng = random.Random(0)
    n_sims, lam = 6, 2.0  # fewer simulations than legal moves early on: unvisited moves exist
    records, _ = collect(face, plan_games(face, 4, rng, lambda r: "mirror"), {LEARNER: ev}, n_sims, rng,
                         q_lambda=lam)
    unvisited = 0
    for r in records:
        with torch.no_grad():
            q_prior = ev.value_head(ev.forward([r.prompt_ids])[1])[0].double().numpy()
        n = np.array(r.pi) * n_sims  # target_tau = 1: pi = N / n_sims
        legal = np.zeros(game.n_actions, dtype=bool)
        legal[r.legal] = True
        c = n / (n + lam)
        assert np.allclose(r.q_target, np.where(legal, c * np.array(r.q) + (1 - c) * q_prior, 0), atol=1e-6)
        for a in r.legal:
            if n[a] == 0:
                unvisited += 1
                assert r.q_target[a] == pytest.approx(q_prior[a], abs=1e-6) and r.q[a] == 0.0
    assert unvisited > 0


def test_move_tokens_are_the_token_between_the_tags():
    tok, game = move_tokenizer(), make("tictactoe")
    tokens = move_tokens(tok, game)
    for a, t in enumerate(tokens):
        ids = encode_completion(tok, f"<move>{game.action_text(a)}</move>", eos=False)
        assert ids[1] == t and tok.decode([t]) == game.action_text(a)


def run_recipe(tmp_path, out, *extra):
    from lmselfplay.utils import recipe_loader

    model_dir = tmp_path / "model"
    if not model_dir.exists():
        move_model().save_pretrained(model_dir)
        move_tokenizer().save_pretrained(model_dir)
    args = ["--model_name_or_path", str(model_dir), "--game", "nim", "--output_dir", str(tmp_path / out),
            "--games_per_round", "6", "--n_sims", "4", "--distill_steps", "2", "--batch_size", "8",
            "--value_steps", "2", "--eval_every", "0", "--league_add_every", "1", "--tensorboard", "false",
            "--progress", "false", "--dtype", "float32", *extra]
    return recipe_loader.run_recipe("search_selfplay", args)


def final_state(path):
    from safetensors.torch import load_file

    from lmselfplay.utils.checkpoint import latest_checkpoint

    last = latest_checkpoint(path)
    return load_file(str(last / "model" / "model.safetensors")), load_head(last / "model").state_dict()


@pytest.mark.parametrize("q_head", ["false", "true"])
def test_resume_is_exact(tmp_path, q_head):
    straight = run_recipe(tmp_path, "a", "--rounds", "3", "--q_head", q_head)
    run_recipe(tmp_path, "b", "--rounds", "2", "--q_head", q_head)
    resumed = run_recipe(tmp_path, "b", "--rounds", "3", "--resume", "true", "--q_head", q_head)
    def same(m):
        return {k: v for k, v in m.items() if not k.startswith("time/")}

    assert same(straight) == same(resumed)  # same games, same losses
    assert ("train/q_loss" in straight) == (q_head == "true")
    (ma, ha), (mb, hb) = final_state(tmp_path / "a"), final_state(tmp_path / "b")
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    assert all(torch.equal(ha[k], hb[k]) for k in ha)


def test_q_head_under_lora_is_saved_beside_the_adapters(tmp_path):
    """Under LoRA the checkpoint's model folder holds the adapters and the Q head; the head
    there equals the one the run trained (the checkpoint's own copy)."""
    from lmselfplay.utils.checkpoint import latest_checkpoint

    run_recipe(tmp_path, "lora", "--rounds", "2", "--q_head", "true", "--use_lora", "true", "--lora_r", "4")
    last = latest_checkpoint(tmp_path / "lora")
    assert (last / "model" / "adapter_config.json").exists()
    head = load_head(last / "model")
    assert isinstance(head, QHead)
    trained = torch.load(last / "lmselfplay_state.pt", weights_only=False)["extra"]["head"]
    assert all(torch.equal(head.state_dict()[k], v) for k, v in trained.items())


@pytest.mark.slow
def test_nim_run_raises_optimal_move_probability(tmp_path):
    """A few iterations of search distillation on Nim raise the raw policy's P(optimal)."""
    from lmselfplay.utils.metrics_logger import read_jsonl

    run_recipe(tmp_path, "nim", "--rounds", "4", "--games_per_round", "32", "--n_sims", "32",
               "--distill_steps", "25", "--batch_size", "64", "--learning_rate", "0.01", "--eval_every", "4",
               "--eval_games", "10", "--eval_budgets", "0", "--eval_openings", "2", "--reset_fraction", "0.5",
               "--reset_max_plies", "10")
    rows = read_jsonl(tmp_path / "nim" / "metrics.jsonl")
    first, last = rows[0]["eval/raw_optimal_move_prob"], rows[-1]["eval/raw_optimal_move_prob"]
    assert last > first + 0.1, (first, last)


def test_the_old_build_name_is_one_line_naming_make_search_selfplay():
    from lmselfplay.search_selfplay import steps

    with pytest.raises(AttributeError, match="make_search_selfplay"):
        steps.build  # noqa: B018


def test_the_old_module_path_is_one_line_naming_search_targets():
    import importlib
    import sys

    sys.modules.pop("lmselfplay.alphazero.llm_selfplay", None)
    with pytest.raises(ImportError, match=r"^[^\n]*lmselfplay\.search_selfplay\.search_targets [^\n]*$"):
        importlib.import_module("lmselfplay.alphazero.llm_selfplay")
