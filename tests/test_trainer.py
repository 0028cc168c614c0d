"""The policy-gradient trainer: loss only on the policy's tokens, PPO maths, RAE
baselines, merging, and exact kill-and-resume."""

import numpy as np
import pytest
import torch
from lm_fixtures import tiny_model, tiny_tokenizer

from lmselfplay.lm.batching import token_logprobs
from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.advantages import RoleBaselines, group_advantages, task_type_advantages
from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig


def _sample(prompt, completion, adv, tok_lp=None):
    return Sample(list(prompt), list(completion), tok_lp or [0.0] * len(completion), advantage=adv)


def _trainer(total_steps=200, **kw):
    cfg = TrainerConfig(**{"learning_rate": 1e-2, "beta": 0.0, "num_iterations": 1, "max_grad_norm": 0.0,
                           "merge_identical": False, **kw})
    return PolicyTrainer(tiny_model(seed=0), tiny_tokenizer(), cfg, total_steps=total_steps)


def test_loss_is_on_policy_tokens_only():
    """Gradient of the trainer loss == gradient of -A * mean log p(completion tokens)."""
    tr = _trainer()
    model = tr.unwrapped
    prompt, completion = [1, 50, 60, 70, 80], [90, 100, 2]
    with torch.no_grad():
        ids = torch.tensor([prompt + completion])
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        behaviour = lp[0, len(prompt) - 1 :].tolist()
    s = _sample(prompt, completion, adv=1.5, tok_lp=behaviour)
    loss, _ = tr._micro_loss([s], total_tokens=3, ref=None)
    g_trainer = torch.autograd.grad(loss, [p for p in model.parameters()], allow_unused=True)
    lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
    manual = -1.5 * lp[0, len(prompt) - 1 :].sum() / 3  # ratio 1: d ratio = d logp
    g_manual = torch.autograd.grad(manual, [p for p in model.parameters()], allow_unused=True)
    for a, b in zip(g_trainer, g_manual):
        if a is None or b is None:
            assert a is None and b is None
            continue
        assert torch.allclose(a, b, atol=1e-6)
    # zero advantage and ratio 1: nothing is left of the loss (no term on prompt tokens)
    s2 = _sample(prompt, completion, adv=0.0, tok_lp=behaviour)
    loss0, _ = tr._micro_loss([s2], total_tokens=3, ref=None)
    assert float(loss0.detach()) == 0.0


def test_ppo_clipping_stops_the_gradient_outside_the_range():
    tr = _trainer(epsilon=0.2)
    model = tr.unwrapped
    prompt, completion = [1, 50, 60], [90, 2]
    with torch.no_grad():
        ids = torch.tensor([prompt + completion])
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        cur = lp[0, len(prompt) - 1 :].tolist()
    # behaviour much less likely than now -> ratio >> 1+eps; positive advantage is clipped
    s = _sample(prompt, completion, adv=1.0, tok_lp=[c - 2.0 for c in cur])
    loss, parts = tr._micro_loss([s], total_tokens=2, ref=None)
    grads = torch.autograd.grad(loss, [p for p in model.parameters()], allow_unused=True)
    assert all(g is None or float(g.abs().max()) == 0.0 for g in grads)
    assert parts["clip_frac"] == 1.0
    # negative advantage is not clipped from that side: gradient flows
    s.advantage = -1.0
    loss, _ = tr._micro_loss([s], total_tokens=2, ref=None)
    grads = torch.autograd.grad(loss, [p for p in model.parameters()], allow_unused=True)
    assert any(g is not None and float(g.abs().max()) > 0 for g in grads)


def test_step_raises_the_probability_of_advantaged_answers():
    tr = _trainer(learning_rate=5e-3, num_iterations=2)
    model = tr.unwrapped
    prompt = [1, 50, 60, 70]
    good, bad = [90, 2], [100, 2]

    def logp(c):
        ids = torch.tensor([prompt + c])
        with torch.no_grad():
            lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        return lp[0, len(prompt) - 1 :].tolist()

    before = sum(logp(good)) - sum(logp(bad))
    for _ in range(5):
        metrics = tr.step([_sample(prompt, good, 1.0, logp(good)), _sample(prompt, bad, -1.0, logp(bad))])
    assert sum(logp(good)) - sum(logp(bad)) > before + 1.0
    assert {"loss", "pg_loss", "clip_frac", "samples", "lr"} <= set(metrics)


def test_kl_term_pulls_back_to_the_reference():
    tr = _trainer(beta=1.0, learning_rate=5e-3)
    model = tr.unwrapped
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # move away from the frozen reference
    prompt, completion = [1, 50, 60], [90, 100, 2]
    ids = torch.tensor([prompt + completion])

    def kl():
        with torch.no_grad():
            lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
            ref, _ = token_logprobs(tr.ref_model, ids, torch.ones_like(ids))
        d = (ref - lp)[0, len(prompt) - 1 :]
        return float((torch.exp(d) - d - 1).sum())

    k0 = kl()
    for _ in range(5):
        with torch.no_grad():
            lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        m = tr.step([_sample(prompt, completion, 0.0, lp[0, len(prompt) - 1 :].tolist())])
    assert m["kl"] > 0 and kl() < k0


def test_merged_batch_gives_the_same_first_step():
    """Merging identical turns (summing advantages) leaves the update unchanged."""
    prompt, c1, c2 = [1, 50, 60], [90, 2], [100, 110, 2]
    samples = [_sample(prompt, c1, 1.0), _sample(prompt, c1, 0.5), _sample(prompt, c2, -1.0)] * 3
    a = _trainer(merge_identical=False, learning_rate=1e-3)
    b = _trainer(merge_identical=True, learning_rate=1e-3)
    for tr in (a, b):
        model = tr.unwrapped
        for s in samples:
            ids = torch.tensor([s.prompt_ids + s.completion_ids])
            with torch.no_grad():
                lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
            s.behaviour_logprobs = lp[0, len(s.prompt_ids) - 1 :].tolist()
        tr.step([Sample(**vars(s)) for s in samples])
    for p, q in zip(a.unwrapped.parameters(), b.unwrapped.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_role_baselines_read_before_update():
    rb = RoleBaselines(decay=0.5)
    adv = rb.advantages(["nim/p0", "nim/p1", "nim/p0"], [1.0, -1.0, 1.0])
    assert adv.tolist() == [1.0, -1.0, 1.0]  # baselines start at 0 and are read first
    assert rb.values == {"nim/p0": 0.75, "nim/p1": -0.5}  # 0 -> 0.5 -> 0.75
    adv = rb.advantages(["nim/p0"], [1.0])
    assert adv.tolist() == [0.25]
    rb2 = RoleBaselines()
    rb2.load_state_dict(rb.state_dict())
    assert rb2.values == rb.values and rb2.decay == 0.5
    with pytest.raises(ValueError):
        RoleBaselines(decay=1.0)


def test_group_and_task_type_advantages():
    a = group_advantages(np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]))
    assert a[0] == pytest.approx([1, -1, -1, 1], abs=1e-5)
    assert a[1] == pytest.approx([0, 0, 0, 0])
    t = task_type_advantages(["ded", "ded", "abd", "abd"], [1.0, 0.0, 3.0, 3.0])
    assert t == pytest.approx([1, -1, 0, 0], abs=1e-5)


def test_lr_schedule_spans_total_steps_calls():
    """A linear schedule over total_steps trainer.step() calls (the recipe's loop length),
    whatever num_iterations."""
    tr = _trainer(lr_scheduler_type="linear", total_steps=4, num_iterations=2, learning_rate=1e-3)
    prompt, c = [1, 50, 60], [90, 2]
    lrs = []
    for _ in range(4):
        lrs.append(tr.step([_sample(prompt, c, 0.1)])["lr"])
    assert lrs == pytest.approx([7.5e-4, 5e-4, 2.5e-4, 0.0])


def test_multi_tensor_adamw_moves_the_weights_as_the_per_tensor_loop_does():
    """The trainer's AdamW runs as one multi-tensor kernel per update op (``foreach``, faster on
    CPU): three steps with weight decay and clipping give the same weights, bit for bit, as the
    per-tensor loop (PyTorch's CPU default)."""
    prompt, c1, c2 = [1, 50, 60], [90, 2], [100, 110, 2]
    samples = [_sample(prompt, c1, 1.0), _sample(prompt, c2, -1.0), _sample([1, 70], c1, 0.5)]
    fused = _trainer(weight_decay=0.1, max_grad_norm=1.0)
    loop = _trainer(weight_decay=0.1, max_grad_norm=1.0)
    assert [g["foreach"] for g in fused.optimizer.optimizer.param_groups] == [True]
    for group in loop.optimizer.optimizer.param_groups:
        group["foreach"] = False
    for tr in (fused, loop):
        for _ in range(3):
            tr.step([Sample(**vars(s)) for s in samples])
    for p, q in zip(fused.unwrapped.parameters(), loop.unwrapped.parameters(), strict=True):
        assert torch.equal(p, q)
    assert not torch.equal(next(fused.unwrapped.parameters()), next(tiny_model(seed=0).parameters()))


@pytest.mark.parametrize("attention, rows", [("sdpa", [2, 1]), ("eager", [4, 3])])
def test_target_rows_sharing_a_prefix_are_packed_with_the_same_update(monkeypatch, attention, rows):
    """Pure-target samples whose sequences share a prefix (a distillation target per answer token)
    share its tokens in one row: a prefix tree under SDPA attention (a 4D mask and position ids),
    chains of prefixes otherwise, never longer than the batch's longest sequence; every target is
    read where it was, at only the positions a target reads. The weights after a step (one mixed
    pass with a played turn, one target-only pass) equal those of one row per target."""
    import lmselfplay.rl.trainer as trainer_mod

    prompt, move = [1, 50, 60, 70], [80, 90]
    chain = [Sample(prompt, [], [], target=(0, [80], [1.0])),
             Sample(prompt + [80], [], [], target=(0, [90, 91, 90], [0.5, 0.3, 0.2])),  # 90 listed twice
             Sample(prompt + move, [], [], target=(0, [2], [1.0]), weight=2.0),
             Sample(prompt + [80, 91], [], [], target=(0, [2], [1.0])),
             Sample([1, 55], [], [], target=(0, [80], [1.0]))]
    played = _sample([1, 70, 71, 72, 73, 74], [90, 2], 0.5)  # 8 tokens: room for the 8-node tree

    def run(pack):
        if not pack:
            monkeypatch.setattr(trainer_mod, "pack_targets", lambda samples, branching: samples)
        model = tiny_model(seed=0)
        model.config._attn_implementation = attention
        tr = PolicyTrainer(model, tiny_tokenizer(), TrainerConfig(learning_rate=1e-2, beta=0.0, num_iterations=1,
                                                                  max_grad_norm=0.0, target_passes=1))
        seen = []
        hook = tr.unwrapped.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[0]),
                                                      with_kwargs=True)
        tr.step([Sample(**vars(s)) for s in chain + [played]])
        hook.remove()
        monkeypatch.undo()
        return tr, seen

    packed, packed_rows = run(True)
    single, single_rows = run(False)
    assert single_rows == [6, 5] and packed_rows == rows  # (mixed pass, target pass)
    for p, q in zip(packed.unwrapped.parameters(), single.unwrapped.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-5)  # Adam moves each weight ~1e-2: equal up to float order
    assert not torch.equal(next(packed.unwrapped.parameters()), next(tiny_model(seed=0).parameters()))


def test_a_zero3_rank_with_nothing_to_score_joins_the_other_ranks_reference_forwards(monkeypatch):
    """Under ZeRO-3 every reference forward is a collective: a rank whose step has no sampled
    completion (only stale rollouts dropped, or only targets) must make as many reference
    forwards as the rank with the most, or that rank hangs in its parameter gather."""
    tr = _trainer(beta=0.5)
    other_rank_batches = 3  # what the other rank's gather reports
    monkeypatch.setattr(PolicyTrainer, "deepspeed_stage", property(lambda self: 3))
    monkeypatch.setattr(type(tr.accelerator), "num_processes", property(lambda self: 2))
    monkeypatch.setattr(tr.accelerator, "gather", lambda t: torch.cat([t, torch.tensor([other_rank_batches])]))
    calls = []
    real = tr._ref_logits
    monkeypatch.setattr(tr, "_ref_logits", lambda ids, mask: calls.append(ids.shape) or real(ids, mask))
    monkeypatch.setattr(tr, "_micro_batches", lambda samples, rng: [])  # the passes are not under test
    tr.step([Sample([1, 50, 60], [], [], target=None)])  # nothing this rank sampled
    assert len(calls) == other_rank_batches
    calls.clear()
    prompt, completion = [1, 50, 60], [90, 100, 2]
    tr.step([_sample(prompt, completion, 1.0)])  # one batch of its own, two empty ones to match
    assert len(calls) == other_rank_batches and calls[0] == (1, len(prompt) + len(completion))


def test_the_exact_kl_on_a_targets_only_micro_batch_under_zero3_is_zero_not_an_error(monkeypatch):
    """Under ZeRO-3 a micro-batch of supervised targets takes the general path (every rank makes
    the same forwards), where the exact KL has no reference rows: it must add nothing, not fail."""
    tr = _trainer(beta=0.5, kl_estimator="exact", target_passes=1, merge_identical=False)
    monkeypatch.setattr(PolicyTrainer, "deepspeed_stage", property(lambda self: 3))
    prompt, completion = [1, 50, 60], [90, 100, 2]
    target = Sample([1, 5, 9], [], [], target=(0, [4, 7], [0.25, 0.75]))
    m = tr.step([_sample(prompt, completion, 1.0), target])
    assert np.isfinite(m["loss"]) and "target_ce" in m
