"""League snapshots: full weights under ZeRO-3, gathered a bucket at a time (never the whole
model), in the model's declared dtype, in both recipes that keep a league.

ZeRO-3 is imitated on one CPU process the way DeepSpeed lays it out (deepspeed/runtime/zero/
partition_parameters.py): a partitioned parameter carries ``ds_id`` / ``ds_shape`` / ``ds_numel``
and holds an empty tensor until ``GatheredParameters`` fills it for the duration of the block."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch
from lm_fixtures import tiny_model

import lmselfplay.lm.engines.weight_sync as weight_sync
from lmselfplay.models.policy import frozen_policy, policy_weights


def _partition(model):
    """Every parameter an empty shard (as under ZeRO-3); returns the full values by id."""
    full = {}
    for i, p in enumerate(model.parameters()):
        full[id(p)] = p.data.clone()
        p.ds_id, p.ds_shape, p.ds_numel = i, tuple(p.shape), p.numel()
        p.data = torch.empty(0, dtype=p.dtype)
    return full


def _fake_gather(monkeypatch, full, live_sizes):
    @contextlib.contextmanager
    def gather(params):
        assert not any(p.numel() for p in params), "a shard was gathered twice at once"
        for p in params:
            p.data = full[id(p)]
        live_sizes.append(sum(p.numel() for p in params))
        try:
            yield
        finally:
            for p in params:
                p.data = torch.empty(0, dtype=p.dtype)
    monkeypatch.setattr(weight_sync, "zero3_gather", gather)


def test_a_zero3_snapshot_is_the_full_model_gathered_a_bucket_at_a_time(monkeypatch):
    model = tiny_model(seed=1)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    full = _partition(model)
    live = []
    _fake_gather(monkeypatch, full, live)
    got = policy_weights(model, bucket_bytes=8192)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    total = sum(v.numel() for v in full.values())
    assert len(live) > 2 and max(live) < total / 2  # never the whole model at once
    assert all(p.numel() == 0 for p in model.parameters())  # released: shards again


def test_a_snapshot_keeps_the_declared_dtype_not_the_float32_masters():
    model = tiny_model(seed=1)
    model.config.dtype = torch.bfloat16  # declared bfloat16; the trainer holds float32 masters
    snap = policy_weights(model)
    assert {v.dtype for v in snap.values() if v.is_floating_point()} == {torch.bfloat16}
    frozen = frozen_policy(model, snap)
    assert {p.dtype for p in frozen.parameters()} == {torch.bfloat16}


def test_search_selfplay_snapshots_gather_under_zero3(monkeypatch):
    from lmselfplay.search_selfplay.steps import HEAD_PREFIX, snapshot

    model = tiny_model(seed=2)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    _fake_gather(monkeypatch, _partition(model), [])
    head = torch.nn.Linear(4, 1)
    snap = snapshot(SimpleNamespace(unwrapped=model, model=model), head)
    assert all(torch.equal(snap[k], want[k]) for k in want)
    assert torch.equal(snap[HEAD_PREFIX + "weight"], head.weight)
