"""Full-feedback magnetic mirror descent: the referee's exact action values (checked against
OpenSpiel), the MMD target (checked by hand), its tabular dynamics on Kuhn poker, and the
recipe option (off: the run is unchanged; on: Kuhn is not played, its targets are trained)."""

import math

import numpy as np
import pyspiel
import pytest
import torch
from kuhn_fixtures import random_policy, recipe_args
from lm_fixtures import saved_weights
from open_spiel.python import policy as os_policy
from open_spiel.python.algorithms.action_value import TreeWalkCalculator

from lmselfplay.games import make
from lmselfplay.games.exploitability import exploitability
from lmselfplay.games.kuhn_poker import nash_policy
from lmselfplay.rl.average_policy import infoset_states
from lmselfplay.rl.exact_feedback import (
    ExactFeedback,
    FeedbackConfig,
    action_values,
    exact_feedback_games,
    mmd_policy,
    mmd_target,
)
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.metrics_logger import read_jsonl
from lmselfplay.utils.recipe_loader import run_recipe


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_action_values_match_openspiel(kuhn, seed):
    """q(I, a) = OpenSpiel's sum_h cf_reach(h) Q(h, a) / sum_h cf_reach(h), at all 12 sets."""
    pol = random_policy(kuhn, seed, 0.05, 0.95)
    game = pyspiel.load_game("kuhn_poker")
    tab = os_policy.TabularPolicy(game)
    ours = {k: "JQK"[int(k[0])] + ":" + k[1:] for k in tab.state_lookup}
    for key, row in tab.state_lookup.items():
        tab.action_probability_array[row] = pol[ours[key]]
    calc = TreeWalkCalculator(game)
    calc.compute_all_states_action_values([tab, tab])
    q = action_values(kuhn, pol)
    assert len(q) == len(calc.info_state_cf_prob) == 12
    for (_, key), weighted in calc.info_state_cf_prob_by_q_sum.items():
        np.testing.assert_allclose(q[ours[key]], weighted / calc.info_state_cf_prob[(_, key)], atol=1e-12)


def test_action_values_by_hand_at_the_equilibrium(kuhn):
    """Against Kuhn's equilibrium (alpha = 1/3): player 2 with a K facing a bet folds for -1
    and calls for +2 (J and Q both lose); player 2 with a Q facing a bet: player 1 bets a J
    with 1/3 and a K with 1, so the bet comes from a J with probability 1/4: calling wins 2
    with 1/4 and loses 2 with 3/4 (q = -1 = folding's: the indifference Nash needs)."""
    q = action_values(kuhn, nash_policy())
    np.testing.assert_allclose(q["K:b"], [-1.0, 2.0])
    np.testing.assert_allclose(q["Q:b"], [-1.0, -1.0])
    np.testing.assert_allclose(q["J:pb"], [-1.0, -2.0])


def test_mmd_target_by_hand():
    pi, rho, q = np.array([0.5, 0.5]), np.array([0.8, 0.2]), np.array([0.0, 1.0])
    # eta = alpha = 1: [pi * rho * exp(q)]^(1/2), normalized
    a, b = math.sqrt(0.5 * 0.8), math.sqrt(0.5 * 0.2 * math.e)
    np.testing.assert_allclose(mmd_target(pi, q, rho, 1.0, 1.0), [a / (a + b), b / (a + b)])
    # alpha = 0: Hedge, pi * exp(eta q)
    np.testing.assert_allclose(mmd_target(pi, q, rho, 2.0, 0.0), np.array([1, math.e**2]) / (1 + math.e**2))
    # the regularized equilibrium is a fixed point: pi ∝ rho exp(q / alpha) stays put
    fixed = rho * np.exp(q / 0.5)
    fixed /= fixed.sum()
    np.testing.assert_allclose(mmd_target(fixed, q, rho, 0.7, 0.5), fixed)
    with pytest.raises(ValueError, match="full-support"):
        mmd_target(np.array([1.0, 0.0]), q, rho, 1.0, 1.0)


def test_tabular_mmd_with_a_moving_magnet_reaches_nash(kuhn):
    """The exact dynamics the LM is distilled along, run tabularly with the recipe's default
    eta / alpha / magnet: from the uniform policy to exploitability < 0.001 in 100 steps
    (the uniform policy's is 0.458; 0.0002 measured), while a fixed uniform magnet stops at
    its regularized equilibrium, away from Nash (0.069)."""
    def run(magnet_every):
        cfg = FeedbackConfig()
        fb = ExactFeedback(kuhn, cfg.mmd_eta, cfg.mmd_alpha, magnet_every)
        pi = {k: [0.5, 0.5] for k in infoset_states(kuhn)}
        for step in range(100):
            pi, _ = fb.update(pi, step)  # a perfect distillation: the model becomes the target
        return exploitability(kuhn, pi)

    assert run(FeedbackConfig().mmd_magnet_every) < 0.001
    assert run(0) > 0.06


def test_update_moves_the_magnet_and_reports_the_gap(kuhn):
    fb = ExactFeedback(kuhn, 1.0, 0.3, magnet_every=2)
    pi0, pi1 = random_policy(kuhn, 0, 0.05, 0.95), random_policy(kuhn, 1, 0.05, 0.95)
    t0, m0 = fb.update(pi0, 0)
    assert fb.magnet == pi0 and "distill_gap" not in m0 and m0["mmd_step"] > 0
    _, m1 = fb.update(pi1, 1)
    assert fb.magnet == pi0  # not due
    assert m1["distill_gap"] == pytest.approx(max(abs(pi1[k][a] - t0[k][a]) for k in pi1 for a in (0, 1)))
    fb.update(pi1, 2)
    assert fb.magnet == pi1
    q = action_values(kuhn, pi1)
    assert fb.target == mmd_policy(kuhn, pi1, q, pi1, 1.0, 0.3)


def test_config_checks():
    for bad in (dict(feedback="exactly"), dict(mmd_eta=0.0), dict(mmd_alpha=-1.0), dict(mmd_magnet_every=-1)):
        with pytest.raises(ConfigError):
            FeedbackConfig(**bad)


def test_nim_action_values_by_hand():
    """Perfect information: q at a position is the return of the move, then the policy for
    both. At 3 stones with P(take 1 | 2 stones) = p: take 3 wins, take 2 leaves 1 (the
    opponent takes it), take 1 leaves 2, where the opponent takes 1 with p (then we take
    the last) or 2 with 1 - p: q = 2p - 1."""
    nim = make("nim", start=3)
    p = 0.3
    pi = {nim.information_state(s, nim.current_player(s)): [1.0, 0.0, 0.0] for s in infoset_states(nim).values()}
    pi["2 stones, player 1"] = [p, 1 - p, 0.0]
    pi["3 stones, player 0"] = [0.2, 0.3, 0.5]
    q = action_values(nim, pi)
    assert q["3 stones, player 0"] == pytest.approx([2 * p - 1, -1.0, 1.0])
    assert q["1 stones, player 0"] == pytest.approx([1.0, 0.0, 0.0])  # only 'take 1' is legal


def test_tabular_mmd_on_nim_reaches_the_optimal_moves():
    """The recipe's default eta / alpha / magnet, the model replaced by its target: from the
    uniform policy every optimal move has probability > 0.999 by step 20 (1.0 measured)."""
    from lmselfplay.games.solve import optimal_actions

    nim, cfg = make("nim"), FeedbackConfig()
    fb = ExactFeedback(nim, cfg.mmd_eta, cfg.mmd_alpha, cfg.mmd_magnet_every)
    reps = infoset_states(nim)
    pi = {k: [1.0 / len(nim.legal_actions(s)) if a in nim.legal_actions(s) else 0.0 for a in range(nim.n_actions)]
          for k, s in reps.items()}
    for step in range(20):
        pi, _ = fb.update(pi, step)
    p_opt = [sum(pi[k][a] for a in optimal_actions(nim, s)) for k, s in reps.items()]
    assert len(reps) == 28 and min(p_opt) > 0.999 and exploitability(nim, pi) < 1e-3


def test_exact_games_names_played_games_with_information_states():
    games = [make("nim"), make("tictactoe"), make("kuhn_poker")]
    assert [g.name for g in exact_feedback_games(games)] == ["kuhn_poker"]
    assert [g.name for g in exact_feedback_games(games, "kuhn_poker, nim")] == ["nim", "kuhn_poker"]
    assert [g.name for g in exact_feedback_games(games[1:], "nim,kuhn_poker")] == ["kuhn_poker"]  # nim not played
    with pytest.raises(ConfigError, match="not games"):
        exact_feedback_games(games, "nim,kuhn")
    with pytest.raises(ConfigError, match="information states"):
        exact_feedback_games(games, "tictactoe")


def test_distillation_keeps_the_answer_format_at_forced_moves():
    """At 1 stone the only answer is 'take 1': every one of its tokens gets a one-hot target
    (no game is played under exact feedback, so nothing else keeps the format)."""
    from lm_fixtures import tiny_tokenizer

    from lmselfplay.games.text import format_answer
    from lmselfplay.lm.prompt import encode_completion, encode_prompt
    from lmselfplay.rl.average_policy import distill_samples

    nim, tok = make("nim", start=1), tiny_tokenizer()
    samples = distill_samples(nim, tok, {"1 stones, player 0": [1.0, 0.0, 0.0]}, start="exact")
    answer = encode_completion(tok, format_answer(nim.action_text(0)), eos=False)
    prompt = encode_prompt(tok, nim.observation_text(nim.new_initial_state(), 0))
    assert [(s.prompt_ids, s.target) for s in samples] == [(prompt + answer[:j], (0, [answer[j]], [1.0]))
                                                            for j in range(len(answer))]


@pytest.mark.slow  # ~18 s; the Kuhn-alone and Nim-alone recipe tests run by default
def test_recipe_sampled_is_the_default_and_exact_trains_kuhn_without_playing(model_dir, tmp_path):
    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "default", 2))
    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "sampled", 2, feedback="sampled"))
    a, b = saved_weights(tmp_path / "default" / "final_model"), saved_weights(tmp_path / "sampled" / "final_model")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not any("mmd_step" in k for r in read_jsonl(tmp_path / "default" / "metrics.jsonl") for k in r)

    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "exact", 2, feedback="exact"))
    rows = read_jsonl(tmp_path / "exact" / "metrics.jsonl")
    assert [r["step"] for r in rows if "kuhn_poker/mmd_step" in r] == [0, 1]
    assert "kuhn_poker/distill_gap" in [r for r in rows if "kuhn_poker/mmd_step" in r][1]
    trained = [r for r in rows if "train/target_ce" in r]
    assert len(trained) == 2  # Kuhn's targets joined both steps' batches
    c = saved_weights(tmp_path / "exact" / "final_model")
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_recipe_exact_kuhn_alone_resumes_exactly(model_dir, tmp_path):
    kw = dict(games="kuhn_poker", feedback="exact", mmd_magnet_every=2, league_add_every=0)
    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "full", 3, **kw))
    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "cut", 2, **kw))
    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "cut", 3, **kw) + ["--resume", "true"])
    a, b = saved_weights(tmp_path / "full" / "final_model"), saved_weights(tmp_path / "cut" / "final_model")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert read_jsonl(tmp_path / "full" / "metrics.jsonl")[-1]["kuhn_poker/exploitability"] == \
        read_jsonl(tmp_path / "cut" / "metrics.jsonl")[-1]["kuhn_poker/exploitability"]
    assert not any("rollout/tokens" in r and r["rollout/tokens"] for r in read_jsonl(tmp_path / "full" / "metrics.jsonl"))  # no hand played


def test_recipe_exact_nim_alone_learns_from_the_positions_without_playing(model_dir, tmp_path):
    run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "nim", 2, games="nim", feedback="exact",
                                             exact_games="nim", league_add_every=0))
    rows = read_jsonl(tmp_path / "nim" / "metrics.jsonl")
    assert [r["step"] for r in rows if "nim/mmd_step" in r] == [0, 1]
    assert [r["nim/read_exploitability"] for r in rows if "nim/read_exploitability" in r][0] > 0.5
    assert not any(r.get("rollout/tokens") for r in rows)  # no game played
    assert any("train/target_ce" in r for r in rows)


def test_the_main_job_plays_every_game_and_the_exact_config_values_nim_and_kuhn():
    """The README's main job learns every game from played games (design: exact feedback is a
    reference and an option, never the default); selfplay_games_exact.yaml is that reference."""
    from pathlib import Path

    from lmselfplay.selfplay_games.config import SelfPlayConfigs
    from lmselfplay.selfplay_games.steps import make_feedback, make_games

    configs = Path(__file__).resolve().parents[2] / "recipes" / "configs"
    main = SelfPlayConfigs.parse(["--config", str(configs / "selfplay_games.yaml")])
    assert main.feedback.feedback == "sampled" and make_feedback(main.feedback, make_games(main.selfplay.games)) == {}
    assert main.selfplay.games == "nim,tictactoe,kuhn_poker"
    exact = SelfPlayConfigs.parse(["--config", str(configs / "selfplay_games_exact.yaml")])
    assert sorted(make_feedback(exact.feedback, make_games(exact.selfplay.games))) == ["kuhn_poker", "nim"]


def test_exact_feedback_needs_an_exploitability_game_or_exact_games(model_dir, tmp_path):
    with pytest.raises(ConfigError, match="exploitability"):
        run_recipe("selfplay_games", recipe_args(model_dir, tmp_path / "x", 1, games="nim", feedback="exact"))
    assert not (tmp_path / "x").exists()  # rejected before the output folder is locked


def test_target_passes_are_extra_target_only_passes():
    """On a pure-target batch, 1 pass + 2 target passes = 3 passes (constant learning rate);
    a batch with no target sample gets no extra pass (weights bit-identical to 0 passes)."""
    from lm_fixtures import tiny_model, tiny_tokenizer

    from lmselfplay.lm.trajectory import Sample
    from lmselfplay.rl.trainer import PolicyTrainer, TargetLossConfig, TrainerConfig

    tok = tiny_tokenizer()
    targets = [Sample([1, 5, 9], [], [], role="g", target=(0, [4, 7], [0.25, 0.75])),
               Sample([1, 6], [], [], role="g", target=(0, [3], [1.0]))]
    played = [Sample([1, 5], [4, 7], [-1.0, -1.0], advantage=1.0, role="g")]

    def weights(samples, target_passes=0, **kw):
        cfg = dict(learning_rate=1e-2, beta=0.1, lr_scheduler_type="constant", **kw)
        trainer = PolicyTrainer(tiny_model(seed=2), tok, TrainerConfig(**cfg), total_steps=10,
                                target_loss=TargetLossConfig(target_passes=target_passes), seed=0)
        for _ in range(2):
            trainer.step(samples)
        return [p.detach().clone() for p in trainer.unwrapped.parameters()]

    three, extra = weights(targets, num_iterations=3), weights(targets, num_iterations=1, target_passes=2)
    one = weights(targets, num_iterations=1)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(three, extra))
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(one, extra))
    plain, none = weights(played, num_iterations=1), weights(played, num_iterations=1, target_passes=3)
    assert all(torch.equal(a, b) for a, b in zip(plain, none))
    with pytest.raises(ConfigError):
        TargetLossConfig(target_passes=-1)
