"""Memory at real sizes: micro-batches capped by tokens give the same gradient as one batch,
log-probs computed in float32 blocks equal the full-vocabulary log-softmax in value and
gradient, gradient checkpointing gives the same gradients, and the memory benchmark runs."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lm_fixtures import tiny_model, tiny_tokenizer, tiny_trainer
from recipe_configs import parse_recipe

import lmselfplay.lm.batching as batching
import lmselfplay.rl.trainer as trainer_module
from lmselfplay.lm.batching import logprobs_from_logits, sequence_logprobs
from lmselfplay.lm.trajectory import Sample, role_key
from lmselfplay.models.policy import PolicyConfig, load_policy
from lmselfplay.rl.micro_batches import by_length, split_by_tokens
from lmselfplay.rl.trainer import PolicyTrainer, TargetLossConfig, TrainerConfig
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.recipe_loader import run_recipe

ROOT = Path(__file__).resolve().parents[2]


def _reference(logits, ids, temperature):
    """The full (B, T-1, V) float32 log-softmax: what the blocks must reproduce."""
    logp_all = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    lp = logp_all.gather(2, ids[:, 1:].unsqueeze(2)).squeeze(2)
    return lp, -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("block", [1 << 24, 7 * 50, 3 * 50, 50])  # whole rows, several rows, parts of a row, 1
def test_logprob_blocks_equal_the_full_log_softmax_in_value_and_gradient(monkeypatch, block):
    monkeypatch.setattr(batching, "LOGPROB_BLOCK_ELEMENTS", block)
    torch.manual_seed(0)
    logits = torch.randn(3, 9, 50, dtype=torch.bfloat16).float().requires_grad_(True)
    ids = torch.randint(0, 50, (3, 9))
    where = torch.rand(3, 8) > 0.4
    lp, ent = logprobs_from_logits(logits, ids, 0.7, True, where=where)
    ref_lp, ref_ent = _reference(logits, ids, 0.7)
    w = where.float()
    assert torch.allclose(lp, ref_lp * w, atol=1e-5) and torch.allclose(ent, ref_ent * w, atol=1e-5)
    assert (lp[~where] == 0).all()
    a, b = torch.randn_like(lp), torch.randn_like(lp)
    g = torch.autograd.grad((lp * a).sum() + (ent * b).sum(), logits)[0]
    g_ref = torch.autograd.grad((ref_lp * a * w).sum() + (ref_ent * b * w).sum(), logits)[0]
    assert torch.allclose(g, g_ref, atol=1e-6)
    full, _ = logprobs_from_logits(logits.detach(), ids, 0.7)  # no mask: every position
    assert torch.allclose(full, ref_lp.detach(), atol=1e-5)


def test_the_backward_of_blocks_never_holds_a_float32_vocab_tensor(monkeypatch):
    """With bf16 logits, the largest float32 tensor saved for the backward is a block's
    (recomputed in the backward), not the (B, T, V) log-softmax the old code kept."""
    monkeypatch.setattr(batching, "LOGPROB_BLOCK_ELEMENTS", 4 * 1000)
    logits = torch.randn(4, 16, 1000, dtype=torch.bfloat16, requires_grad=True)
    ids = torch.randint(0, 1000, (4, 16))
    saved = []

    def pack(t):
        if t.dtype == torch.float32:
            saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = logprobs_from_logits(logits, ids, 1.0, True)
    assert max(saved, default=0) <= 4 * 1000
    (lp.sum() + ent.sum()).backward()  # and the backward runs (blocks recomputed)
    assert logits.grad is not None and logits.grad.shape == logits.shape


def test_sequence_logprobs_equal_the_reference_on_a_model(monkeypatch):
    model = tiny_model(seed=1).eval()
    prompts, completions = [[1, 50, 60], [1, 70]], [[90, 100, 2], [80, 2]]
    got = sequence_logprobs(model, prompts, completions, pad_id=0, temperature=0.8)
    monkeypatch.setattr(batching, "LOGPROB_BLOCK_ELEMENTS", 1)  # one position per block
    again = sequence_logprobs(model, prompts, completions, pad_id=0, temperature=0.8)
    assert all(a == pytest.approx(b, abs=1e-6) for a, b in zip(again, got, strict=True))
    for p, c, lps in zip(prompts, completions, got, strict=True):
        ids = torch.tensor([p + c])
        with torch.no_grad():
            ref, _ = _reference(model(input_ids=ids).logits, ids, 0.8)
        assert lps == pytest.approx(ref[0, len(p) - 1 :].tolist(), abs=1e-5)


def test_scoring_projects_only_the_completion_positions_within_the_budget(monkeypatch):
    """Evaluation's scoring (HFEngine.score) keeps the logits of the positions that predict a
    completion token only, a bounded number per forward: long prompts and many rows never make
    a (rows, sequence, vocabulary) tensor, and the log-probs are those of the full forward."""
    from lmselfplay.lm.engines import HFEngine

    model = tiny_model(seed=1).eval()
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    prompts = [[1] + torch.randint(3, 300, (40 + 3 * i,), generator=g).tolist() for i in range(12)]
    completions = [torch.randint(3, 300, (1 + i % 3,), generator=g).tolist() for i in range(12)]
    monkeypatch.setattr(batching, "SCORE_LOGIT_ELEMENTS", 8 * vocab, raising=False)  # 8 positions a forward
    seen = []
    model.get_output_embeddings().register_forward_hook(lambda m, i, o: seen.append(o.shape[:-1].numel()))
    got = HFEngine(model, tiny_tokenizer()).score(prompts, completions)
    assert max(seen) <= 8 and sum(seen) < sum(len(p) for p in prompts) / 4
    for p, c, lps in zip(prompts, completions, got, strict=True):
        ids = torch.tensor([p + c])
        with torch.no_grad():
            ref, _ = _reference(model(input_ids=ids).logits, ids, 1.0)
        assert lps == pytest.approx(ref[0, len(p) - 1 :].tolist(), abs=1e-5)


def _len(n):
    return Sample([1] * (n - 1), [2], [0.0], advantage=1.0)


def test_split_by_tokens_caps_rows_times_the_longest():
    s = [_len(n) for n in (4, 4, 4, 10, 2, 2, 3)]
    runs = split_by_tokens(s, 12)
    assert [x for r in runs for x in r] == s  # order kept, nothing lost
    assert [len(r) for r in runs] == [3, 1, 3]  # 3 x 4 = 12; 10 alone; 3 x 3 = 9
    assert all(len(r) * max(len(x.prompt_ids) + len(x.completion_ids) for x in r) <= 12 for r in runs)
    assert [len(r) for r in split_by_tokens(s, 5)] == [1, 1, 1, 1, 2, 1]  # the 10 exceeds the cap: its own run
    assert split_by_tokens(s, 0) == [s] and split_by_tokens([], 8) == []


def test_by_length_puts_the_longest_first_and_keeps_the_order_of_equal_lengths():
    s = [_len(n) for n in (4, 10, 2, 4, 10, 3)]
    got = by_length(s)
    assert [len(x.prompt_ids) + 1 for x in got] == [10, 10, 4, 4, 3, 2]
    assert [id(x) for x in got[:4]] == [id(x) for x in (s[1], s[4], s[0], s[3])]  # ties: the given order


def _batch(seed=0, n=7):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = [1] + torch.randint(3, 300, (int(torch.randint(2, 8, (1,), generator=g)),), generator=g).tolist()
        c = torch.randint(3, 300, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist() + [2]
        lp = (-torch.rand(len(c), generator=g) * 3).tolist()
        out.append(Sample(p, c, lp, advantage=float(torch.randn(1, generator=g)), role=role_key("g", i % 2)))
    out[0].target = (0, [5, 6, 7], [0.5, 0.3, 0.2])  # a supervised target rides along
    return out


def _step_gradients(**kw):
    """The gradient each optimizer step applies (captured at the optimizer) over one step()."""
    tr = tiny_trainer(tiny_model(seed=2), target_loss=TargetLossConfig(), **{"learning_rate": 1e-3, "beta": 0.05, "kl_estimator": "exact",
                                             "entropy_coef": 0.01, "num_iterations": 2, **kw})
    grads, forwards = [], []
    inner = tr.optimizer.optimizer
    real_step = inner.step

    def capture(*a, **k):
        grads.append([p.grad.clone() for p in tr.unwrapped.parameters()])
        return real_step(*a, **k)

    inner.step = capture
    real_loss = tr._micro_loss
    tr._micro_loss = lambda mb, *a, **k: (forwards.append(len(mb)), real_loss(mb, *a, **k))[1]
    tr.step(_batch())
    return grads, forwards


@pytest.mark.parametrize("accumulation", [1, 2])
def test_a_tiny_token_cap_gives_the_gradient_of_no_cap(accumulation):
    ref, ref_forwards = _step_gradients(max_tokens_per_micro_batch=0, gradient_accumulation_steps=accumulation)
    got, forwards = _step_gradients(max_tokens_per_micro_batch=8, gradient_accumulation_steps=accumulation)
    assert len(ref_forwards) == 2 * accumulation  # one micro-batch per group and pass without a cap
    assert len(forwards) > len(ref_forwards) and max(forwards) < max(ref_forwards)
    assert len(got) == len(ref) == 2  # still one optimizer step per pass (num_iterations)
    for step_got, step_ref in zip(got, ref, strict=True):
        for a, b in zip(step_got, step_ref, strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-4), float((a - b).abs().max())


@pytest.mark.parametrize("accumulation", [1, 2])
def test_length_grouped_micro_batches_pad_less_with_the_gradient_of_the_shuffled_cut(monkeypatch, accumulation):
    """The trainer sorts each accumulation group longest first before the token cap cuts it (the
    reference forwards too): fewer padded tokens than cutting in the shuffled order, the same
    micro-batch count or fewer, and the same gradient up to the float order of its sum."""
    real = trainer_module.collate

    def padded(grouped):
        monkeypatch.setattr(trainer_module, "by_length", by_length if grouped else list)
        widths = []

        def counting(batch, *a, **k):
            lengths = [len(x.prompt_ids) + len(x.completion_ids) for x in batch]
            widths.append((len(lengths) * max(lengths), lengths))
            return real(batch, *a, **k)

        monkeypatch.setattr(trainer_module, "collate", counting)
        grads, forwards = _step_gradients(max_tokens_per_micro_batch=40, gradient_accumulation_steps=accumulation)
        return grads, forwards, widths

    ref, ref_forwards, ref_widths = padded(False)
    got, forwards, widths = padded(True)
    assert all(lengths == sorted(lengths, reverse=True) for _, lengths in widths)
    assert sorted(n for _, ls in widths for n in ls) == sorted(n for _, ls in ref_widths for n in ls)
    assert sum(w for w, _ in widths) < sum(w for w, _ in ref_widths) and len(forwards) <= len(ref_forwards)
    assert len(got) == len(ref) == 2
    for step_got, step_ref in zip(got, ref, strict=True):
        for a, b in zip(step_got, step_ref, strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-4), float((a - b).abs().max())


def test_a_bad_token_cap_is_one_line_naming_the_field(capsys):
    code = run_main(partial(run_recipe, "selfplay_games"), ["--max_tokens_per_micro_batch", "-5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "max_tokens_per_micro_batch" in err[0] and "-5" in err[0], err


def _loss_gradients(model, samples):
    tr = PolicyTrainer(model, tiny_tokenizer(), TrainerConfig(beta=0.0, entropy_coef=0.01, merge_identical=False))
    tr.model.train()
    loss, _ = tr._micro_loss(samples, total_tokens=sum(len(s.completion_ids) for s in samples), ref=None)
    loss.backward()
    return {n: p.grad.clone() for n, p in tr.unwrapped.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("use_lora", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(model_dir, use_lora):
    samples = _batch(seed=4)
    for s in samples:
        s.target = None
    got = {}
    for on in (False, True):
        torch.manual_seed(0)  # the same LoRA initialisation both times
        model, _ = load_policy(PolicyConfig(model_name_or_path=str(model_dir), gradient_checkpointing=on,
                                            use_lora=use_lora, lora_dropout=0.0), device="cpu")
        assert model.is_activation_checkpointing == on
        got[on] = _loss_gradients(model, samples)
    assert got[True].keys() == got[False].keys() and got[True]
    for name, g in got[False].items():
        assert torch.allclose(got[True][name], g, atol=1e-6), name


def test_every_training_recipe_offers_gradient_checkpointing():
    for recipe in ("selfplay_games", "search_selfplay", "spin", "debate", "absolute_zero", "r_zero"):
        assert parse_recipe(recipe, ["--gradient_checkpointing", "true"]).policy.gradient_checkpointing is True, recipe


@pytest.mark.slow  # ~15 s; the caps themselves are tested by default above
def test_memory_benchmark_runs_quick(tmp_path):
    out = tmp_path / "memory.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_memory.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())["results"]
    assert {(r["cap"], r["batch"]) for r in res["trainer"]} == {(16, 2), (16, 8), (0, 2), (0, 8)}
    assert {r["cap"] for r in res["logprobs"]} == {"blocks", "full"} and len(res["generation"]) == 4
    assert {r["cap"] for r in res["evaluation"]} == {"kept", "full"}
    assert all(r["peak_mb"] >= 0 for part in ("trainer", "logprobs", "generation", "evaluation") for r in res[part])
    assert "trainer: peak MB" in proc.stdout
