"""Per-observation baselines (a tabular critic) for the self-play recipe's advantages."""

import numpy as np
import pytest

from lmselfplay.lm.trajectory import Trajectory, Turn
from lmselfplay.rl.advantages import RoleBaselines, observation_key
from lmselfplay.selfplay_games.config import SelfPlayArgs
from lmselfplay.selfplay_games.steps import turn_advantages
from lmselfplay.utils.config import ConfigError


def test_unseen_key_reads_and_starts_from_its_fallback():
    b = RoleBaselines(decay=0.5)
    b.advantages(["g/p0"], [1.0])  # role baseline 0.5
    adv = b.advantages(["g/p0|x", "g/p0|x"], [2.0, 2.0], fallback=["g/p0", "g/p0"])
    # both read 0.5 (the batch's values are read before the update); x's EMA: 0.5 -> 1.25 -> 1.625
    assert adv.tolist() == [1.5, 1.5]
    assert b.values["g/p0|x"] == pytest.approx(1.625)
    assert b.advantages(["other"], [1.0]).tolist() == [1.0]  # no fallback: 0, as before


def test_observation_key_is_stable_and_tells_prompts_apart():
    assert observation_key("g/p0", [1, 2, 3]) == observation_key("g/p0", [1, 2, 3])
    assert observation_key("g/p0", [1, 2, 3]) != observation_key("g/p0", [1, 2, 4])
    assert observation_key("g/p0", [1, 2, 3]) != observation_key("g/p1", [1, 2, 3])
    assert observation_key("g/p0", [7]) == "g/p0|" + observation_key("x", [7]).split("|")[1]


def _traj(reward, prompts):
    return Trajectory("g", 0, [Turn(list(p), [5], [-0.1]) for p in prompts], reward)


def test_turn_advantages_per_role_and_per_observation():
    trajs = [_traj(1.0, [[1], [2]]), _traj(-1.0, [[1], [3]])]
    role = turn_advantages("role", RoleBaselines(0.5), trajs)
    assert [role[id(t)] for t in trajs] == [[1.0, 1.0], [-1.0, -1.0]]  # one per trajectory, as SPIRAL's RAE

    b = RoleBaselines(0.5)
    turn_advantages("observation", b, trajs)
    # prompt [1] saw returns 1 and -1 (EMA from 0: 0.5 then -0.25), prompt [2] saw 1, prompt [3] saw -1
    t = _traj(1.0, [[1], [2]])
    assert turn_advantages("observation", b, [t])[id(t)] == pytest.approx([1.0 - (-0.25), 1.0 - 0.5])
    assert b.values["g/p0/initial"] == pytest.approx(np.float64(0.375))  # the role baseline learns too
    with pytest.raises(ConfigError, match="baseline_key"):
        SelfPlayArgs(baseline_key="critic")
