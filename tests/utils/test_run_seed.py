"""The seed is the run's: every recipe declares it once, as a field of its RunConfig part (``--seed`` and the YAML
key ``seed:`` land there, and ``--help`` lists it in the run group), and each recipe hands that value to what
draws from it: the policy trainer (its micro-batch shuffling) and the engine, or the torch generator that makes
the initial weights (AlphaZero, SPIN)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from recipe_configs import RECIPE_CONFIGS

import lmselfplay.lm.engines as engines
import lmselfplay.r_zero.steps as r_zero
import lmselfplay.selfplay_games.steps as selfplay
from lmselfplay.alphazero.config import AlphaZeroArgs
from lmselfplay.referee_study import RefereeStudyConfigs
from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig
from lmselfplay.spin.config import SpinArgs
from lmselfplay.utils.config import field_owners
from lmselfplay.utils.recipe_loader import run_recipe
from lmselfplay.utils.run import RunConfig

CONFIGS = {**RECIPE_CONFIGS, "referee_study": RefereeStudyConfigs}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_seed_is_a_field_of_the_run_part_alone(name):
    cls = CONFIGS[name]
    assert field_owners(cls.classes())["seed"] is RunConfig
    holders = [k.__name__ for k in cls.classes() if "seed" in {f.name for f in dataclasses.fields(k)}]
    assert holders == ["RunConfig"], holders


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_seed_flag_and_yaml_key_land_in_the_run_part(name, tmp_path):
    cls = CONFIGS[name]
    assert cls.parse([]).run.seed == 0
    cfg = cls.parse(["--seed", "5"])
    assert cfg.run.seed == 5 and cfg.as_dict()["seed"] == 5
    (tmp_path / "c.yaml").write_text("seed: 7\n")
    assert cls.parse(["--config", str(tmp_path / "c.yaml")]).run.seed == 7
    assert cls.parse(["--config", str(tmp_path / "c.yaml"), "--seed", "5"]).run.seed == 5
    assert cls.from_values(seed=5).run.seed == 5


def test_help_lists_the_seed_in_the_run_group():
    from transformers import HfArgumentParser

    parser = HfArgumentParser(RECIPE_CONFIGS["selfplay_games"].classes())
    groups = {g.title: {a.dest for a in g._group_actions} for g in parser._action_groups}
    assert "seed" in groups[RunConfig._argument_group_name]
    assert [title for title, dests in groups.items() if "seed" in dests] == [RunConfig._argument_group_name]


@pytest.mark.parametrize("cls", [TrainerConfig, AlphaZeroArgs, SpinArgs])
def test_a_part_built_in_code_with_a_seed_refuses_it(cls):
    """A part that does not hold the seed refuses it by name (it is never dropped silently)."""
    with pytest.raises(TypeError, match="seed"):
        cls(seed=3)


class Stop(Exception):
    """Raised by a stand-in once the recipe has handed over its seed."""


TRAINER_RECIPES = {"selfplay_games": ["--games", "nim", "--eval_positions", "5"], "absolute_zero": [],
                   "r_zero": [], "rlvr": [], "debate": ["--train_tasks", "8", "--eval_tasks", "4"],
                   "search_selfplay": []}


@pytest.mark.parametrize("recipe", sorted(TRAINER_RECIPES))
def test_each_policy_trainer_recipe_hands_the_run_seed_to_its_trainer_and_engine(recipe, model_dir, tmp_path,
                                                                                 monkeypatch):
    """``--seed 5`` reaches ``PolicyTrainer(..., seed=)`` and ``make_engine(..., seed=)`` (search self-play
    has no engine: its trainer)."""
    seen = {}
    trainer_init = PolicyTrainer.__init__

    def trainer(self, *args, **kwargs):
        seen["trainer"] = kwargs.get("seed", "(not given)")
        if recipe == "search_selfplay":
            raise Stop
        trainer_init(self, *args, **kwargs)

    def engine(cfg, model, tok, **run):
        seen["engine"] = run.get("seed", "(not given)")
        raise Stop

    monkeypatch.setattr(PolicyTrainer, "__init__", trainer)
    monkeypatch.setattr(engines, "make_engine", engine)
    for module in (r_zero, selfplay):  # the recipes whose engines are built in the package
        monkeypatch.setattr(module, "make_engine", engine)
    with pytest.raises(Stop):
        run_recipe(recipe, ["--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path / "run"),
                            "--seed", "5", *TRAINER_RECIPES[recipe]])
    assert seen == ({"trainer": 5} if recipe == "search_selfplay" else {"trainer": 5, "engine": 5})


@pytest.mark.parametrize("recipe, argv", [
    ("alphazero", ["--tensorboard", "false", "--progress", "false"]),
    ("spin", ["--tensorboard", "false", "--progress", "false"]),
])
def test_alphazero_and_spin_seed_the_initial_weights_with_the_run_seed(recipe, argv, tmp_path, monkeypatch):
    seeds = []

    def manual_seed(seed):
        seeds.append(seed)
        raise Stop

    monkeypatch.setattr(torch, "manual_seed", manual_seed)
    with pytest.raises(Stop):
        run_recipe(recipe, ["--output_dir", str(tmp_path / "run"), "--seed", "5", *argv])
    assert seeds == [5]
