"""What a long run keeps is bounded: the league's snapshots (ring + hall of fame), its live
engines and its payoff table do not grow with the number of steps (the leak benchmark,
``benchmarks/bench_leak.py``, measures RSS and step time of the whole loop)."""

from __future__ import annotations

import random

import torch

from lmselfplay.rl.league import League, LeagueConfig, PlayInConfig


def test_league_memory_is_bounded_over_a_long_run():
    made = []

    def engine(weights, version):
        made.append(version)
        return object()

    cfg = LeagueConfig(league_capacity=4, league_add_every=1, league_promote_every=2, league_hall_capacity=3)
    play_in = PlayInConfig(meta_solver="nash", league_eval_games=2)
    lg = League(cfg, engine, max_live_engines=2, play_in=play_in)
    rng = random.Random(0)
    for step in range(1, 501):
        snap = lg.add(step, {"w": torch.zeros(1)})
        lg.play_in(snap, lambda a, b: rng.choice([-1.0, 1.0]))
        for _ in range(3):
            kind, opp = lg.sample_opponent(rng)
            if opp is not None:
                lg.engine_for(opp)
    assert [s.name for s in lg.ring] == ["step497", "step498", "step499", "step500"]
    assert [s.name for s in lg.hall] == ["step496", "step498", "step500"]  # the newest 3 promoted
    assert len(lg._engines) <= 2 and len(made) > 2
    bank = {s.name for s in lg.ring + lg.hall}
    assert lg.payoff and all(set(k) <= bank for k in lg.payoff)  # nothing kept for dropped snapshots
    assert len(lg.payoff) <= len(bank) * (len(bank) - 1)
    restored = League(cfg, engine, play_in=play_in)
    restored.load_state_dict(lg.state_dict())
    assert [s.name for s in restored.hall] == [s.name for s in lg.hall] and restored.payoff == lg.payoff
