"""How the exact game metrics read a policy: ``bare`` (teacher-forced answers right after the
assistant header) or ``sampled`` (N generated answers, thinking included, parsed); the readout
is named in the results, and what only works on bare answers (exact feedback, distilling the
average policy, search self-play's prior) refuses a policy that thinks, in one line."""

from __future__ import annotations

from collections import Counter
from functools import partial

import pytest
from fake_engine import ScriptedEngine

from lmselfplay.eval import game_metrics
from lmselfplay.eval.game_metrics import optimal_move_rates, policy_exploitability
from lmselfplay.games import make
from lmselfplay.games.exploitability import exploitability
from lmselfplay.games.solve import optimal_actions
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.lm.readout import decision_states, resolve_readout
from lmselfplay.models.policy import load_tokenizer
from lmselfplay.search_selfplay.config import SearchSelfPlayConfigs
from lmselfplay.selfplay_games.config import SelfPlayConfigs
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.recipe_loader import RECIPES_DIR, run_recipe


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def test_auto_reads_a_thinking_policy_by_sampling():
    assert resolve_readout("auto", thinking=True) == "sampled"
    assert resolve_readout("auto", thinking=False) == "bare"
    assert resolve_readout("bare", thinking=True) == "bare"  # asked for: allowed, and named in the results
    with pytest.raises(ConfigError, match="readout"):
        resolve_readout("exact", thinking=False)


def alternating(answers_for):
    """An answer function cycling through ``answers_for(prompt)`` per prompt (N samples of one
    position see each answer in turn)."""
    seen: Counter = Counter()

    def answer(prompt: str) -> str:
        options = answers_for(prompt)
        seen[prompt] += 1
        return options[(seen[prompt] - 1) % len(options)]

    return answer


def test_sampled_optimal_move_rate_counts_what_is_played(tok):
    """Half the samples think (a decoy move inside the think block), then answer the optimal
    move; the other half never close their think block. The answer after </think> counts, the
    one inside does not, an unclosed block is no answer: P(optimal) = 0.5 exactly, with a Wilson
    interval over all samples and half the samples legal. The bare readout of the same engine
    (teacher-forced scores, all equal) is named bare and has no sampling fields."""
    nim = make("nim")
    states = decision_states(nim)[:6]
    by_prompt = {}
    for s in states:
        opt = optimal_actions(nim, s)[0]
        wrong = next(a for a in nim.legal_actions(s) if a not in optimal_actions(nim, s)) \
            if len(optimal_actions(nim, s)) < len(nim.legal_actions(s)) else opt
        text = tok.decode(encode_prompt(tok, nim.observation_text(s, nim.current_player(s))),
                          skip_special_tokens=True)
        by_prompt[text] = [f"<think>maybe <move>{nim.action_text(wrong)}</move></think><move>{nim.action_text(opt)}</move>",
                           f"<think>still thinking <move>{nim.action_text(opt)}</move>"]
    engine = ScriptedEngine(tok, alternating(lambda p: by_prompt[p]))
    r = optimal_move_rates(engine, tok, nim, states, max_new_tokens=8, readout="sampled", samples=4)
    assert r["readout"] == "sampled" and r["readout_samples"] == 4
    assert r["expected_optimal_prob"] == pytest.approx(0.5) and r["readout_legal_rate"] == pytest.approx(0.5)
    lo, hi = r["expected_optimal_ci"]
    assert lo < 0.5 < hi and hi - lo < 0.5  # 24 samples
    assert r["argmax_optimal_rate"] == 1.0
    bare = optimal_move_rates(engine, tok, nim, states, max_new_tokens=8, readout="bare")
    assert bare["readout"] == "bare" and "readout_samples" not in bare


def test_sampled_exploitability_is_the_exploitability_of_the_played_policy(tok):
    """An engine that always bets with a King and checks/folds otherwise (answered after a think
    block): the sampled tabular policy is that deterministic policy, and its exploitability is
    the exact one of the policy written down by hand."""
    kuhn = make("kuhn_poker")

    def answer(prompt: str) -> str:
        card_line = next(line for line in prompt.splitlines() if "Your card:" in line)
        aggressive = "K" in card_line.split("Your card:")[-1]
        return "<think>my card decides</think><move>" + ("bet" if aggressive else "pass") + "</move>"

    engine = ScriptedEngine(tok, answer)
    r = policy_exploitability(engine, tok, kuhn, readout="sampled", samples=3)
    assert r["readout"] == "sampled" and r["readout_legal_rate"] == 1.0
    hand = {k: [0.0, 1.0] if k.startswith("K") else [1.0, 0.0] for k in r["policy"]}
    assert r["policy"] == hand
    assert r["exploitability"] == pytest.approx(exploitability(kuhn, hand))


def test_evaluate_names_the_readout_in_its_flat_results(tok):
    nim = make("nim")
    states = decision_states(nim)[:3]
    engine = ScriptedEngine(tok, lambda p: "<move>1</move>")
    flat = game_metrics.policy_metrics(engine, tok, nim, states, n_games=2, max_new_tokens=8, readout="sampled",
                                 readout_samples=2)
    assert flat["readout"] == "sampled" and flat["readout_samples"] == 2
    assert flat["optimal_move_prob_ci_low"] <= flat["optimal_move_prob"] <= flat["optimal_move_prob_ci_high"]
    assert "readout" in game_metrics.format_table("nim", flat)  # the table prints the name


def selfplay_config(*argv):
    return SelfPlayConfigs.parse(list(argv))


def test_exact_feedback_refuses_a_thinking_policy():
    with pytest.raises(ConfigError, match="feedback: exact.*think"):
        selfplay_config("--feedback", "exact", "--enable_thinking", "true")
    selfplay_config("--feedback", "sampled", "--enable_thinking", "true")  # sampled feedback serves it
    selfplay_config("--feedback", "exact", "--enable_thinking", "false")
    with pytest.raises(ConfigError, match="distill_steps"):
        selfplay_config("--average_policy", "true", "--distill_steps", "5", "--enable_thinking", "true")
    selfplay_config("--average_policy", "true", "--distill_steps", "0", "--enable_thinking", "true")
    with pytest.raises(ConfigError, match="readout"):
        selfplay_config("--readout", "greedy")


def test_a_template_that_thinks_by_default_is_refused_at_load_in_one_line(standin, tmp_path, capsys):
    """The exact-feedback main job (selfplay_games_exact.yaml) on the Qwen3 stand-in, enable_thinking left to the
    template (which thinks): one ``error:`` line, exit 2, before any training."""
    cfg = str(RECIPES_DIR / "configs" / "selfplay_games_exact.yaml")
    code = run_main(partial(run_recipe, "selfplay_games"), ["--config", cfg, "--model_name_or_path",
                                                            str(standin("qwen3")), "--output_dir",
                                                            str(tmp_path / "run"), "--dtype", "float32"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in err and len(errors) == 1
    assert "feedback: exact" in errors[0] and "thinks" in errors[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_search_selfplay_refuses_a_thinking_policy():
    with pytest.raises(ConfigError, match="enable_thinking"):
        SearchSelfPlayConfigs.parse(["--enable_thinking", "true"])
