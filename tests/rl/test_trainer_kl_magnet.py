"""The KL term's knobs: one coefficient per game / role, its schedule, and the moving
reference (magnetic mirror descent's magnet) — full model, LoRA, and across a checkpoint."""

import math

import pytest
import torch
from lm_fixtures import tiny_model, tiny_trainer

from lmselfplay.lm.batching import token_logprobs
from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.distributed import swapped_weights
from lmselfplay.rl.kl import KLCoefficient, beta_factor, beta_for
from lmselfplay.rl.trainer import TrainerConfig
from lmselfplay.utils.config import ConfigError, parse_configs


def _plain(value):
    return KLCoefficient.from_config(value).as_config()


def test_beta_accepts_numbers_strings_and_mappings():
    assert _plain(0.2) == 0.2 and _plain("0.2") == 0.2 and _plain(0) == 0.0
    assert _plain("nim=0.1, kuhn_poker/p1=0.3") == {"nim": 0.1, "kuhn_poker/p1": 0.3}
    assert _plain({"nim": 0.1, "kuhn_poker": "0.2"}) == {"nim": 0.1, "kuhn_poker": 0.2}
    for bad in ("nim", "nim=x", "=0.1", "nim=-1", -0.5, {"nim": None}, [0.1], True):
        with pytest.raises(ValueError):
            KLCoefficient.from_config(bad)


def test_beta_is_a_mapping_in_yaml_and_a_string_on_the_command_line(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("beta: {nim: 0.1, kuhn_poker: 0.2}\n")
    beta = parse_configs((TrainerConfig,), ["--config", str(cfg_file)])[0].beta
    assert beta.as_config() == {"nim": 0.1, "kuhn_poker": 0.2}
    beta = parse_configs((TrainerConfig,), ["--beta", "nim=0.05,default=1"])[0].beta
    assert beta.as_config() == {"nim": 0.05, "default": 1.0}
    assert parse_configs((TrainerConfig,), ["--beta", "0.3"])[0].beta == KLCoefficient(0.3)
    with pytest.raises(ValueError, match="nim=oops"):
        parse_configs((TrainerConfig,), ["--beta", "nim=oops"])


def test_beta_for_takes_the_longest_role_prefix_then_task_then_default():
    beta = {"kuhn_poker": 0.2, "kuhn_poker/p1": 0.5, "nim": 0.1, "default": 0.7}
    assert beta_for(beta, "kuhn_poker/p1/initial", "kuhn_poker") == 0.5
    assert beta_for(beta, "kuhn_poker/p0/reset", "kuhn_poker") == 0.2
    assert beta_for(beta, "nim/p0/initial", "nim") == 0.1
    assert beta_for(beta, "p0", "nim") == 0.1  # not a game role: the task decides
    assert beta_for(beta, "tictactoe/p0/initial", "tictactoe") == 0.7
    assert beta_for(0.3, "anything", "") == 0.3
    with pytest.raises(KeyError, match="tictactoe"):
        beta_for({"nim": 0.1}, "tictactoe/p0/initial", "tictactoe")


def test_selfplay_recipe_checks_beta_against_its_games():
    from lmselfplay.games import make
    from lmselfplay.selfplay_games.config import check_beta

    games = [make("nim"), make("kuhn_poker")]
    check_beta({"nim": 0.1, "kuhn_poker": 0.2, "tictactoe": 1.0}, games)  # unplayed: fine
    with pytest.raises(ConfigError, match="kuhn"):
        check_beta({"nim": 0.1, "kuhn": 0.2}, games)  # a typo is named
    with pytest.raises(ConfigError, match="kuhn_poker"):
        check_beta({"nim": 0.1}, games)  # a game played without a coefficient


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_beta_schedule_values(schedule):
    cfg = TrainerConfig(beta=0.2, beta_schedule=schedule, beta_final_ratio=0.1)
    got = [beta_factor(cfg, t, total_steps=100) for t in (0, 25, 50, 100, 150)]
    want = {"constant": [1, 1, 1, 1, 1],
            "linear": [1, 1 - 0.9 * 0.25, 1 - 0.9 * 0.5, 0.1, 0.1],
            "cosine": [1, 1 - 0.9 * (1 - math.cos(math.pi / 4)) / 2, 1 - 0.9 * 0.5, 0.1, 0.1]}[schedule]
    assert got == pytest.approx(want)
    with pytest.raises(ValueError, match="beta_schedule"):
        TrainerConfig(beta_schedule="exp")


def _lp(model, s):
    ids = torch.tensor([s.prompt_ids + s.completion_ids])
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
    return lp[0, len(s.prompt_ids) - 1:].tolist()


def _batch(trainer):
    nim = Sample([1, 50, 60, 70], [90, 100, 2], [], role="nim/p0/initial", task="nim")
    kuhn = Sample([1, 55, 65], [95, 2], [], role="kuhn_poker/p1/initial", task="kuhn_poker")
    for s in (nim, kuhn):  # on-policy behaviour log-probs, zero advantage: only the KL is left
        s.behaviour_logprobs = _lp(trainer.unwrapped, s)
    return [nim, kuhn]


def test_each_sample_gets_its_games_coefficient_in_the_loss():
    """loss = sum_i beta_i * sum_t k3(ref_it - logp_it) / tokens, with a hand-made reference."""
    tr = tiny_trainer(beta={"nim": 0.5, "kuhn_poker/p1": 3.0, "kuhn_poker": 100.0}, beta_schedule="linear",
                  beta_final_ratio=0.0, total_steps=4)
    tr.step_count = 1  # schedule factor 0.75
    batch = _batch(tr)
    ref = {id(s): [lp - 0.3 * (k + 1) for k, lp in enumerate(s.behaviour_logprobs)] for s in batch}
    loss, parts = tr._micro_loss(batch, total_tokens=5, ref=ref)
    want = 0.0
    for s, coef in zip(batch, (0.5 * 0.75, 3.0 * 0.75)):
        d = torch.tensor(ref[id(s)]) - torch.tensor(s.behaviour_logprobs)
        want += coef * float((torch.exp(d) - d - 1).sum())
    assert float(loss.detach()) == pytest.approx(want / 5, rel=1e-5)
    swapped = {"nim": 3.0, "kuhn_poker": 0.5}  # the same numbers on the other samples: a different loss
    tr.cfg.beta = KLCoefficient.from_config(swapped)
    assert float(tr._micro_loss(batch, total_tokens=5, ref=ref)[0].detach()) != pytest.approx(want / 5, rel=1e-3)


def test_magnet_update_copies_the_policy_into_the_reference():
    tr = tiny_trainer(beta=0.5, ref_update_every=2)
    batch = _batch(tr)
    for s in batch:
        s.advantage = 1.0
    initial = [p.detach().clone() for p in tr.unwrapped.parameters()]
    tr.step(batch)  # step 1: the reference is still the initial policy
    assert all(torch.equal(q, p0) for q, p0 in zip(tr.ref_model.parameters(), initial))
    assert not all(torch.equal(q, p) for q, p in zip(tr.ref_model.parameters(), tr.unwrapped.parameters()))
    tr.step(batch)  # step 2: the magnet moves to the current policy
    assert tr.magnet_step == 2
    assert all(torch.equal(q, p) for q, p in zip(tr.ref_model.parameters(), tr.unwrapped.parameters()))
    ref = tr._ref_logprobs(batch)
    assert all(ref[id(s)] == pytest.approx(_lp(tr.unwrapped, s), abs=1e-6) for s in batch)


def test_magnet_survives_a_checkpoint(tmp_path):
    tr = tiny_trainer(beta=0.5, ref_update_every=1)
    batch = _batch(tr)
    for s in batch:
        s.advantage = 1.0
    tr.step(batch)
    tr.save_checkpoint(tmp_path)
    fresh = tiny_trainer(beta=0.5, ref_update_every=1)
    fresh.load_checkpoint(tmp_path / "checkpoint-1")
    assert fresh.magnet_step == 1
    assert all(torch.equal(a, b) for a, b in zip(fresh.ref_model.parameters(), tr.ref_model.parameters()))


def _lora_model():
    from peft import LoraConfig, get_peft_model

    return get_peft_model(tiny_model(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))


def test_lora_magnet_is_the_adapter_at_the_update_and_the_swap_is_exact():
    tr = tiny_trainer(model=_lora_model(), beta=0.5, ref_update_every=2, learning_rate=5e-2)
    batch = _batch(tr)
    for s in batch:
        s.advantage = 1.0
    tr.step(batch)
    with tr.unwrapped.disable_adapter():  # before the first move: the adapter-disabled model
        base = {id(s): _lp(tr.unwrapped, s) for s in batch}
    ref = tr._ref_logprobs(batch)
    assert all(ref[id(s)] == pytest.approx(base[id(s)], abs=1e-6) for s in batch)
    assert not all(ref[id(s)] == pytest.approx(_lp(tr.unwrapped, s), abs=1e-4) for s in batch)
    tr.step(batch)  # the magnet moves: the reference now is the current adapter
    adapter = [p.detach().clone() for p in tr._adapter_params()]
    assert tr.magnet is not None and all(torch.equal(a, m) for a, m in zip(adapter, tr.magnet))
    ref = tr._ref_logprobs(batch)
    assert all(ref[id(s)] == pytest.approx(_lp(tr.unwrapped, s), abs=1e-6) for s in batch)
    tr.step(batch)  # step 3: the policy moves on, the magnet stays, the swap leaves no trace
    own = [p.detach().clone() for p in tr._adapter_params()]
    assert not all(torch.equal(a, b) for a, b in zip(own, adapter))
    ref = tr._ref_logprobs(batch)
    assert all(torch.equal(a, b) for a, b in zip(own, tr._adapter_params()))
    assert all(p.requires_grad for p in tr._adapter_params())
    with swapped_weights(tr._adapter_params(), adapter, zero3=False):
        at_magnet = {id(s): _lp(tr.unwrapped, s) for s in batch}
    assert all(ref[id(s)] == pytest.approx(at_magnet[id(s)], abs=1e-6) for s in batch)
