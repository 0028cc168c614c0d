"""Kill-and-resume through PolicyTrainer.save_checkpoint / load_checkpoint is exact.

N steps uninterrupted == k steps, checkpoint, hard kill (SIGKILL right after the save),
then a fresh process that loads the checkpoint and runs the remaining N - k steps on the
same seeded sample stream: bit-identical parameters, RAE baselines, Adam moments, Adam
step count and learning rate. The run exercises PPO passes (2 per batch), gradient
accumulation (2 micro-batches), LR warm-up and the KL reference model, so every piece of
state those need must be in the checkpoint. Multi-process variants (DDP, ZeRO-2,
ZeRO-3, where the weights are gathered from every rank) are slow.
"""

from __future__ import annotations

import signal

import pytest
from mp_helpers import identical, launch, read_ranks, run_inprocess, run_python, start_python

ARGS = ("--steps", "4", "--num_iterations", "2", "--gradient_accumulation_steps", "2",
        "--beta", "0.1", "--warmup_steps", "2", "--batch", "8")
K = "2"


def _assert_same_state(a: dict, b: dict) -> None:
    assert a["step_count"] == b["step_count"] == 4
    assert identical(a["params"], b["params"])
    assert a["baselines"] == b["baselines"] and a["baselines"]["values"]
    assert a["optimizer"] == b["optimizer"]  # Adam moments, Adam step, LR (exact floats)


def test_single_process_kill_and_resume_is_exact(tmp_path):
    full, resumed, ckpt = tmp_path / "full", tmp_path / "resumed", tmp_path / "ckpt"
    killed = start_python("--out", str(tmp_path / "never"), "--ckpt", str(ckpt), "--save_at", K, *ARGS)
    run_inprocess("--out", str(full), *ARGS)  # the uninterrupted run, beside the one to be killed
    _, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err[-3000:]
    assert [p.name for p in ckpt.iterdir()] == [f"checkpoint-{K}"]  # atomic: no temp dir left
    assert (ckpt / f"checkpoint-{K}" / "COMPLETE").exists()
    assert not (tmp_path / "never").exists()

    r = run_python("--out", str(resumed), "--ckpt", str(ckpt), "--resume", *ARGS)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = read_ranks(full, 1)[0], read_ranks(resumed, 1)[0]
    _assert_same_state(a, b)
    assert a["optimizer"]["adam_step"] == 8.0  # 4 steps x 2 PPO passes, one scheduler step each
    # 4 calls x 2 passes = 8 optimizer steps; warm-up 2 calls = 4 steps, schedule 100 calls = 200 steps
    assert a["optimizer"]["lr"] == pytest.approx(0.01 * (200 - 8) / (200 - 4))  # linear after warm-up


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("config", ["ddp_cpu.yaml", "zero2_cpu.yaml", "zero3_cpu.yaml"])
def test_two_process_kill_and_resume_is_exact(tmp_path, config):
    if config.startswith("zero"):
        pytest.importorskip("deepspeed")
    full, resumed, ckpt = tmp_path / "full", tmp_path / "resumed", tmp_path / "ckpt"
    launch(config, "--out", str(full), *ARGS)
    launch(config, "--out", str(tmp_path / "never"), "--ckpt", str(ckpt), "--save_at", K, *ARGS)
    assert (ckpt / f"checkpoint-{K}" / "COMPLETE").exists()
    assert (ckpt / f"checkpoint-{K}" / "model" / "model.safetensors").exists()  # full weights
    launch(config, "--out", str(resumed), "--ckpt", str(ckpt), "--resume", *ARGS)
    for a, b in zip(read_ranks(full, 2), read_ranks(resumed, 2)):
        _assert_same_state(a, b)
