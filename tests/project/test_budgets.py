"""Every generation budget is a config / CLI value (a chat or thinking model needs hundreds of
tokens to reach ``</move>``): what the user types reaches the engine, and a budget below 1 is a
one-line error."""

from __future__ import annotations

import pytest

from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.selfplay_games.config import SelfPlayConfigs
from lmselfplay.utils.config import ConfigError


@pytest.fixture
def budgets(monkeypatch):
    """The ``max_new_tokens`` of every HFEngine.generate call made while the test runs."""
    seen: list[int] = []
    original = HFEngine.generate

    def recording(self, prompts, sampling):
        seen.append(sampling.max_new_tokens)
        return original(self, prompts, sampling)

    monkeypatch.setattr(HFEngine, "generate", recording)
    return seen


def test_eval_game_budget_reaches_every_generation(budgets, tmp_path):
    from lmselfplay.cli import main

    assert main(["eval-game", "nim", "--n-games", "2", "--max-new-tokens", "5", "--readout", "sampled",
                 "--readout-samples", "1", "--json", str(tmp_path / "r.json")]) == 0
    assert budgets and set(budgets) == {5}  # greedy answers, the sampled readout and the games


def test_arena_budget_reaches_the_games(budgets, tmp_path):
    from lmselfplay.cli import main

    assert main(["arena", "nim", "--models", "embedded", "--bots", "random", "--games", "2", "--bootstrap", "5",
                 "--max-new-tokens", "7", "--out", str(tmp_path)]) == 0
    assert budgets and set(budgets) == {7}


def test_reasoning_budget_overrides_the_suite(budgets, tmp_path):
    from lmselfplay.cli import main

    assert main(["eval", "reasoning", "--suite", "tiny", "--max-new-tokens", "3", "--out", str(tmp_path)]) == 0
    assert budgets and set(budgets) == {3}


def test_play_budget(budgets):
    from lmselfplay.human_play import main

    lines = []
    assert main(["nim", "--seat", "2", "--max-new-tokens", "4"], input_fn=lambda _: "quit", out=lines.append) == 0
    assert budgets == [4]


def test_search_selfplay_budget_reaches_the_raw_evaluation(monkeypatch):
    """The raw LLM's greedy games and exact metrics at budget 0 get ``max_new_tokens``."""
    from lmselfplay.alphazero.adapter import CachedGame, SearchGame
    from lmselfplay.games import make
    from lmselfplay.search_selfplay import metrics as search_metrics
    from lmselfplay.search_selfplay.config import SearchSelfPlayConfigs

    cfg = SearchSelfPlayConfigs.parse(["--max_new_tokens", "11"])
    cfg.search.eval_budgets = []  # only the raw LLM (budget 0's exact metrics and games)
    seen = {}

    def fake_evaluate(engine, tok, game, positions, n_games, sampling, seed, max_new_tokens):
        seen.update(sampling=sampling.max_new_tokens, greedy=max_new_tokens)
        return {}

    monkeypatch.setattr(search_metrics.game_metrics, "policy_metrics", fake_evaluate)
    monkeypatch.setattr(search_metrics, "illegal_mass", lambda evaluator, face: 0.0)
    monkeypatch.setattr(search_metrics, "HFEngine", lambda model, tok: None)
    search_metrics.strength_per_budget(CachedGame(SearchGame(make("nim"))), None, None, None, cfg, 0)
    assert seen == {"sampling": 11, "greedy": 11}
    assert SearchSelfPlayConfigs.parse([]).search.max_new_tokens == 8  # the value it had


@pytest.mark.parametrize("argv,field", [
    (["--max_new_tokens", "0"], "max_new_tokens"),
    (["--text_max_new_tokens", "-1"], "text_max_new_tokens"),
    (["--readout_samples", "0"], "readout_samples"),
    (["--eval_max_new_tokens", "-2"], "eval_max_new_tokens"),
])
def test_selfplay_budgets_below_one_are_named(argv, field):
    with pytest.raises(ConfigError, match=field):
        SelfPlayConfigs.parse(argv)


def test_cli_budget_below_one_is_one_line(capsys):
    from lmselfplay.cli import main

    with pytest.raises(SystemExit) as e:
        main(["eval-game", "nim", "--max-new-tokens", "0"])
    assert e.value.code == 2 and "--max-new-tokens" in capsys.readouterr().err
