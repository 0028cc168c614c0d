"""The trainer's two KL estimators: k3 on the sampled token, and the exact KL(ref || policy)
over the vocabulary, whose gradient is k3's expected gradient without k3's variance."""

import pytest
import torch
from lm_fixtures import tiny_trainer

from lmselfplay.lm.batching import token_logprobs
from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.kl import kl_per_token
from lmselfplay.rl.trainer import TrainerConfig
from lmselfplay.utils.config import ConfigError


def _grad_on_logits(estimator, logits, ref_logits, token=None):
    """Gradient of the KL term on the policy's logits (one position)."""
    logits = logits.clone().requires_grad_(True)
    logp, ref = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
    if estimator == "k3":
        kl = kl_per_token("k3", logp[token], ref[token])
    else:
        kl = kl_per_token("exact", logp[token or 0], ref[token or 0], logp, ref)
    (g,) = torch.autograd.grad(kl, [logits])
    return g


def test_exact_kl_is_the_categorical_kl_from_the_reference_and_its_gradient_is_pi_minus_ref():
    gen = torch.Generator().manual_seed(0)
    logits, ref_logits = torch.randn(3, 7, generator=gen), torch.randn(3, 7, generator=gen)
    logp, ref = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
    kl = kl_per_token("exact", logp[:, 0], ref[:, 0], logp, ref)
    want = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=ref_logits),
                                             torch.distributions.Categorical(logits=logits))
    assert torch.allclose(kl, want, atol=1e-6)
    g = _grad_on_logits("exact", logits[0], ref_logits[0])
    assert torch.allclose(g, logits[0].softmax(-1) - ref_logits[0].softmax(-1), atol=1e-6)


def test_k3s_expected_gradient_is_the_exact_one_but_a_rare_sampled_token_weighs_thousands():
    """Enumerating the sampled token: sum_a pi(a) grad k3(a) == pi - ref exactly; the token
    the policy gives 1e-4 (the reference 1/4) alone has a gradient of norm ~2,500."""
    logits = torch.log(torch.tensor([0.5, 0.3, 0.1999, 0.0001]))
    ref_logits = torch.zeros(4)
    pi = logits.softmax(-1)
    expected = sum(pi[a] * _grad_on_logits("k3", logits, ref_logits, token=a) for a in range(4))
    exact = _grad_on_logits("exact", logits, ref_logits)
    assert torch.allclose(expected, exact, atol=1e-5)
    assert torch.allclose(exact, pi - ref_logits.softmax(-1), atol=1e-6)
    rare = _grad_on_logits("k3", logits, ref_logits, token=3)
    assert float(rare.norm()) > 2000 and float(exact.norm()) < 2 ** 0.5


def _trainer(**kw):
    tr = tiny_trainer(**{"learning_rate": 5e-3, "beta": 1.0, "kl_estimator": "exact", **kw})
    with torch.no_grad():
        for p in tr.unwrapped.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # move away from the frozen reference
    return tr


PROMPT, COMPLETION = [1, 50, 60], [90, 100, 2]


def _exact_kl_by_hand(tr):
    """KL(ref || policy) at each completion token, from both models' logits directly."""
    ids = torch.tensor([PROMPT + COMPLETION])
    at = slice(len(PROMPT) - 1, len(PROMPT) + len(COMPLETION) - 1)
    logp = torch.log_softmax(tr.unwrapped(input_ids=ids).logits[0, at], -1)
    with torch.no_grad():
        ref = torch.log_softmax(tr.ref_model(input_ids=ids).logits[0, at], -1)
    return (ref.exp() * (ref - logp)).sum(-1)


def _on_policy_sample(tr):
    ids = torch.tensor([PROMPT + COMPLETION])
    with torch.no_grad():
        lp, _ = token_logprobs(tr.unwrapped, ids, torch.ones_like(ids))
    return Sample(list(PROMPT), list(COMPLETION), lp[0, len(PROMPT) - 1 :].tolist(), advantage=0.0)


def test_trainer_loss_with_the_exact_kl_is_the_mean_kl_from_the_reference_over_completion_tokens():
    tr = _trainer()
    s = _on_policy_sample(tr)  # advantage 0 and ratio 1: only the KL term is left
    ref = tr._ref_logprobs([s])
    loss, parts = tr._micro_loss([s], total_tokens=3, ref=ref)
    by_hand = _exact_kl_by_hand(tr).detach()
    assert by_hand.min() > 0
    assert float(loss.detach()) == pytest.approx(float(by_hand.mean()), rel=1e-5)
    assert parts["kl"] == pytest.approx(float(by_hand.mean()), rel=1e-5)
    params = list(tr.unwrapped.parameters())
    g_trainer = torch.autograd.grad(loss, params, allow_unused=True)
    g_hand = torch.autograd.grad(_exact_kl_by_hand(tr).mean(), params, allow_unused=True)
    for a, b in zip(g_trainer, g_hand):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.allclose(a, b, atol=1e-6)


def test_steps_with_the_exact_kl_pull_the_policy_back_to_the_reference():
    tr = _trainer()
    k0 = float(_exact_kl_by_hand(tr).sum())
    for _ in range(5):
        metrics = tr.step([_on_policy_sample(tr)])
    assert metrics["kl"] > 0 and float(_exact_kl_by_hand(tr).sum()) < 0.5 * k0


def test_an_unknown_kl_estimator_is_a_config_error():
    with pytest.raises(ConfigError, match="kl_estimator"):
        TrainerConfig(kl_estimator="k2")
