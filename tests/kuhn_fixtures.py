"""Random tabular policies for the tests of the average policy and of exact feedback (the
``kuhn`` game fixture they share is in conftest.py)."""

import random

from lmselfplay.rl.average_policy import infoset_states


def random_policy(game, seed, low=0.0, high=1.0):
    """A random behavioural policy of a two-action game: at every information set the first
    action's probability is uniform in [low, high] (one draw per set, in infoset order)."""
    rng = random.Random(seed)
    return {key: (lambda p: [p, 1 - p])(rng.uniform(low, high)) for key in infoset_states(game)}


def recipe_args(model_dir, out, steps, **kw):
    """argv of a small self-play run on Nim and Kuhn poker (evaluated every step), ``kw``
    overriding or adding options."""
    base = {"model_name_or_path": str(model_dir), "output_dir": str(out), "max_steps": steps,
            "games": "nim,kuhn_poker", "episodes_per_step": 6, "eval_every": 1, "eval_games": 2,
            "eval_positions": 5, "checkpoint_every": 1, "league_add_every": 1, "max_new_tokens": 6,
            "learning_rate": 1e-3}
    base.update(kw)
    return [x for k, v in base.items() for x in (f"--{k}", str(v))]
