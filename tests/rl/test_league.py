"""The league: the snapshot ring, the hall of fame, the opponent mix, the payoff table that
the nash meta-solver reads, and exact checkpointing."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch
from lm_fixtures import tiny_model, tiny_tokenizer

from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.models.policy import frozen_policy, policy_weights
from lmselfplay.rl.league import League, LeagueConfig, PlayInConfig


class _Weights(torch.nn.Module):
    def __init__(self, value: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((2,), value))


def _league(make_engine=None, meta_solver=None, **kw) -> League:
    base = dict(league_capacity=3, league_add_every=5, league_promote_every=2)
    play_in = PlayInConfig(meta_solver=meta_solver) if meta_solver else None
    return League(LeagueConfig(**{**base, **kw}), make_engine, play_in=play_in)


def _hf_engines(template, tok):
    return lambda weights, version: HFEngine(frozen_policy(template, weights), tok, version=version)


def test_fractions_and_solver_are_validated():
    with pytest.raises(ValueError, match="sum to 1"):
        LeagueConfig(mirror_fraction=0.5)
    with pytest.raises(ValueError, match="meta_solver"):
        PlayInConfig(meta_solver="elo")
    with pytest.raises(ValueError, match="league_eval_games"):
        PlayInConfig(league_eval_games=-1)


def test_ring_rotates_and_hall_keeps_promoted_snapshots():
    lg = _league()
    assert [s for s in range(1, 31) if lg.due(s)] == [5, 10, 15, 20, 25, 30]
    for k, step in enumerate((5, 10, 15, 20, 25)):
        lg.add(step, policy_weights(_Weights(float(k))))
    assert [s.name for s in lg.ring] == ["step15", "step20", "step25"]  # capacity 3
    assert [s.name for s in lg.hall] == ["step10", "step20"]  # every 2nd snapshot
    # snapshots are copies: changing the model later does not change them
    m = _Weights(7.0)
    snap = lg.add(30, policy_weights(m))
    with torch.no_grad():
        m.w.add_(1.0)
    assert torch.equal(snap.state["w"], torch.full((2,), 7.0))


def test_opponent_mix_follows_the_fractions_and_falls_back_to_mirror():
    lg = _league(mirror_fraction=0.4, recent_fraction=0.4, hall_of_fame_fraction=0.1, bot_fraction=0.1)
    rng = random.Random(0)
    empty = Counter(lg.sample_opponent(rng)[0] for _ in range(2000))
    assert set(empty) == {"mirror", "bot"}  # no snapshots yet: those games are mirror games
    for step in (5, 10):
        lg.add(step, policy_weights(_Weights(0.0)))
    n = 20000
    kinds = Counter(lg.sample_opponent(rng)[0] for _ in range(n))
    for kind, frac in (("mirror", 0.4), ("recent", 0.4), ("hall", 0.1), ("bot", 0.1)):
        assert abs(kinds[kind] / n - frac) < 0.015, kinds


def test_play_in_fills_an_antisymmetric_table_and_nash_weights_it():
    """Rock-paper-scissors snapshots plus one that loses to all: the nash meta-solver
    gives the three cyclic ones 1/3 each and the dominated one 0; uniform ignores the table."""
    beats = {("r", "s"), ("s", "p"), ("p", "r"), ("r", "x"), ("p", "x"), ("s", "x")}
    lg = _league(league_capacity=4, meta_solver="nash")
    names = {}
    calls = []

    def score(a, b):
        calls.append((a.name, b.name))
        x, y = names[a.name], names[b.name]
        return 1.0 if (x, y) in beats else -1.0 if (y, x) in beats else 0.0

    for k, label in enumerate("rpsx"):
        snap = lg.add(5 * (k + 1), policy_weights(_Weights(float(k))))
        names[snap.name] = label
        lg.play_in(snap, score)
    assert len(calls) == 6  # each pair once, by the newer snapshot
    U = lg.payoff_table(lg.ring)
    assert np.allclose(U, -U.T)
    assert U[0, 2] == 1.0 and U[2, 0] == -1.0  # r beats s
    assert np.allclose(lg.ring_weights(), [1 / 3, 1 / 3, 1 / 3, 0.0], atol=1e-6)
    uni = _league(league_capacity=4, meta_solver="uniform")
    snap = uni.add(5, policy_weights(_Weights(0.0)))
    uni.play_in(snap, lambda a, b: pytest.fail("uniform needs no games"))
    assert uni.payoff == {}


def test_state_dict_round_trip_and_engines_serve_the_snapshot():
    tok, model = tiny_tokenizer(), tiny_model(seed=1)
    lg = _league(meta_solver="nash")
    for step in (5, 10, 15, 20):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * step)
        snap = lg.add(step, policy_weights(model))
        lg.record(snap.name, "step5", 0.25)
    restored = _league(_hf_engines(model, tok), meta_solver="nash")
    restored.load_state_dict(lg.state_dict())
    assert [s.name for s in restored.ring] == [s.name for s in lg.ring]
    assert [s.name for s in restored.hall] == [s.name for s in lg.hall] == ["step10", "step20"]
    assert restored.payoff == lg.payoff and restored.added == lg.added
    # a frozen engine serves exactly the snapshot's weights, not the learner's
    snap = restored.ring[0]
    engine = restored.engine_for(snap)
    assert engine.model is not model
    for k, v in engine.model.state_dict().items():
        assert torch.equal(v, snap.state[k]), k
    # ... and scores with them: the learner (moved on since) scores the same answer differently
    prompt, answer = [tok("Stones: 3.")["input_ids"]], [tok("<move>1</move>")["input_ids"]]
    frozen = engine.score(prompt, answer)[0]
    same = tiny_model(seed=2)
    same.load_state_dict(snap.state)
    assert frozen == pytest.approx(HFEngine(same, tok).score(prompt, answer)[0], abs=1e-6)
    assert frozen != pytest.approx(HFEngine(model, tok).score(prompt, answer)[0], abs=1e-4)


def test_lora_snapshots_hold_the_adapter_only_and_play_as_opponents():
    """Under LoRA a snapshot is the adapter (not a model copy); its engine serves base +
    that adapter, stays fixed while the learner moves on, and plays snapshot games."""
    from peft import LoraConfig, get_peft_model

    from lmselfplay.games import make
    from lmselfplay.lm.engines.base import SamplingParams
    from lmselfplay.lm.rollout import Episode, LLMPlayer, collect_episodes

    tok = tiny_tokenizer()
    learner = get_peft_model(tiny_model(seed=3), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                            task_type="CAUSAL_LM"))
    lg = _league(_hf_engines(learner, tok), league_capacity=2)
    for step in (5, 10):
        with torch.no_grad():
            for name, p in learner.named_parameters():
                if "lora_B" in name:
                    p.add_(0.05 * step)
        snap = lg.add(step, policy_weights(learner))
    assert snap.state and all("lora_" in k for k in snap.state)  # the adapter alone
    n_all = sum(v.numel() for v in learner.state_dict().values())
    assert sum(v.numel() for v in snap.state.values()) < n_all / 5
    prompt, answer = [tok("Stones: 3.")["input_ids"]], [tok("<move>1</move>")["input_ids"]]
    engine = lg.engine_for(snap)
    served = engine.score(prompt, answer)[0]
    with torch.no_grad():  # the learner moves on; the snapshot must not
        for name, p in learner.named_parameters():
            if "lora_B" in name:
                p.add_(1.0)
    assert engine.score(prompt, answer)[0] == pytest.approx(served, abs=1e-6)
    assert HFEngine(learner, tok).score(prompt, answer)[0] != pytest.approx(served, abs=1e-4)
    older = lg.engine_for(lg.ring[0])
    assert older.score(prompt, answer)[0] != pytest.approx(served, abs=1e-4)
    me = LLMPlayer(HFEngine(learner, tok), tok, learner=True)
    opp = LLMPlayer(engine, tok, learner=False, name=snap.name)
    done = collect_episodes([Episode(make("nim", start=5), (me, opp), seed=i) for i in range(4)],
                            SamplingParams(max_new_tokens=6, seed=0))
    assert len(done) == 4 and all(sum(f.returns) == 0 for f in done)
    assert all(t.opponent == snap.name for f in done for t in f.trajectories)


def test_only_the_recipe_whose_league_plays_in_has_the_play_in_flags():
    """Self-play's league plays play-in games and has their flags; search self-play's never does,
    so the flags do not exist there, and a league built without a play-in config plays none."""
    from lmselfplay.search_selfplay.config import SearchSelfPlayConfigs
    from lmselfplay.selfplay_games.config import SelfPlayConfigs
    from lmselfplay.utils.config import ConfigError

    assert SelfPlayConfigs.parse(["--meta_solver", "nash"]).play_in.meta_solver == "nash"
    for flag in ("--meta_solver", "--league_eval_games"):
        with pytest.raises(ConfigError, match=f"unknown command-line argument.*{flag}"):
            SearchSelfPlayConfigs.parse([flag, "2"])
    lg = League(LeagueConfig(league_capacity=3))
    lg.add(1, {"w": torch.zeros(1)})
    lg.play_in(lg.add(2, {"w": torch.zeros(1)}), lambda a, b: pytest.fail("no play-in without its config"))
    assert lg.payoff == {} and list(lg.ring_weights()) == [0.5, 0.5]
