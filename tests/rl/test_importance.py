"""Truncated importance sampling: with a deliberately perturbed engine, the corrected gradient is
the on-policy one; without the correction it is not. Exact expectations: every vocabulary token
of a one-token answer is a sample, weighted by the probability of drawing it."""

from __future__ import annotations

import copy

import pytest
import torch
from lm_fixtures import tiny_trainer

from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.trainer import PolicyTrainer, SurrogateConfig
from lmselfplay.utils.config import ConfigError

PROMPT = [5, 17, 42, 8]


def _next_token_logprobs(model) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([PROMPT])).logits[0, -1].float(), -1)


def _gradient(trainer: PolicyTrainer, samples: list[Sample]) -> torch.Tensor:
    """The step's first-pass gradient of the loss, flattened (the trainer's own loss code)."""
    trainer.model.zero_grad()
    trainer._tis.begin_step()
    loss, parts = trainer._micro_loss(samples, sum(s.weight for s in samples), None, first_pass=True)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]), parts


def _samples(logq: torch.Tensor, adv: torch.Tensor) -> list[Sample]:
    """One sample per token v, drawn with probability q(v): weight q(v), behaviour log q(v)."""
    q = logq.exp()
    return [Sample(PROMPT, [v], [float(logq[v])], advantage=float(adv[v] * q[v]), weight=float(q[v]))
            for v in range(len(q))]


def _trainer(tis_cap: float) -> PolicyTrainer:
    return tiny_trainer(surrogate=SurrogateConfig(epsilon=0.2, tis_cap=tis_cap))  # gradients only: the learning rate is not used


def test_tis_brings_a_perturbed_engine_back_to_the_on_policy_gradient():
    on = _trainer(0.0)
    logp = _next_token_logprobs(on.unwrapped)
    torch.manual_seed(0)
    adv = torch.randn(len(logp))
    engine = copy.deepcopy(on.unwrapped)  # a deliberately perturbed engine: its own (noisy) head
    with torch.no_grad():
        engine.lm_head.weight.add_(0.5 * torch.randn_like(engine.lm_head.weight))
    logmu = _next_token_logprobs(engine)
    assert (logp - logmu).abs().max() > 0.5  # far outside the PPO clip range for many tokens
    reference, _ = _gradient(on, _samples(logp, adv))  # sampled from the trainer itself
    cap = float((logp - logmu).exp().max()) + 1.0  # a cap that does not bind: exact expectation
    corrected, parts = _gradient(_trainer(cap), _samples(logmu, adv))
    uncorrected, _ = _gradient(_trainer(0.0), _samples(logmu, adv))
    err = lambda g: float((g - reference).norm() / reference.norm())  # noqa: E731
    assert err(corrected) < 1e-4
    assert err(uncorrected) > 0.05  # the clip hit the mismatch itself: biased
    assert parts["tis/capped"] == 0.0 and parts["tis/weight"] > 0
    tight, parts = _gradient(_trainer(1.0), _samples(logmu, adv))  # a binding cap truncates
    assert parts["tis/capped"] > 0.1 and err(tight) > err(corrected)


def test_tis_off_is_todays_loss_bit_for_bit_and_on_is_a_no_op_without_mismatch():
    base = _trainer(0.0)
    logp = _next_token_logprobs(base.unwrapped)
    adv = torch.linspace(-1, 1, len(logp))
    samples = _samples(logp, adv)
    g0, p0 = _gradient(base, samples)
    g1, p1 = _gradient(_trainer(0.0), samples)
    assert torch.equal(g0, g1) and "tis/weight" not in p0
    g2, p2 = _gradient(_trainer(2.0), samples)  # engine == trainer: w = 1 everywhere
    torch.testing.assert_close(g2, g0, rtol=1e-5, atol=1e-7)
    assert p2["tis/weight"] == pytest.approx(1.0, abs=1e-5)


def test_tis_keeps_the_start_of_step_logprobs_across_passes():
    trainer = tiny_trainer(num_iterations=3, gradient_accumulation_steps=2, surrogate=SurrogateConfig(tis_cap=2.0))
    samples = [Sample(PROMPT + [k], [k + 1, k + 2], [-3.0, -4.0], advantage=(-1.0) ** k) for k in range(6)]
    m = trainer.step(samples)
    assert 0 < m["tis/weight"] <= 2.0 and m["ratio"] != 1.0  # later passes: ratio to the kept start
    with pytest.raises(ConfigError, match="tis_cap"):
        SurrogateConfig(tis_cap=-1.0)


def test_weights_are_the_capped_ratio_and_old_logprobs_are_kept_per_sample():
    """The module alone: ``min(exp(logp_old - log mu), cap)`` per token with its metrics over the
    mask; the first pass keeps each sample's ``logp_old`` and a later pass in another order reads it."""
    from lmselfplay.rl.importance import TruncatedImportance

    tis = TruncatedImportance(cap=2.0)
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    mu = torch.log(torch.tensor([[0.5, 0.05, 0.3]]))
    mask = torch.tensor([[1, 1, 0]])
    w, metrics = tis.weights(old, mu, mask)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, 2.0]]))  # ratios 1, 4 (capped), 3 (capped)
    assert metrics == pytest.approx({"tis/weight": 1.5, "tis/capped": 0.5})  # masked token left out
    a, b = Sample([1], [2, 3], []), Sample([1], [4], [])
    lp = torch.tensor([[-1.0, -2.0], [-3.0, 0.0]])
    tis.begin_step()
    assert torch.equal(tis.old_logprobs([a, b], lp, torch.tensor([[1, 1], [1, 0]]), first_pass=True), lp)
    later = tis.old_logprobs([b, a], torch.zeros(2, 2), torch.tensor([[1, 0], [1, 1]]), first_pass=False)
    assert torch.equal(later, torch.tensor([[-3.0, 0.0], [-1.0, -2.0]]))
    with pytest.raises(ValueError, match="tis_cap must be >= 0"):
        TruncatedImportance(-1.0)
