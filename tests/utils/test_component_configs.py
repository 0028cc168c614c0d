"""The component configs (engine, weight-sync check, overlap, policy, run, checkpoints) each validate alone; the
engine's answer budget is what its recipe names, never a field picked by its name; a dtype
error names the field it came from."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import lmselfplay.lm.engines as engines
import lmselfplay.r_zero.steps as r_zero
import lmselfplay.selfplay_games.steps as selfplay
import lmselfplay.utils.config as config
from lmselfplay.lm.engines import EngineConfig
from lmselfplay.lm.engines.weight_sync_check import WeightSyncCheckConfig
from lmselfplay.models.policy import PolicyConfig, resolve_dtype
from lmselfplay.rl.overlap import OverlapConfig
from lmselfplay.utils.config import Config, ConfigError
from lmselfplay.utils.recipe_loader import run_recipe
from lmselfplay.utils.run import PeriodicCheckpoints, RunConfig


@pytest.mark.parametrize("cls, bad", [
    (EngineConfig, {"vllm_gpu_memory_utilization": 2.0}),
    (EngineConfig, {"vllm_gpu_memory_utilization": 0.0}),
    (EngineConfig, {"engine": "sglang"}),
    (EngineConfig, {"weight_sync_bucket_mb": 0}),
    (EngineConfig, {"vllm_server_wait": -1.0}),
    (OverlapConfig, {"max_staleness": -1}),
    (WeightSyncCheckConfig, {"weight_sync_threshold": -0.1}),
    (PolicyConfig, {"dtype": "bf16"}),
    (PolicyConfig, {"prompt_format": "html"}),
    (PolicyConfig, {"lora_r": 0}),
    (PolicyConfig, {"lora_dropout": 1.0}),
    (RunConfig, {"collective_timeout_s": 0}),
    (PeriodicCheckpoints, {"checkpoint_every": -1}),
])
def test_each_component_config_validates_alone(cls, bad):
    """Built alone (not mixed into a recipe's config), a bad value is a ConfigError naming it."""
    assert issubclass(cls, Config)
    cls()  # the defaults are valid
    (name,) = bad
    with pytest.raises(ConfigError, match=name):
        cls(**bad)


def test_an_engine_config_parses_alone_and_names_the_flag():
    assert config.parse_configs((EngineConfig,), ["--engine", "vllm"])[0].engine == "vllm"
    with pytest.raises(ConfigError, match="vllm_gpu_memory_utilization"):
        config.parse_configs((EngineConfig,), ["--vllm_gpu_memory_utilization", "2.0"])


class EngineBuilt(Exception):
    """Raised by the stand-in make_engine: the recipe got as far as its engine."""


def with_field(parse, name: str, value: int):
    """parse_configs over the recipe's configs, its first part extended by one more int field."""
    def parse_extended(classes, argv=None, defaults=None, first=None):
        head, *rest = config.as_classes(classes)
        extended = dataclasses.make_dataclass(f"{head.__name__}Extended", [(name, int, dataclasses.field(default=value))],
                                              bases=(head,))
        return parse((extended, *rest), argv, defaults, first=first)
    return parse_extended


@pytest.mark.parametrize("recipe, argv, budget", [
    ("selfplay_games", ["--games", "nim", "--eval_positions", "5"], 64),  # max(12, text 64, eval 0)
    ("selfplay_games", ["--games", "nim", "--eval_positions", "5", "--text_max_new_tokens", "100"], 100),
    ("absolute_zero", [], 96),  # max(propose 96, solve 64)
    ("r_zero", [], 64),  # max(challenger 64, solver 40)
    ("debate", ["--train_tasks", "8", "--eval_tasks", "4"], 48),  # a speech's max_new_tokens
])
def test_each_recipe_passes_the_budget_it_names(recipe, argv, budget, model_dir, tmp_path, monkeypatch):
    """The budgets of the recipes' defaults are what the old scan of ``*max_new_tokens`` fields
    gave, and a config with one more such field (foo_max_new_tokens = 9999) leaves them as they are."""
    seen = {}

    def stand_in(cfg, model, tok, **run):
        seen.update(run)
        raise EngineBuilt

    monkeypatch.setattr(engines, "make_engine", stand_in)
    for module in (r_zero, selfplay):  # the recipes whose engines are built in the package
        monkeypatch.setattr(module, "make_engine", stand_in)
    monkeypatch.setattr(config, "parse_configs", with_field(config.parse_configs, "foo_max_new_tokens", 9999))
    with pytest.raises(EngineBuilt):
        run_recipe(recipe, ["--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path / "run"), *argv])
    assert seen == {"answer_budget": budget, "temperature": 1.0, "top_p": 1.0, "seed": 0}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU run's error")
def test_a_judge_dtype_error_names_judge_dtype(model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"judge_dtype bfloat16 on a CPU run.*use judge_dtype float32 or auto"):
        run_recipe("debate", ["--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path / "a"),
                              "--train_tasks", "8", "--eval_tasks", "4", "--judge_dtype", "bfloat16"])
    with pytest.raises(ConfigError, match="judge_dtype must be one of"):  # refused with the config
        run_recipe("debate", ["--output_dir", str(tmp_path / "b"), "--judge_dtype", "bf16"])
    with pytest.raises(ConfigError, match=r"^dtype bfloat16 on a CPU run"):  # the policy's own field
        resolve_dtype("bfloat16", torch.device("cpu"))


def test_fixed_messages_name_their_fields():
    from lmselfplay.games import make
    from lmselfplay.rl.exact_feedback import exact_feedback_games
    from lmselfplay.rl.league import LeagueConfig

    with pytest.raises(ConfigError, match="mirror_fraction, recent_fraction, hall_of_fame_fraction and bot_fraction"):
        LeagueConfig(mirror_fraction=0.9)
    with pytest.raises(ConfigError, match="exact_games names 'tictactoe'"):
        exact_feedback_games([make("tictactoe")], "tictactoe")


# (recipe, old flag, new flag, a value): flags renamed so that one word has one meaning
RENAMED = [
    ("selfplay_games", "staleness_threshold", "weight_sync_threshold", "0.1"),
    ("r_zero", "iterations", "rounds", "2"),
    ("search_selfplay", "iterations", "rounds", "2"),
    ("search_selfplay", "games_per_iteration", "games_per_round", "8"),
    ("referee_study", "iterations", "rounds", "2"),
    ("referee_study", "study_dir", "output_dir", "runs/x"),
]


@pytest.mark.parametrize("where", ["cli", "yaml"])
@pytest.mark.parametrize("recipe, old, new, value", RENAMED)
def test_a_renamed_flag_is_a_one_line_error_naming_the_new_one(recipe, old, new, value, where, tmp_path):
    """The old name, on the command line or in a YAML, says what it is now called; the new one parses."""
    from recipe_configs import RECIPE_CONFIGS

    from lmselfplay.referee_study import RefereeStudyConfigs

    parse_recipe = {**RECIPE_CONFIGS, "referee_study": RefereeStudyConfigs}.__getitem__
    argv = [f"--{old}", value]
    if where == "yaml":
        (tmp_path / "c.yaml").write_text(f"{old}: {value}\n")
        argv = ["--config", str(tmp_path / "c.yaml")]
    with pytest.raises(ConfigError, match=f"^[^\n]*{old} is now called {new}[^\n]*$"):
        parse_recipe(recipe).parse(argv)
    assert parse_recipe(recipe).parse([f"--{new}", value]).as_dict()[new] is not None
