"""The trainer's supervised-target loss (search distillation's cross-entropy toward a
distribution at one completion token) under 2-process DDP on CPU (gloo, the shipped
``recipes/accelerate/ddp_cpu.yaml``) equals one process on the union of the samples.

Each rank trains on its half of one global batch whose samples all carry a target and
advantage 0 (``--beta 0``: the target term is the whole loss). The loss is divided by the
rank's total target weight, and DDP averages the ranks' gradients, so with equal target
weight per rank (4 samples each here) the two ranks together compute the union's mean:
the same loss, the same (all-reduced) gradient and the same weights after the step. With unequal
target weight per rank the DDP step is the mean of per-rank means instead (as for the
token-mean policy-gradient loss).
"""

from __future__ import annotations

import pytest
from mp_helpers import identical, launch, max_diff, read_ranks, run_inprocess

ARGS = ("--steps", "1", "--beta", "0", "--batch", "8", "--targets")


@pytest.mark.multiprocess
@pytest.mark.slow  # ~15 s: 2 gloo processes
def test_target_loss_two_ranks_equal_one_process_on_the_union(tmp_path):
    union, half, ddp = tmp_path / "union", tmp_path / "half", tmp_path / "ddp"
    run_inprocess("--out", str(union), *ARGS)
    run_inprocess("--out", str(half), *ARGS, "--only_rank0_data")
    launch("ddp_cpu.yaml", "--out", str(ddp), *ARGS)
    (u,), (h,), ranks = read_ranks(union, 1), read_ranks(half, 1), read_ranks(ddp, 2)
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)
    assert all(r["backend"] == "gloo" for r in ranks)
    assert all(r["metrics"]["samples"] == 4 for r in ranks) and u["metrics"]["samples"] == 8
    # the loss: only the target term (advantage 0), and the ranks' means average to the union's
    assert all(abs(r["metrics"]["pg_loss"]) < 1e-12 for r in ranks + [u])
    ce = [r["metrics"]["target_ce"] for r in ranks]
    assert ce[0] != pytest.approx(ce[1])  # the ranks really saw different data
    assert (ce[0] + ce[1]) / 2 == pytest.approx(u["metrics"]["target_ce"], abs=1e-5)
    # the gradients of the first step, as the optimizer saw them (after the all-reduce)
    g0, g1, gu = ranks[0]["grads"], ranks[1]["grads"], u["grads"]
    assert gu and max(float(g.abs().max()) for g in gu.values()) > 1e-3
    assert identical(g0, g1)
    assert max_diff(g0, gu) < 1e-6
    assert max_diff(h["grads"], gu) > 1e-3  # rank 1's half mattered
    # and the weights after the step: equal on both ranks, and within 1% of one step's size
    # (lr 1e-2) of the union's. Not bit-equal: Adam's first step is lr * g / (|g| + 1e-8),
    # which turns float-order differences of the all-reduce into visible ones wherever |g|
    # is near 1e-8 (softmax tails), though the gradients agree to 1e-6 above.
    assert identical(ranks[0]["params"], ranks[1]["params"])
    assert max_diff(ranks[0]["params"], u["params"]) < 1e-4
    assert max_diff(h["params"], u["params"]) > 1e-3
