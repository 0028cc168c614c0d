"""The sampling part: every recipe that samples its policy holds one :class:`SamplingConfig`
(``cfg.sampling``), which owns the ``--temperature`` and ``--top_p`` flags, checks them, and
builds the rollouts' :class:`SamplingParams` (:meth:`SamplingConfig.params`)."""

from __future__ import annotations

import pytest
from recipe_configs import RECIPE_CONFIGS, parse_recipe

from lmselfplay.games import make
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm.engines import SamplingParams
from lmselfplay.lm.sampling import SamplingConfig
from lmselfplay.referee_study import RefereeStudyConfigs
from lmselfplay.utils.config import ConfigError, field_owners

SAMPLING_RECIPES = ["selfplay_games", "rlvr", "r_zero", "absolute_zero", "debate", "spin", "search_selfplay"]
FLAGS = ["--temperature", "0.7", "--top_p", "0.9"]


@pytest.mark.parametrize("cls", [*(RECIPE_CONFIGS[n] for n in SAMPLING_RECIPES), RefereeStudyConfigs],
                         ids=lambda c: c.__name__)
def test_every_sampling_recipe_has_the_part_and_it_owns_the_flags(cls):
    assert cls.classes().count(SamplingConfig) == 1
    assert cls.__dataclass_fields__["sampling"].type in ("SamplingConfig", SamplingConfig)
    owners = field_owners(cls.classes())
    assert owners["temperature"] is SamplingConfig and owners["top_p"] is SamplingConfig


@pytest.mark.parametrize("name", [n for n in SAMPLING_RECIPES if n != "search_selfplay"])  # top_p: below
def test_the_flags_keep_their_names(name):
    cfg = parse_recipe(name, FLAGS)
    assert (cfg.sampling.temperature, cfg.sampling.top_p) == (0.7, 0.9)
    assert {"temperature": 0.7, "top_p": 0.9}.items() <= cfg.as_dict().items()


@pytest.mark.parametrize("flags,field", [(["--temperature", "0"], "temperature"), (["--top_p", "0"], "top_p"),
                                         (["--top_p", "1.5"], "top_p"), (["--temperature", "nan"], "temperature")])
def test_a_bad_value_is_a_config_error_naming_the_field(flags, field):
    with pytest.raises(ConfigError, match=rf"^{field} must be"):
        parse_recipe("rlvr", flags)


@pytest.mark.parametrize("greedy", [False, True])
def test_params_are_the_hand_built_sampling(greedy):
    part = SamplingConfig(temperature=0.7, top_p=0.9)
    assert part.params(12, seed=5, greedy=greedy, stop=MOVE_STOP) == SamplingParams(
        max_new_tokens=12, temperature=0.0 if greedy else 0.7, top_p=0.9, stop=MOVE_STOP, seed=5)
    assert part.params(8) == SamplingParams(max_new_tokens=8, temperature=0.7, top_p=0.9)


@pytest.mark.parametrize("greedy", [False, True])
def test_rlvr_and_r_zero_sample_from_the_part(greedy):
    from lmselfplay.r_zero.steps import RZero
    from lmselfplay.rlvr.steps import sampling

    cfg = parse_recipe("rlvr", FLAGS)
    assert sampling(cfg, 3, 1, greedy) == SamplingParams(
        max_new_tokens=cfg.rlvr.max_new_tokens, temperature=0.0 if greedy else 0.7, top_p=0.9,
        seed=hash((cfg.run.seed, 1, 3)) % (2**31))
    run = RZero.__new__(RZero)
    run.cfg, run.acc = parse_recipe("r_zero", FLAGS), type("Acc", (), {"process_index": 0})()
    assert run.sampling(16, "q", greedy=greedy) == SamplingParams(
        max_new_tokens=16, temperature=0.0 if greedy else 0.7, top_p=0.9, seed=hash((0, 0, "q")) % (2**31))


def test_a_text_game_samples_at_its_own_budget():
    from lmselfplay.selfplay_games.steps import text_sampling

    cfg = parse_recipe("selfplay_games", FLAGS)
    assert text_sampling(cfg, make("taboo")) == SamplingParams(
        max_new_tokens=cfg.selfplay.text_max_new_tokens, temperature=0.7, top_p=0.9, stop=MOVE_STOP)
    assert text_sampling(cfg, make("nim")) is None


def test_search_selfplay_refuses_a_top_p_it_would_not_use():
    from lmselfplay.search_selfplay.config import SearchSelfPlayConfigs
    from lmselfplay.utils.config import ConfigError

    assert SearchSelfPlayConfigs.parse(["--config", "recipes/configs/search_selfplay_nim.yaml"]).sampling.top_p == 1.0
    with pytest.raises(ConfigError, match="top_p must be 1: search self-play samples no answers"):
        SearchSelfPlayConfigs.parse(["--config", "recipes/configs/search_selfplay_nim.yaml", "--top_p", "0.9"])
