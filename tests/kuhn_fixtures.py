"""Random tabular policies for the tests of the average policy and of exact feedback (the
``kuhn`` game fixture they share is in conftest.py)."""

import random

from lmselfplay.rl.average_policy import infoset_states


def random_policy(game, seed, low=0.0, high=1.0):
    """A random behavioural policy of a two-action game: at every information set the first
    action's probability is uniform in [low, high] (one draw per set, in infoset order)."""
    rng = random.Random(seed)
    return {key: (lambda p: [p, 1 - p])(rng.uniform(low, high)) for key in infoset_states(game)}
