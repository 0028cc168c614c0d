"""The reach-weighted average policy (fictitious self-play's output) and its distillation."""

import json

import numpy as np
import pytest
import torch
from kuhn_fixtures import random_policy, recipe_args
from lm_fixtures import saved_weights, tiny_model, tiny_tokenizer

from lmselfplay.games.exploitability import exploitability, policy_value
from lmselfplay.games.kuhn_poker import nash_policy
from lmselfplay.rl.average_policy import (
    AverageConfig,
    AveragePolicy,
    distill_samples,
    infoset_states,
    own_reach,
)
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.metrics_logger import read_jsonl
from lmselfplay.utils.recipe_loader import run_recipe


def test_two_iterates_by_hand(kuhn):
    """Player 1 (seat 0) with a J passes with prob 0.2 in iterate A and 0.8 in B; after
    pass-bet A calls always and B never. The mixture of A and B calls with probability
    (0.2 * 1 + 0.8 * 0) / (0.2 + 0.8) = 0.2 there, not the plain mean 0.5."""
    a, b = dict(nash_policy()), dict(nash_policy())
    a["J:"], b["J:"] = [0.2, 0.8], [0.8, 0.2]
    a["J:pb"], b["J:pb"] = [0.0, 1.0], [1.0, 0.0]
    avg = AveragePolicy(kuhn)
    avg.add(a)
    avg.add(b)
    pol = avg.policy()
    assert pol["J:pb"] == pytest.approx([0.8, 0.2])
    assert pol["J:"] == pytest.approx([0.5, 0.5])  # the root set: own reach 1 in both
    # weights: A counts 3 times -> (3 * 0.2 * 1) / (3 * 0.2 + 0.8) = 0.6 / 1.4
    avg3 = AveragePolicy(kuhn)
    avg3.add(a, 3.0)
    avg3.add(b, 1.0)
    assert avg3.policy()["J:pb"][1] == pytest.approx(0.6 / 1.4)


def test_own_reach_counts_only_the_players_own_moves(kuhn):
    pol = random_policy(kuhn, 0)
    reach = own_reach(kuhn, pol)
    assert reach["Q:"] == 1.0 and reach["Q:p"] == 1.0  # first moves of either seat
    assert reach["Q:pb"] == pytest.approx(pol["Q:"][0])  # seat 0 passed first
    assert reach["Q:b"] == 1.0  # seat 1 facing a bet: only seat 0 moved
    assert len(reach) == 12


def test_average_is_the_mixture_against_any_opponent(kuhn):
    """Kuhn's theorem, checked independently: against a fixed opponent, the average's
    value equals the weighted mean of the iterates' values (the payoff is linear in the
    mixed strategy), for the seat-0 and the seat-1 parts alike."""
    iterates, weights = [random_policy(kuhn, s) for s in (1, 2, 3)], [1.0, 2.0, 5.0]
    avg = AveragePolicy(kuhn)
    for it, w in zip(iterates, weights):
        avg.add(it, w)
    seat = {k: kuhn.current_player(s) for k, s in infoset_states(kuhn).items()}
    opponent = random_policy(kuhn, 9)

    def value(mine, me):
        mixed = {k: (mine[k] if seat[k] == me else opponent[k]) for k in seat}
        return policy_value(kuhn, mixed)[me]

    for me in (0, 1):
        expected = sum(w * value(it, me) for it, w in zip(iterates, weights)) / sum(weights)
        assert value(avg.policy(), me) == pytest.approx(expected, abs=1e-12)
    # seat 0 moves twice on a path (pass, then call or fold): its plain mean is not the mixture;
    # seat 1 moves once, so its own reach is always 1 and the two agree
    plain = {k: np.average([it[k] for it in iterates], axis=0, weights=weights).tolist() for k in seat}
    expected = sum(w * value(it, 0) for it, w in zip(iterates, weights)) / sum(weights)
    assert abs(value(plain, 0) - expected) > 1e-4


def test_average_of_equilibria_is_an_equilibrium(kuhn):
    avg = AveragePolicy(kuhn)
    avg.add(nash_policy(0.0))
    avg.add(nash_policy(1 / 3))
    assert exploitability(kuhn, avg.policy()) == pytest.approx(0.0, abs=1e-12)


def test_state_round_trip_and_bad_input(kuhn):
    avg = AveragePolicy(kuhn)
    with pytest.raises(ValueError, match="no policy"):
        avg.policy()
    avg.add(random_policy(kuhn, 4))
    again = AveragePolicy(kuhn)
    again.load_state_dict(json.loads(json.dumps(avg.state_dict())))
    again.add(random_policy(kuhn, 5))
    avg.add(random_policy(kuhn, 5))
    assert again.policy() == avg.policy()
    bad = random_policy(kuhn, 6)
    bad["K:"] = [float("nan"), 1.0]
    with pytest.raises(ValueError, match="K:"):
        avg.add(bad)
    with pytest.raises(ValueError, match="weight"):
        avg.add(random_policy(kuhn, 6), 0.0)


def test_config_checks():
    assert AverageConfig().average_policy is False  # off by default
    with pytest.raises(ConfigError):
        AverageConfig(average_every=0)
    with pytest.raises(ConfigError):
        AverageConfig(average_weighting="quadratic")
    from lmselfplay.selfplay_games.config import SelfPlayConfigs

    # the check spanning the average's and the trainer's configs is the recipe's
    with pytest.raises(ConfigError, match="schedule"):
        SelfPlayConfigs.from_values(average_policy=True, lr_scheduler_type="linear")
    SelfPlayConfigs.from_values(average_policy=True, lr_scheduler_type="linear", distill_steps=0)
    c = AverageConfig(average_every=5, average_start=10, average_weighting="linear")
    assert [s for s in range(30) if c.averaged_at(s)] == [10, 15, 20, 25]
    assert c.weight_at(20) == 11.0


def test_distillation_teaches_the_tabular_policy(kuhn):
    """The trainer's target cross-entropy on these samples moves the LM's tabular policy
    (normalized teacher-forced answer probabilities) to the target at every set."""
    from lmselfplay.lm.engines import HFEngine
    from lmselfplay.lm.readout import tabular_policy
    from lmselfplay.rl.trainer import PolicyTrainer, TargetLossConfig, TrainerConfig

    tok = tiny_tokenizer()
    target = random_policy(kuhn, 7)
    samples = distill_samples(kuhn, tok, target)
    # per set: every token of the common prefix ('<move>') a one-hot target, the first token
    # where 'pass' and 'bet' answers differ the policy's probabilities, every later token of
    # each answer a one-hot target
    from lmselfplay.games.text import format_answer
    from lmselfplay.lm.prompt import encode_completion

    answers = [encode_completion(tok, format_answer(w), eos=False) for w in ("pass", "bet")]
    k = next(j for j in range(len(answers[0])) if answers[0][j] != answers[1][j])
    assert k >= 1  # '<move>' at least
    per_set = k + 1 + sum(len(x) - k - 1 for x in answers)
    assert len(samples) == 12 * per_set and all(s.completion_ids == [] for s in samples)
    for i, key in enumerate(sorted(infoset_states(kuhn))):  # in key order
        block = samples[per_set * i : per_set * (i + 1)]
        prefix, first, rest = block[:k], block[k], block[k + 1 :]
        prompt = first.prompt_ids[: len(first.prompt_ids) - k]
        assert [(s.prompt_ids, s.target[1:]) for s in prefix] == [
            (prompt + answers[0][:j], ([answers[0][j]], [1.0])) for j in range(k)]
        assert first.prompt_ids[len(first.prompt_ids) - k:] == answers[0][:k]
        assert first.target[:2] == (0, [answers[0][k], answers[1][k]])
        assert first.target[2] == pytest.approx(target[key])
        expected = [(prompt + x[:j], [x[j]]) for x in answers for j in range(k + 1, len(x))]
        assert [(s.prompt_ids, s.target[1]) for s in rest] == expected
        assert all(s.target[2] == [1.0] for s in rest)
    # training: one P(bet) = 0.3 everywhere (a random 2-layer model barely reads the card, so
    # set-dependent targets would test its capacity; the embedded model's fit is benchmarked).
    # The metric is the answers' whole-sequence probability: without the one-hot suffix
    # targets the tokens after the move keep their random-model odds and it misses.
    torch.manual_seed(0)
    trainer = PolicyTrainer(tiny_model(seed=1), tok, TrainerConfig(learning_rate=1e-2, beta=0.0, num_iterations=1),
                            total_steps=200, target_loss=TargetLossConfig(), seed=0)
    flat = {k: [0.7, 0.3] for k in target}

    def error():  # worst |P(bet) learned - 0.3| over the 12 sets
        learned = tabular_policy(HFEngine(trainer.unwrapped, tok), tok, kuhn)
        return max(abs(learned[k][1] - 0.3) for k in target)

    before = error()
    for _ in range(30):
        trainer.step(distill_samples(kuhn, tok, flat))
    assert before > 0.5 and error() < 0.05, (before, error())


@pytest.mark.slow  # ~20 s: two recipe runs
def test_recipe_option_off_changes_nothing_and_on_reports_both(model_dir, tmp_path):
    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "off", 2))
    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "on", 2, average_policy="true", average_every=1, distill_steps=0))
    off, on = saved_weights(tmp_path / "off" / "final_model"), saved_weights(tmp_path / "on" / "final_model")
    for k in off:  # reading the policy to average it does not touch the training path
        assert torch.equal(off[k], on[k]), k
    rows_off = read_jsonl(tmp_path / "off" / "metrics.jsonl")
    assert not any("avg" in k or "distilled" in k for r in rows_off for k in r)
    rows = read_jsonl(tmp_path / "on" / "metrics.jsonl")
    assert [r["step"] for r in rows if "kuhn_poker/iterate_policy" in r] == [0, 1]  # + the final one
    final = rows[-1]
    assert 0 <= final["kuhn_poker/avg_exploitability"] <= 3

    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "dist", 2, average_policy="true", average_every=1, distill_steps=3))
    final = read_jsonl(tmp_path / "dist" / "metrics.jsonl")[-1]
    assert final["kuhn_poker/exploitability"] == rows[-1]["kuhn_poker/exploitability"]  # the last iterate
    assert {"distilled/kuhn_poker/exploitability", "distilled/nim/optimal_move_prob",
            "distilled/target_ce"} <= set(final)
    dist = saved_weights(tmp_path / "dist" / "final_model")
    assert any(not torch.equal(dist[k], on[k]) for k in on)  # the saved model is the distilled one


def test_recipe_resume_keeps_the_average(model_dir, tmp_path):
    kw = dict(games="kuhn_poker", average_policy="true", average_every=1, distill_steps=0)
    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "full", 3, **kw))
    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "cut", 2, **kw))
    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "cut", 3, **kw) + ["--resume", "true"])
    rows = {name: read_jsonl(tmp_path / name / "metrics.jsonl")[-1]
            for name in ("full", "cut")}
    assert rows["full"]["kuhn_poker/avg_exploitability"] == rows["cut"]["kuhn_poker/avg_exploitability"]


def test_average_needs_an_exploitability_game(model_dir, tmp_path):
    with pytest.raises(ConfigError, match="exploitability"):
        run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "x", 1, games="nim", average_policy="true"))


def test_pure_target_step_is_the_cross_entropy_step():
    """A batch of samples without completion tokens (distillation) skips the policy-gradient
    and reference forwards: the update equals one AdamW step on the mean target
    cross-entropy, computed here by hand; a batch mixing them with played turns also runs."""
    from lmselfplay.lm.trajectory import Sample
    from lmselfplay.rl.trainer import PolicyTrainer, TargetLossConfig, TrainerConfig

    tok = tiny_tokenizer()
    samples = [Sample([1, 5, 9], [], [], role="g", target=(0, [4, 7], [0.25, 0.75]), weight=2.0),
               Sample([1, 6], [], [], role="g", target=(0, [3], [1.0]))]
    cfg = dict(learning_rate=1e-2, beta=0.5, num_iterations=1, max_grad_norm=0.0)
    trainer = PolicyTrainer(tiny_model(seed=2), tok, TrainerConfig(**cfg), total_steps=10,
                            target_loss=TargetLossConfig())
    manual = tiny_model(seed=2)
    opt = torch.optim.AdamW(manual.parameters(), lr=1e-2)
    ce = []
    for s in samples:
        logp = torch.log_softmax(manual(input_ids=torch.tensor([s.prompt_ids])).logits[0, -1], -1)
        ce.append(-(logp[s.target[1]] * torch.tensor(s.target[2])).sum() * s.weight)
    (torch.stack(ce).sum() / 3.0).backward()
    opt.step()
    metrics = trainer.step(samples)
    assert metrics["target_ce"] == pytest.approx(float(torch.stack(ce).detach().sum() / 3.0), rel=1e-5)
    for (name, a), b in zip(trainer.unwrapped.named_parameters(), manual.parameters()):
        assert torch.allclose(a, b, atol=1e-4), name  # AdamW moves each weight by ~lr = 1e-2
    played = Sample([1, 5], [4, 7], [-1.0, -1.0], advantage=1.0, role="g")
    trainer.step(samples + [played])  # the KL reference is computed for the played turn only
