"""Config composition: every class's own validation runs once, whatever the recipe mixes in;
bad sizes are one-line ConfigErrors naming the field, at config time, in every recipe."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
from recipe_configs import RECIPE_CONFIGS

from lmselfplay.rl.trainer import TrainerConfig
from lmselfplay.utils.config import Config, ConfigError, check_keys, load_yaml, parse_config

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(RECIPE_CONFIGS)
YAMLS = sorted((ROOT / "recipes/configs").glob("*.yaml"))


def fits(cls: type, path: Path) -> bool:
    try:
        check_keys(cls, load_yaml(path), str(path))
    except ConfigError:
        return False
    return True


def own_validators(cls: type) -> list[type]:
    return [k for k in cls.__mro__ if "validate" in vars(k)]


def test_every_recipe_script_is_listed():
    scripts = {p.stem for p in (ROOT / "recipes").glob("*.py")}
    assert scripts == set(RECIPES), "a new recipe needs its config class in tests/recipe_configs.py"


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_parses_its_listed_config_class(name):
    """RECIPE_CONFIGS names the class the script's main parses (the script itself is not loaded)."""
    source = (ROOT / "recipes" / f"{name}.py").read_text()
    assert f"cfg = parse_config({RECIPE_CONFIGS[name].__name__}, argv)" in source


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_shipped_yaml_is_some_recipes_config(path):
    assert any(fits(RECIPE_CONFIGS[name], path) for name in RECIPES), f"{path.name} fits no recipe config"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_configs_run_every_parents_validation_once(name, monkeypatch):
    """Built from its defaults and from every shipped YAML it accepts, a recipe config has run
    the validate() of every class in its MRO exactly once (a spy on each)."""
    cls = RECIPE_CONFIGS[name]
    assert issubclass(cls, Config)
    validators = own_validators(cls)
    assert cls in validators  # every recipe config checks its own sizes
    calls: list[type] = []

    def spy_on(klass: type):
        original = vars(klass)["validate"]

        def spy(self) -> None:
            calls.append(klass)
            original(self)
        return spy

    for klass in validators:
        monkeypatch.setattr(klass, "validate", spy_on(klass))
    sources = [[]] + [["--config", str(p)] for p in YAMLS if fits(cls, p)]
    for argv in sources:
        calls.clear()
        cfg = parse_config(cls, argv)
        assert sorted(calls, key=id) == sorted(validators, key=id), (argv, calls)
        if isinstance(cfg, TrainerConfig):  # the parent whose skipped check crashed R-Zero and debate
            assert isinstance(cfg.beta, float | dict), (argv, cfg.beta)


def test_r_zero_and_debate_yaml_beta_is_parsed_into_a_number():
    for name, yaml in (("r_zero", "r_zero.yaml"), ("debate", "debate.yaml"), ("r_zero", "r_zero_qwen3.yaml")):
        cfg = parse_config(RECIPE_CONFIGS[name], ["--config", str(ROOT / "recipes/configs" / yaml)])
        assert isinstance(cfg.beta, float) and cfg.beta == load_yaml(ROOT / "recipes/configs" / yaml)["beta"]
    with pytest.raises(ConfigError, match="beta"):
        parse_config(RECIPE_CONFIGS["debate"], ["--beta", "lots"])


def test_a_new_subclass_with_its_own_validation_still_gets_its_parents():
    seen = []

    @dataclasses.dataclass
    class Child(TrainerConfig):
        rounds: int = 1

        def validate(self) -> None:
            seen.append(self.beta)  # runs after the parent's: beta is already parsed
            if self.rounds < 1:
                raise ConfigError("rounds must be >= 1")

    cfg = Child(beta="0.3")
    assert cfg.beta == 0.3 and seen == [0.3]
    with pytest.raises(ConfigError, match="beta"):
        Child(beta="lots")
    with pytest.raises(ConfigError, match="rounds"):
        Child(rounds=0)
    with pytest.raises(ConfigError, match="max_steps"):
        Child(max_steps=0)

    @dataclasses.dataclass
    class Grandchild(Child):
        extra: int = 0

    assert Grandchild(beta="nim=0.2").beta == {"nim": 0.2} and seen[-1] == {"nim": 0.2}


def test_a_config_that_defines_post_init_is_refused_when_the_class_is_made():
    with pytest.raises(TypeError, match="__post_init__"):
        @dataclasses.dataclass
        class Skipper(TrainerConfig):
            def __post_init__(self) -> None:
                pass

    class Mixin:  # a plain mixin's __post_init__ would be shadowed by Config's: refused too
        def __post_init__(self) -> None:
            pass

    with pytest.raises(TypeError, match="Mixin"):
        @dataclasses.dataclass
        class Mixed(TrainerConfig, Mixin):
            pass


# --- bad sizes -----------------------------------------------------------------------------

SIZES = {
    "selfplay_games": ["episodes_per_step", "max_steps", "gradient_accumulation_steps", "num_iterations",
                       "concurrency", "max_new_tokens"],
    "debate": ["debates_per_step", "max_steps", "num_rounds", "train_tasks", "eval_tasks"],
    "r_zero": ["num_questions", "challenger_group_size", "solver_batch", "num_answers", "iterations",
               "challenger_steps", "solver_steps", "pool_size"],
    "absolute_zero": ["num_generations", "proposals_per_type", "solve_tasks_per_type", "max_steps"],
    "spin": ["per_device_train_batch_size", "generation_batch_size", "gradient_accumulation_steps",
             "spin_iterations", "num_train_examples", "num_train_epochs"],
    "search_selfplay": ["batch_size", "games_per_iteration", "iterations", "n_sims", "eval_batch"],
    "alphazero": ["batch_size", "games_per_iteration", "train_steps", "iterations", "n_sims"],
}


@pytest.mark.parametrize("name,key", [(n, k) for n, keys in SIZES.items() for k in keys])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_zero_or_negative_size_is_a_config_error_naming_the_field(name, key, value):
    cls = RECIPE_CONFIGS[name]
    with pytest.raises(ConfigError, match=rf"^{key} must be"):
        parse_config(cls, [f"--{key}", value])


@pytest.mark.parametrize("name", sorted(RECIPES))
@pytest.mark.parametrize("value", ["nan", "inf", "-0.001"])
def test_a_nan_infinite_or_negative_learning_rate_is_a_config_error(name, value):
    with pytest.raises(ConfigError, match=r"^learning_rate must be a finite number >= 0"):
        parse_config(RECIPE_CONFIGS[name], ["--learning_rate", value])


def test_a_zero_learning_rate_stays_allowed():
    assert TrainerConfig(learning_rate=0.0).learning_rate == 0.0


def test_yaml_sizes_are_checked_too(tmp_path):
    (tmp_path / "bad.yaml").write_text("debates_per_step: 0\n")
    with pytest.raises(ConfigError, match="debates_per_step"):
        parse_config(RECIPE_CONFIGS["debate"], ["--config", str(tmp_path / "bad.yaml")])
    (tmp_path / "bad.yaml").write_text("learning_rate: .inf\n")
    with pytest.raises(ConfigError, match="learning_rate"):
        parse_config(RECIPE_CONFIGS["r_zero"], ["--config", str(tmp_path / "bad.yaml")])
    assert math.isinf(load_yaml(tmp_path / "bad.yaml")["learning_rate"])


def test_the_command_line_prints_one_error_line_and_exits_2():
    out = subprocess.run([sys.executable, str(ROOT / "recipes/selfplay_games.py"), "--episodes_per_step", "0"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == ["error: episodes_per_step must be a finite number > 0, got 0"]
