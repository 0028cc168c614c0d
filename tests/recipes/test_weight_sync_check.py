"""Every recipe that generates with an engine is checked for stale weights every step.

The engine here holds its own copy of the weights and its push "succeeds" without loading
anything (a push that silently stopped: huggingface/trl#5312's failure). From the trainer's second
step on the engine samples with the initial weights, so the first pass's
|trainer - engine| log-prob jumps; the check lives in ``PolicyTrainer.step`` and the detector
comes from ``make_engine``, so no recipe can leave it out."""

from __future__ import annotations

import copy
import json

import pytest
from lm_fixtures import save_tiny

import lmselfplay.lm.engines.factory as factory
from lmselfplay.lm.engines.hf import HFEngine, unwrap
from lmselfplay.lm.engines.weight_sync_check import StaleWeightsError, StaleWeightsWarning
from lmselfplay.utils.recipe_loader import run_recipe


class StoppedPush(HFEngine):
    """An HF engine with its own frozen copy of the weights whose push reports success and loads
    nothing."""

    shares_module = False

    def __init__(self, model, tokenizer, **kw):
        super().__init__(copy.deepcopy(unwrap(model)), tokenizer, **kw)

    def update_weights(self, model, version=None):
        self.version = self.version + 1 if version is None else version


def _argv(d: dict) -> list[str]:
    return [x for k, v in d.items() for x in (f"--{k}", str(v))]


# the smallest run of each recipe in which one trainer makes two steps on sampled tokens
RECIPES = {
    "selfplay_games": {"max_steps": 2, "games": "nim", "episodes_per_step": 4, "eval_every": 0, "eval_games": 2,
                       "eval_positions": 4, "checkpoint_every": 0, "league_add_every": 0, "max_new_tokens": 6},
    "absolute_zero": {"max_steps": 2, "proposals_per_type": 2, "solve_tasks_per_type": 2, "num_generations": 2,
                      "references": 1, "seed_programs": 4, "eval_tasks_per_type": 2, "eval_every": 0,
                      "checkpoint_every": 0, "propose_max_new_tokens": 16, "solve_max_new_tokens": 12},
    "r_zero": {"rounds": 1, "challenger_steps": 2, "num_questions": 4, "challenger_group_size": 4,
               "pool_size": 4, "num_answers": 10, "solver_steps": 1, "solver_batch": 2, "solver_group_size": 10,
               "heldout_size": 2, "challenger_max_new_tokens": 12, "solver_max_new_tokens": 8},
    "debate": {"max_steps": 2, "eval_tasks": 2, "train_tasks": 8, "debates_per_step": 2, "max_new_tokens": 6,
               "max_prompt_tokens": 240, "num_rounds": 1, "turn_order": "sequential", "checkpoint_every": 0},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("model"), seed=2)


def _run(name, model_dir, out, monkeypatch, **kw):
    monkeypatch.setattr(factory, "HFEngine", StoppedPush)
    # the entropy bonus moves the weights whatever the rewards (a step of equal rewards has no advantage)
    args = {"model_name_or_path": model_dir, "output_dir": out, "learning_rate": 5e-2, "entropy_coef": 1.0,
            "weight_sync_threshold": 1e-3,
            **RECIPES[name], **kw}
    run_recipe(name, _argv(args))


@pytest.mark.parametrize("name", list(RECIPES))
def test_a_push_that_silently_stops_is_a_strict_stop_in_every_recipe(name, model_dir, tmp_path, monkeypatch):
    with pytest.raises(StaleWeightsError, match="stale at step 2"):
        _run(name, model_dir, tmp_path / name, monkeypatch, strict_sync="true")


def test_without_strict_sync_it_is_a_warning_and_logged(model_dir, tmp_path, monkeypatch):
    out = tmp_path / "az"
    with pytest.warns(StaleWeightsWarning, match="stale at step 2"):
        _run("absolute_zero", model_dir, out, monkeypatch)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    stale = [r["train/sync/stale"] for r in rows if "train/sync/stale" in r]
    assert stale == [0.0, 1.0]  # in step at the first step, stale from the second on
