"""Config composition: a recipe parses a tuple of config classes (its own arguments and each
component's config) from one flat YAML and one flat set of flags, each key going to the class that
declares it; every class's own validation runs once; bad sizes are one-line ConfigErrors naming
the field, at config time, in every recipe; --help is grouped by component, every field with a
help line."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
from pathlib import Path

import pytest
from recipe_configs import RECIPE_CONFIGS, fits, parse_recipe
from warm_process import run_warm

from lmselfplay.rl.kl import KLCoefficient
from lmselfplay.rl.trainer import SurrogateConfig, TrainerConfig
from lmselfplay.utils.config import Config, ConfigError, Configs, load_yaml, parse_configs

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(RECIPE_CONFIGS)
YAMLS = sorted((ROOT / "recipes/configs").glob("*.yaml"))


def own_validators(cls: type) -> list[type]:
    return [k for k in cls.__mro__ if "validate" in vars(k)]


def test_every_recipe_script_is_listed():
    scripts = {p.stem for p in (ROOT / "recipes").glob("*.py")}
    assert scripts == set(RECIPES), "a new recipe needs its config class in tests/recipe_configs.py"


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_parses_its_listed_config_class(name):
    """RECIPE_CONFIGS names the configs the script's main parses (the script itself is not loaded)."""
    source = (ROOT / "recipes" / f"{name}.py").read_text()
    cls = RECIPE_CONFIGS[name].__name__
    assert f"cfg = {cls}.parse(argv)" in source


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_shipped_yaml_is_some_recipes_config(path):
    assert any(fits(name, path) for name in RECIPES), f"{path.name} fits no recipe config"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_configs_run_every_parents_validation_once(name, monkeypatch):
    """Built from its defaults and from every shipped YAML it accepts, a recipe's configs have run
    the validate() of every class in the MRO of each part exactly once (a spy on each), and the
    container's own (the checks that span parts)."""
    classes = RECIPE_CONFIGS[name].classes()
    assert all(issubclass(k, Config) for k in classes)
    validators = list(dict.fromkeys(v for k in classes for v in own_validators(k)))
    own = [k for k in classes if k.__name__.endswith("Args")]
    assert len(own) == 1 and own[0] in validators  # every recipe's own args check their own sizes
    if "validate" in vars(RECIPE_CONFIGS[name]):  # the container's own checks, spanning parts
        validators.append(RECIPE_CONFIGS[name])
    calls: list[type] = []

    def spy_on(klass: type):
        original = vars(klass)["validate"]

        def spy(self) -> None:
            calls.append(klass)
            original(self)
        return spy

    for klass in validators:
        monkeypatch.setattr(klass, "validate", spy_on(klass))
    sources = [[]] + [["--config", str(p)] for p in YAMLS if fits(name, p)]
    for argv in sources:
        calls.clear()
        values = parse_recipe(name, argv).as_dict()
        assert sorted(calls, key=id) == sorted(validators, key=id), (argv, calls)
        if any(issubclass(k, TrainerConfig) for k in classes):  # the check whose skip crashed R-Zero and debate
            assert isinstance(values["beta"], float | dict), (argv, values["beta"])


def test_r_zero_and_debate_yaml_beta_is_parsed_into_a_number():
    for name, yaml in (("r_zero", "r_zero.yaml"), ("debate", "debate.yaml"), ("r_zero", "r_zero_qwen3.yaml")):
        beta = parse_recipe(name, ["--config", str(ROOT / "recipes/configs" / yaml)]).trainer.beta
        assert beta == KLCoefficient(load_yaml(ROOT / "recipes/configs" / yaml)["beta"]) and beta.per_key is None
    with pytest.raises(ConfigError, match="beta"):
        parse_recipe("debate", ["--beta", "lots"])


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
    assert cfg.beta == KLCoefficient(0.3) and seen == [KLCoefficient(0.3)]
    with pytest.raises(ConfigError, match="beta"):
        Child(beta="lots")
    with pytest.raises(ConfigError, match="rounds"):
        Child(rounds=0)
    with pytest.raises(ConfigError, match="num_iterations"):
        Child(num_iterations=0)

    @dataclasses.dataclass
    class Grandchild(Child):
        extra: int = 0

    nim = KLCoefficient.from_config({"nim": 0.2})
    assert Grandchild(beta="nim=0.2").beta == nim and seen[-1] == nim


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
    "r_zero": ["num_questions", "challenger_group_size", "solver_batch", "num_answers", "rounds",
               "challenger_steps", "solver_steps", "pool_size"],
    "absolute_zero": ["num_generations", "proposals_per_type", "solve_tasks_per_type", "max_steps"],
    "spin": ["per_device_train_batch_size", "generation_batch_size", "gradient_accumulation_steps",
             "spin_iterations", "num_train_examples", "num_train_epochs"],
    "search_selfplay": ["batch_size", "games_per_round", "rounds", "n_sims", "eval_batch"],
    "alphazero": ["batch_size", "games_per_iteration", "train_steps", "iterations", "n_sims"],
}


@pytest.mark.parametrize("name,key", [(n, k) for n, keys in SIZES.items() for k in keys])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_zero_or_negative_size_is_a_config_error_naming_the_field(name, key, value):
    with pytest.raises(ConfigError, match=rf"^{key} must be"):
        parse_recipe(name, [f"--{key}", value])


@pytest.mark.parametrize("name", sorted(RECIPES))
@pytest.mark.parametrize("value", ["nan", "inf", "-0.001"])
def test_a_nan_infinite_or_negative_learning_rate_is_a_config_error(name, value):
    with pytest.raises(ConfigError, match=r"^learning_rate must be a finite number >= 0"):
        parse_recipe(name, ["--learning_rate", value])


def test_a_zero_learning_rate_stays_allowed():
    assert TrainerConfig(learning_rate=0.0).learning_rate == 0.0


def test_yaml_sizes_are_checked_too(tmp_path):
    (tmp_path / "bad.yaml").write_text("debates_per_step: 0\n")
    with pytest.raises(ConfigError, match="debates_per_step"):
        parse_recipe("debate", ["--config", str(tmp_path / "bad.yaml")])
    (tmp_path / "bad.yaml").write_text("learning_rate: .inf\n")
    with pytest.raises(ConfigError, match="learning_rate"):
        parse_recipe("r_zero", ["--config", str(tmp_path / "bad.yaml")])
    assert math.isinf(load_yaml(tmp_path / "bad.yaml")["learning_rate"])


def test_the_command_line_prints_one_error_line_and_exits_2():
    out = run_warm([str(ROOT / "recipes/selfplay_games.py"), "--episodes_per_step", "0"], dict(os.environ), ROOT,
                   timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == ["error: episodes_per_step must be a finite number > 0, got 0"]


# --- a tuple of configs ----------------------------------------------------------------------

@dataclasses.dataclass
class _Loop(Config):
    _argument_group_name = "loop"
    max_steps: int = dataclasses.field(default=3, metadata={"help": "loop steps"})
    label: str = dataclasses.field(default="x", metadata={"help": "a name"})

    def validate(self) -> None:
        if self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {self.max_steps}")


@dataclasses.dataclass
class _Part(Config):
    _argument_group_name = "part"
    renamed_keys = {"old_rate": "rate"}
    rate: float = dataclasses.field(default=0.5, metadata={"help": "a rate"})
    sizes: list[int] = dataclasses.field(default_factory=lambda: [1], metadata={"help": "sizes"})


@dataclasses.dataclass
class _Clash(Config):
    label: str = dataclasses.field(default="y", metadata={"help": "a second label"})


@dataclasses.dataclass(frozen=True)
class _Both(Configs):
    loop: _Loop
    part: _Part

    defaults = {"rate": 0.25}

    def validate(self) -> None:
        if self.part.rate * self.loop.max_steps > 10:
            raise ConfigError("rate times max_steps must be <= 10")


def test_each_key_goes_to_the_class_that_declares_it(tmp_path):
    (tmp_path / "c.yaml").write_text("max_steps: 5\nrate: 2\nsizes: [3, 4]\n")
    loop, part = parse_configs((_Loop, _Part), ["--config", str(tmp_path / "c.yaml"), "--label", "z"])
    assert (loop.max_steps, loop.label, part.rate, part.sizes) == (5, "z", 2.0, [3, 4])
    both = _Both.parse(["--max_steps", "2"])  # the container's defaults lie under the YAML and flags
    assert both.part.rate == 0.25 and both.loop.max_steps == 2
    assert both.as_dict() == {"max_steps": 2, "label": "x", "rate": 0.25, "sizes": [1]}
    assert _Both.from_values(rate=1.0, label="b") == _Both(_Loop(label="b"), _Part(rate=1.0))
    with pytest.raises(ConfigError, match="rate times max_steps"):  # the check spanning two parts
        _Both.parse(["--max_steps", "50"])


def test_a_field_of_two_classes_is_a_type_error():
    with pytest.raises(TypeError, match="'label' is declared by both _Loop and _Clash"):
        parse_configs((_Loop, _Clash), [])


@pytest.mark.parametrize("yaml_text, argv, message", [
    ("colour: red\n", [], r"^unknown key\(s\) in .*c.yaml: colour \(known keys of _Loop, _Part: label, max_steps"),
    ("", ["--colour", "red"], r"^unknown command-line argument\(s\): --colour red"),
    ("old_rate: 1\n", [], r"c.yaml: old_rate is now called rate$"),
    ("", ["--old_rate", "1"], r"^command line: old_rate is now called rate$"),
    ("max_steps: many\n", [], r"^max_steps: 'many' is not a valid int \(in .*c.yaml\)$"),
    ("sizes: 3\n", [], r"^sizes: 3 is not a list"),
    ("", ["--rate", "fast"], r"^--rate 'fast' is not a valid float; rate expects float \(command line\)$"),
    ("max_steps: 0\n", [], r"^max_steps must be >= 1, got 0$"),
])
def test_a_tuple_gives_the_one_line_errors_naming_the_field(tmp_path, yaml_text, argv, message):
    (tmp_path / "c.yaml").write_text(yaml_text or "{}\n")
    with pytest.raises(ConfigError, match=message):
        parse_configs((_Loop, _Part), ["--config", str(tmp_path / "c.yaml"), *argv])


def _help_groups(classes: tuple[type, ...]) -> dict[str, list]:
    from transformers import HfArgumentParser

    parser = HfArgumentParser(classes)
    return {g.title: g._group_actions for g in parser._action_groups}


@pytest.mark.parametrize("name", RECIPES)
def test_help_has_a_group_per_component_and_a_line_per_field(name):
    """--help lists each part's flags under its own group (``_argument_group_name``), every
    field with a help string."""
    classes = RECIPE_CONFIGS[name].classes()
    groups = _help_groups(classes)
    for cls in classes:
        title = vars(cls).get("_argument_group_name")
        assert title, f"{cls.__name__} names no argument group"
        flags = {a.dest for a in groups[title]}
        assert {f.name for f in dataclasses.fields(cls)} <= flags, cls.__name__
        for action in groups[title]:
            assert action.help and action.help.strip(), f"{cls.__name__}.{action.dest} has no help"


def test_the_policy_gradient_recipes_share_the_component_parts():
    """The recipes that train a policy with an engine parse the trainer's, its surrogate's,
    policy's, engine's, sampling's, overlap's and run's configs first (PolicyGradientConfigs), then
    their own."""
    from lmselfplay.lm.engines import EngineConfig
    from lmselfplay.lm.sampling import SamplingConfig
    from lmselfplay.models.policy import PolicyConfig
    from lmselfplay.rl.configs import PolicyGradientConfigs
    from lmselfplay.rl.overlap import OverlapConfig
    from lmselfplay.utils.run import RunConfig

    for name in ("selfplay_games", "r_zero", "absolute_zero", "debate", "rlvr"):
        cls = RECIPE_CONFIGS[name]
        assert issubclass(cls, PolicyGradientConfigs), name
        assert cls.classes()[:7] == (TrainerConfig, SurrogateConfig, PolicyConfig, EngineConfig, SamplingConfig,
                                     OverlapConfig, RunConfig), name
        assert cls.classes()[7].__name__.endswith("Args"), name


# a recipe's flags are the fields its samples reach: only the recipes that make supervised-target
# samples (exact feedback, average-policy and search distillation) have the target loss, and
# search self-play's distillation samples (advantage 0, no engine log-probs) have no surrogate
UNUSED_FLAGS = {"selfplay_games": set(), "search_selfplay": {"epsilon", "tis_cap"},
                "r_zero": {"target_passes", "target_coef"}, "absolute_zero": {"target_passes", "target_coef"},
                "debate": {"target_passes", "target_coef"}, "referee_study": {"target_passes", "target_coef"}}
USED_FLAGS = {"epsilon", "tis_cap", "target_passes", "target_coef", "beta", "num_iterations", "kl_estimator"}


@pytest.mark.parametrize("name", sorted(UNUSED_FLAGS))
def test_a_recipes_help_lacks_the_trainer_fields_its_samples_never_reach(name):
    """Each policy-trainer recipe's --help has exactly the trainer-term flags it uses: the
    unused ones are absent (and a YAML or flag naming one is an unknown key), the rest present."""
    from lmselfplay.referee_study import RefereeStudyConfigs

    cls = RefereeStudyConfigs if name == "referee_study" else RECIPE_CONFIGS[name]
    flags = {a.dest for actions in _help_groups(cls.classes()).values() for a in actions}
    assert not flags & UNUSED_FLAGS[name], name
    assert USED_FLAGS - UNUSED_FLAGS[name] <= flags, name
    for flag in UNUSED_FLAGS[name]:
        with pytest.raises(ConfigError, match="unknown"):
            cls.parse([f"--{flag}", "1"])


def test_the_help_runs_and_shows_the_groups():
    out = run_warm([str(ROOT / "recipes/selfplay_games.py"), "--help"], dict(os.environ), ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    for cls in RECIPE_CONFIGS["selfplay_games"].classes():
        assert f"\n{cls._argument_group_name}:\n" in out.stdout


@pytest.mark.parametrize("name", RECIPES)
def test_help_shows_the_recipes_own_arguments_first(name):
    """--help's first group is the recipe's own arguments (the part its container declares
    first), whatever component parts its container inherits; the parsed parts keep their order."""

    cls = RECIPE_CONFIGS[name]
    own = cls.own_arguments()
    assert own is not None and own.__name__.endswith("Args"), name
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse_configs(cls.classes(), ["--help"], cls.defaults, first=own)
    titles = [line[:-1] for line in out.getvalue().splitlines() if line.endswith("):")]
    assert titles[0] == own._argument_group_name, titles[:3]
    assert [type(c) for c in parse_configs(cls.classes(), [], cls.defaults, first=own)] == list(cls.classes())


def test_the_old_build_name_is_one_line_naming_from_values():
    with pytest.raises(AttributeError, match=r"_Both\.from_values"):
        _Both.build(rate=1.0)
