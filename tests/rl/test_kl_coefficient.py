"""The trainer's ``beta``, a :class:`KLCoefficient`: each form a config gives it in, each error
(one line naming the bad entry), its keys (:class:`BetaKey`), the lookup of a sample's
coefficient, and the plain value ``config.json`` holds."""

import json
import random
import typing

import pytest

from lmselfplay.lm.trajectory import role_key, role_parts, seat_of
from lmselfplay.rl.kl import BetaKey, KLCoefficient, beta_for, kl_enabled
from lmselfplay.rl.trainer_config import TrainerConfig
from lmselfplay.utils.config import ConfigError, config_dict, parse_configs
from lmselfplay.utils.run import config_changes

PER_GAME = {"nim": 0.1, "kuhn_poker/p1": 0.3, "default": 0.05}


@pytest.mark.parametrize("value, plain", [
    (0.1, 0.1), (0, 0.0), (2, 2.0), ("0.1", 0.1), (" 1e-2 ", 0.01),
    ("nim=0.1,kuhn_poker/p1=0.3,default=0.05", PER_GAME),
    (" nim = 0.1 , kuhn_poker/p1=0.3, default=0.05,", PER_GAME),
    (PER_GAME, PER_GAME), ({"nim": "0.1", "kuhn_poker/p1": 0.3, "default": 0.05}, PER_GAME),
    ({"default": 0.2}, {"default": 0.2}), ({}, {}), ("nim=0.1,nim=0.2", {"nim": 0.2}),
    ({"debate/true": 0.5}, {"debate/true": 0.5}),
])
def test_each_config_form_parses_to_its_plain_value(value, plain):
    beta = KLCoefficient.from_config(value)
    assert beta.as_config() == plain and type(beta.as_config()) is type(plain)
    assert KLCoefficient.from_config(beta) is beta
    assert KLCoefficient.from_config(beta.as_config()) == beta
    if plain != {}:  # an empty mapping has no flag string
        assert KLCoefficient.from_config(str(beta)) == beta


@pytest.mark.parametrize("bad, named", [
    ("nim", "'nim' is neither a number nor NAME=NUMBER"), ("lots", "'lots'"),
    ("=0.1", "expected NAME=NUMBER"), ("nim=0.1,kuhn", "expected NAME=NUMBER"),
    ("nim=x", "'nim=x' is not a number"), ("nim=0.1,kuhn_poker=-1", "'kuhn_poker=-1' must be >= 0"),
    ({"nim": None}, "'nim=None' is not a number"), ({"nim": "nan"}, "'nim=nan' must be >= 0"),
    (-0.5, "got -0.5"), ("-1", "got -1.0"), ("nan", "got nan"), ([0.1], "got [0.1]"), (True, "got True"),
    (None, "got None"),
])
def test_each_bad_value_is_a_one_line_config_error_naming_it(bad, named):
    with pytest.raises(ConfigError, match="beta") as e:
        KLCoefficient.from_config(bad)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_a_bad_flag_or_yaml_value_names_the_entry_and_where(tmp_path):
    with pytest.raises(ConfigError) as e:
        parse_configs((TrainerConfig,), ["--beta", "nim=0.1,kuhn_poker=oops"])
    assert str(e.value) == "--beta: beta entry 'kuhn_poker=oops' is not a number (command line)"
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("beta: {nim: 0.1, kuhn_poker: -2}\n")
    with pytest.raises(ConfigError) as e:
        parse_configs((TrainerConfig,), ["--config", str(cfg_file)])
    assert str(e.value) == f"beta entry 'kuhn_poker=-2' must be >= 0 (in {cfg_file})"


@pytest.mark.parametrize("argv, yaml, plain", [
    ([], None, 0.1), (["--beta", "0.3"], None, 0.3), ([], "beta: 0.2", 0.2), ([], "beta: '0.2'", 0.2),
    ([], "beta: {nim: 0.1, kuhn_poker/p1: 0.3, default: 0.05}", PER_GAME),
    ([], "beta: nim=0.1,kuhn_poker/p1=0.3,default=0.05", PER_GAME),
    (["--beta", "nim=0.1,kuhn_poker/p1=0.3,default=0.05"], "beta: 0.7", PER_GAME),
])
def test_the_config_parser_takes_every_form(tmp_path, argv, yaml, plain):
    if yaml is not None:
        (tmp_path / "c.yaml").write_text(yaml + "\n")
        argv = ["--config", str(tmp_path / "c.yaml"), *argv]
    beta = parse_configs((TrainerConfig,), argv)[0].beta
    assert isinstance(beta, KLCoefficient) and beta.as_config() == plain


def test_the_field_is_typed_and_built_from_any_form():
    assert typing.get_type_hints(TrainerConfig)["beta"] is KLCoefficient
    assert TrainerConfig().beta == KLCoefficient(0.1)
    assert TrainerConfig(beta=0.0).beta == KLCoefficient(0.0)
    assert TrainerConfig(beta="nim=0.1").beta == TrainerConfig(beta={"nim": 0.1}).beta


def test_config_json_holds_the_plain_value_and_a_resume_sees_no_change():
    for value in (0.1, PER_GAME, {"default": 0.05, "nim": 0.1, "kuhn_poker/p1": 0.3}):
        saved = json.loads(json.dumps(config_dict(TrainerConfig(beta=value))))
        assert saved["beta"] == value
        assert config_changes(saved, config_dict(TrainerConfig(beta=str(KLCoefficient.from_config(value))))) == {}
    assert config_changes({"beta": 0.1}, {"beta": KLCoefficient(0.2).as_config()}) == {"beta": (0.1, 0.2)}


@pytest.mark.parametrize("name, kind", [
    ("nim", "game or task"), ("solver", "game or task"), ("kuhn_poker/p1", "game and seat"),
    ("kuhn_poker/p1/initial", "role"), ("debate/true", "role prefix"), ("debate/true/round1", "role prefix"),
    ("g/p0/initial/x", "role prefix"),
])
def test_a_key_says_what_it_names(name, kind):
    key = BetaKey.parse(name)
    assert key.kind == kind and str(key) == name and key.game == name.split("/")[0]


def test_keys_and_roles_are_built_by_one_function():
    assert role_parts("nim") == ("nim",) and role_parts("nim", 1) == ("nim", "p1")
    assert role_key("nim", 0) == "/".join(role_parts("nim", 0, "initial")) == "nim/p0/initial"
    assert BetaKey.of("kuhn_poker", 1) == BetaKey.parse("kuhn_poker/p1")
    assert BetaKey.of("kuhn_poker", 1, "reset") == BetaKey.parse(role_key("kuhn_poker", 1, "reset"))
    assert seat_of("p12") == 12 and seat_of("true") is None and seat_of("p") is None
    with pytest.raises(ValueError, match="seat"):
        role_parts("nim", start="initial")


def _lookup_by_strings(beta: dict, role: str, task: str) -> float:
    """The lookup on the mapping's names: the longest '/'-prefix of the role, the task, 'default'."""
    parts = role.split("/") if role else []
    for key in ["/".join(parts[:n]) for n in range(len(parts), 0, -1)] + [task, "default"]:
        if key and key in beta:
            return beta[key]
    raise KeyError(role)


def test_the_lookup_is_the_longest_role_prefix_then_the_task_then_default():
    rng = random.Random(0)
    names = ["nim", "kuhn_poker", "kuhn_poker/p1", "kuhn_poker/p0/reset", "debate", "debate/true", "solver",
             "a/b", "default"]
    roles = [role_key(g, s, st) for g in ("nim", "kuhn_poker", "x") for s in (0, 1) for st in ("initial", "reset")]
    roles += ["", "solver", "debate/true/round1", "debate/false/round2", "a/b/c", "default"]
    tasks = ["", "nim", "kuhn_poker", "a/b", "solver", "default", "other"]
    for _ in range(300):
        mapping = {n: rng.choice([0.0, 0.1, 0.5, 2.0]) for n in rng.sample(names, rng.randrange(len(names)))}
        beta = KLCoefficient.from_config(mapping)
        for role in roles:
            for task in tasks:
                try:
                    want = _lookup_by_strings(mapping, role, task)
                except KeyError:
                    with pytest.raises(KeyError, match="no KL coefficient for role"):
                        beta.of(role, task)
                    continue
                assert beta.of(role, task) == want == beta_for(mapping, role, task), (mapping, role, task)
        assert beta.enabled == kl_enabled(mapping) == any(v > 0 for v in mapping.values())
    assert KLCoefficient(0.3).of("anything") == 0.3 and not KLCoefficient(0.0).enabled
