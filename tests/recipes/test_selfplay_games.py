"""The self-play recipe end to end on a tiny model: runs, writes curves, resumes exactly."""

import json
from pathlib import Path

import pytest
import torch
from lm_fixtures import saved_weights

from lmselfplay.games.gtp import find_gnugo
from lmselfplay.selfplay_games.config import SelfPlayArgs
from lmselfplay.selfplay_games.metrics import gnugo_metrics
from lmselfplay.selfplay_games.steps import episode_games, training_samples
from lmselfplay.utils.recipe_loader import run_recipe

ROOT = Path(__file__).resolve().parents[2]


def _args(model_dir, out, steps, **kw):
    base = {"model_name_or_path": str(model_dir), "output_dir": str(out), "max_steps": steps,
            "games": "nim,kuhn_poker", "episodes_per_step": 8, "eval_every": 0, "eval_games": 4,
            "eval_positions": 10, "checkpoint_every": 1, "league_add_every": 1, "max_new_tokens": 6,
            "reset_fraction": 0.5, "learning_rate": 1e-3}
    base.update(kw)
    argv = []
    for k, v in base.items():
        argv += [f"--{k}", str(v)]
    return argv


def test_recipe_runs_and_resumes_exactly(model_dir, tmp_path):
    run_recipe("selfplay_games", _args(model_dir, tmp_path / "full", 3))
    full = tmp_path / "full"
    assert (full / "curves.png").exists() and (full / "final_model").exists()
    rows = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3]
    assert any("kuhn_poker/exploitability" in r for r in rows)

    # "killed" after 2 steps (a run that stops there), then --resume to 3
    run_recipe("selfplay_games", _args(model_dir, tmp_path / "cut", 2))
    run_recipe("selfplay_games", _args(model_dir, tmp_path / "cut", 3) + ["--resume", "true"])
    a, b = saved_weights(full / "final_model"), saved_weights(tmp_path / "cut" / "final_model")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ckpt = torch.load(tmp_path / "cut" / "checkpoint-3" / "lmselfplay_state.pt", weights_only=False)
    ref = torch.load(full / "checkpoint-3" / "lmselfplay_state.pt", weights_only=False)
    assert ckpt["extra"]["baselines"] == ref["extra"]["baselines"]
    assert len(ckpt["extra"]["league"]["ring"]) == 3
    # the weights moved at all
    init = saved_weights(model_dir)
    assert any(not torch.equal(init[k], a[k]) for k in a)


def test_unknown_config_key_is_rejected(model_dir, tmp_path):
    from lmselfplay.utils.config import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: 2\nlearning_rat: 0.1\n")
    with pytest.raises(ConfigError, match="learning_rat"):
        run_recipe("selfplay_games", ["--config", str(bad)])
    with pytest.raises(ConfigError, match="--nonsense"):
        run_recipe("selfplay_games", ["--nonsense", "1"])
    with pytest.raises(ValueError, match="sum to 1"):
        run_recipe("selfplay_games", _args(model_dir, tmp_path / "x", 1, mirror_fraction=0.9))


@pytest.mark.multiprocess
@pytest.mark.slow  # ~18 s a config; the 2-rank DDP step runs by default in rl/test_trainer_multiprocess.py
@pytest.mark.parametrize("config", ["ddp_cpu.yaml", "zero3_cpu.yaml"])
def test_recipe_under_accelerate_launch(model_dir, tmp_path, config):
    """Two ranks through `accelerate launch`: rollouts, eval (every rank; ZeRO-3 needs all
    of them for a forward), checkpoint and the final model gathered from the shards."""
    import os
    import subprocess
    import sys

    if "zero" in config:
        pytest.importorskip("deepspeed")
    root = Path(__file__).resolve().parents[2]
    # league snapshots every step, the nash meta-solver playing each new one against the ring:
    # under ZeRO-3 the snapshots come from gathered weights and the frozen engines are whole
    # local models, so ranks never wait on each other for them
    league = dict(mirror_fraction=0.4, recent_fraction=0.4, hall_of_fame_fraction=0.1, bot_fraction=0.1,
                  league_add_every=1, league_promote_every=1, meta_solver="nash", league_eval_games=4)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(root / "recipes" / "accelerate" / config), str(root / "recipes" / "selfplay_games.py"),
           *_args(model_dir, tmp_path / "run", 2, eval_every=1, checkpoint_every=2, **league)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "run"
    assert (run / "checkpoint-2").is_dir() and (run / "final_model").is_dir()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    a, init = saved_weights(run / "final_model"), saved_weights(model_dir)
    assert any(not torch.equal(init[k], a[k]) for k in a)
    league_state = torch.load(run / "checkpoint-2" / "lmselfplay_state.pt", weights_only=False)["extra"]["league"]
    assert [r[2] for r in league_state["ring"]] == ["step1", "step2"]
    assert set(league_state["payoff"]) == {("step2", "step1"), ("step1", "step2")}  # step2 played step1


def test_game_weights_split_each_step():
    from collections import Counter

    from lmselfplay.games import make

    games = [make(g) for g in ("nim", "tictactoe", "kuhn_poker")]
    count = lambda w, n: Counter(g.name for g in episode_games(games, w, n))  # noqa: E731
    assert count("", 48) == {"nim": 16, "tictactoe": 16, "kuhn_poker": 16}
    assert count("kuhn_poker=4", 96) == {"nim": 16, "tictactoe": 16, "kuhn_poker": 64}
    assert count("kuhn_poker=100", 10) == {"nim": 1, "tictactoe": 1, "kuhn_poker": 8}  # none vanishes
    assert count("tictactoe=0", 8) == {"nim": 4, "kuhn_poker": 4}
    assert sum(count("nim=0.3,kuhn_poker=2.2", 37).values()) == 37
    assert count("nim_misere=5", 6) == {"nim": 2, "tictactoe": 2, "kuhn_poker": 2}  # not in this run
    for bad in ("kuhn=4", "nim", "nim=lots", "nim=-1", "nim=0,tictactoe=0,kuhn_poker=0"):
        with pytest.raises(ValueError, match="game_weights"):
            episode_games(games, bad, 10)


def test_recipe_plays_a_free_text_game_by_name(model_dir, tmp_path):
    """Taboo (moves are utterances) runs through the same recipe: the league's bot slot is
    its scripted opponent, no random resets, its own answer budget, role-split win rates;
    a reasoning suite rides along as the eval callback."""
    out = tmp_path / "taboo"
    run_recipe("selfplay_games", _args(model_dir, out, 1, games="nim,taboo", eval_games=2, episodes_per_step=4,
                                       bot_fraction=0.5, mirror_fraction=0.5, recent_fraction=0.0,
                                       hall_of_fame_fraction=0.0, text_max_new_tokens=8, checkpoint_every=0,
                                       eval_every=1, eval_suite="tiny"))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    final = rows[-1]
    assert {"taboo/win_vs_scripted_as_attacker", "taboo/win_vs_scripted_as_defender",
            "nim/optimal_move_prob", "nim/win_vs_random"} <= set(final)
    assert "taboo/win_vs_random" not in final  # utterances cannot be drawn at random
    assert [r["step"] for r in rows if "train/loss" in r] == [1]
    bench = [r for r in rows if "eval/tiny/pass@1" in r]  # the reasoning-suite callback
    assert [r["step"] for r in bench] == [0] and 0.0 <= bench[0]["eval/tiny/pass@1"] <= 1.0


def test_recipe_plays_go_by_name(model_dir, tmp_path):
    """Go 9x9 needs no edits in the recipe: win rates only (no exact metric exists)."""
    out = tmp_path / "go"
    run_recipe("selfplay_games", _args(model_dir, out, 1, games="go9", eval_games=2, episodes_per_step=2,
                                       max_turns=6, checkpoint_every=0, league_add_every=0))
    final = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert "go9/win_vs_random" in final and not any("optimal" in k or "exploitability" in k for k in final)


def _taboo_finished(game, target, utterances, seats=(0, 1), invalid_last=False):
    """A Finished episode of Taboo played with the given utterances (mirror: both seats learn);
    ``invalid_last``: the next seat then answered illegally and forfeits (zero-sum)."""
    from lmselfplay.lm.rollout import Episode, Finished
    from lmselfplay.lm.trajectory import Trajectory, Turn

    state = game.state_for(target)
    for u in utterances:
        state = game.apply(state, u)
    returns = game.returns(state)
    if invalid_last:
        returns = [1.0, -1.0] if len(utterances) % 2 else [-1.0, 1.0]
    trajs = []
    for seat in seats:
        n = len(range(seat, len(utterances), 2)) + (invalid_last and seat == len(utterances) % 2)
        turns = [Turn([1], [2], [0.0], invalid=invalid_last and k == n - 1 and seat == len(utterances) % 2)
                 for k in range(n)]
        trajs.append(Trajectory("taboo", seat, turns, returns[seat]))
    return Finished(Episode(game, (None, None)), returns, trajs, state)


def test_spag_shaping_weights_only_the_winners_turns():
    """reward_shaping: spag gives each turn SPAG's weight (games.taboo.spag_state_weights) in
    place of the baseline advantage; an illegal turn keeps its plain (negative) advantage."""

    from lmselfplay.games.taboo import Taboo, spag_state_weights
    from lmselfplay.rl.advantages import RoleBaselines

    game = Taboo(words=["lemon", "whale"])
    won_by_defender = _taboo_finished(game, "lemon", ["It is sour.", "Is it fruit?", "Yellow and sour.",
                                                      "I know the word! It is lemon."])
    won_by_attacker = _taboo_finished(game, "whale", ["A big animal.", "I think of a whale."])
    finished = [won_by_defender, won_by_attacker]
    cfg = SelfPlayArgs(reward_shaping="spag", shaping_decay=0.8, illegal_penalty=0.0)
    samples = training_samples(cfg, finished, RoleBaselines(0.9))
    want = spag_state_weights([f.final_state for f in finished], 0.8)
    got = [s.advantage for s in samples]
    # per episode: the attacker's turns (seat 0), then the defender's (seat 1)
    assert got == pytest.approx(want[0][0::2] + want[0][1::2] + want[1][0::2] + want[1][1::2])
    assert got[:2] == [0.0, 0.0] and got[3] > 0  # the losing attacker: nothing; the guess: most
    plain = training_samples(SelfPlayArgs(reward_shaping="none", illegal_penalty=0.0), finished, RoleBaselines(0.9))
    assert [s.advantage for s in plain] != got
    # an over-long answer: the forfeit turn keeps its plain advantage, the others are shaped
    forfeit = _taboo_finished(game, "lemon", ["It is sour."], invalid_last=True)
    adv = [s.advantage for s in training_samples(cfg, [forfeit], RoleBaselines(0.9))]
    assert adv[-1] < 0


def test_illegal_penalty_blames_the_illegal_answer_only():
    """illegal_penalty > 0: the illegal turn gets -penalty, the seat's legal turns keep the
    game's advantage (here a won game after a retry: positive)."""

    from lmselfplay.lm.rollout import Episode, Finished
    from lmselfplay.lm.trajectory import Trajectory, Turn
    from lmselfplay.rl.advantages import RoleBaselines

    turns = [Turn([1], [2], [0.0]), Turn([1], [3], [0.0], invalid=True), Turn([1], [4], [0.0])]
    won = Finished(Episode(None, (None, None)), [1.0, -1.0], [Trajectory("nim", 0, turns, 1.0)], None)
    adv = [s.advantage for s in training_samples(SelfPlayArgs(illegal_penalty=0.5), [won], RoleBaselines(0.9))]
    assert adv[1] == -0.5 and adv[0] == adv[2] > 0
    assert [s.advantage for s in training_samples(SelfPlayArgs(), [won], RoleBaselines(0.9))] == [adv[0]] * 3


def test_spag_shaping_needs_a_game_that_defines_it(model_dir, tmp_path):
    from lmselfplay.utils.config import ConfigError

    with pytest.raises(ConfigError, match="turn_weights"):
        run_recipe("selfplay_games", _args(model_dir, tmp_path / "x", 1, reward_shaping="spag"))


@pytest.mark.skipif(find_gnugo() is None, reason="gnugo is not installed (apt-get install gnugo)")
def test_gnugo_evaluation_of_go_and_its_process_ends(model_dir):
    """gnugo_level > 0: Go is also scored against GnuGo (a win rate with its interval), the
    engine process is gone afterwards; other games and gnugo_level 0 get nothing."""
    import os
    from types import SimpleNamespace

    from lmselfplay.games import make
    from lmselfplay.lm.engines.base import SamplingParams
    from lmselfplay.lm.engines.hf import HFEngine
    from lmselfplay.models.policy import load_policy

    model, tok = load_policy(model_name_or_path=str(model_dir))
    engine = HFEngine(model, tok)
    go5 = make("go", size=5)
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, seed=0)
    cfg = SimpleNamespace(gnugo_level=1, gnugo_games=2)
    before = set(os.listdir("/proc"))
    got = gnugo_metrics(cfg, go5, engine, tok, sampling, 0)
    assert set(got) == {"go5/win_vs_gnugo_l1", "go5/win_vs_gnugo_l1_ci_low", "go5/win_vs_gnugo_l1_ci_high"}
    assert 0 <= got["go5/win_vs_gnugo_l1_ci_low"] <= got["go5/win_vs_gnugo_l1"] <= got["go5/win_vs_gnugo_l1_ci_high"]
    new = set(os.listdir("/proc")) - before
    assert not any("gnugo" in open(f"/proc/{p}/cmdline").read() for p in new if p.isdigit()
                   and os.path.exists(f"/proc/{p}/cmdline"))
    assert gnugo_metrics(SimpleNamespace(gnugo_level=0, gnugo_games=2), go5, engine, tok, sampling, 0) == {}
    assert gnugo_metrics(cfg, make("nim"), engine, tok, sampling, 0) == {}


def test_the_old_build_name_is_one_line_naming_make_selfplay():
    from lmselfplay.selfplay_games import steps

    with pytest.raises(AttributeError, match="make_selfplay"):
        steps.build  # noqa: B018
