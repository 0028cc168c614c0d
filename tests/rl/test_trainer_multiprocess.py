"""One PolicyTrainer optimizer step under 2-process DDP, DeepSpeed ZeRO-2 and ZeRO-3 on
CPU, launched with the shipped configs in ``recipes/accelerate/``.

Each rank trains on a different half of one global batch (``batch[rank::2]``, equal
token counts), with the PPO, clipping and KL-to-reference paths on. Then:

* both ranks see world size 2 and hold the same parameters after the step;
* those equal the single-process step on the union of the samples (data parallelism
  averages per-rank token means; with equal token counts that is the union's token
  mean) and differ from the single-process step on rank 0's half alone — so rank 1's
  samples moved the weights: the ranks really shared the work;
* ZeRO-2 splits the optimizer state (the ranks' Adam moments add up to the union's);
  ZeRO-3 splits the parameters themselves (each rank holds about half of them).

The launched script is ``tests/mp_scripts/trainer_steps.py``.
"""

from __future__ import annotations

import pytest
from mp_helpers import CONFIGS, identical, launch, max_diff, read_ranks, run_inprocess

STEP_ARGS = ("--steps", "1", "--beta", "0.1", "--batch", "8")


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """The same step in one process: on the union of the samples, and on rank 0's half."""
    union, half = tmp_path_factory.mktemp("union"), tmp_path_factory.mktemp("half")
    run_inprocess("--out", str(union), *STEP_ARGS)
    run_inprocess("--out", str(half), *STEP_ARGS, "--only_rank0_data")
    return read_ranks(union, 1)[0], read_ranks(half, 1)[0]


def _launch_step(config: str, out) -> list[dict]:
    launch(config, "--out", str(out), *STEP_ARGS)
    ranks = read_ranks(out, 2)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 for r in ranks)
    assert all(r["backend"] == "gloo" for r in ranks)
    assert all(r["changed"] for r in ranks)
    assert all(r["metrics"]["samples"] == 4 for r in ranks)  # each rank half of the 8
    return ranks


def _check_data_parallel_step(ranks: list[dict], single_process) -> None:
    union, half = single_process
    r0, r1 = ranks
    assert identical(r0["params"], r1["params"]), "ranks diverged after the step"
    assert max_diff(r0["params"], union["params"]) < 1e-5
    assert max_diff(r0["params"], half["params"]) > 1e-3  # rank 1's samples mattered
    # one scheduler step per optimizer step, as in one process
    assert all(r["optimizer"]["lr"] == pytest.approx(union["optimizer"]["lr"]) for r in ranks)
    assert union["metrics"]["samples"] == 8


@pytest.mark.multiprocess
def test_ddp_cpu_two_ranks_share_one_step(tmp_path, single_process):
    ranks = _launch_step("ddp_cpu.yaml", tmp_path)
    assert all(r["distributed_type"] == "DistributedType.MULTI_CPU" for r in ranks)
    _check_data_parallel_step(ranks, single_process)
    # plain DDP: every rank holds the whole model and the whole optimizer state
    assert all(r["local_numel"] == r["full_numel"] for r in ranks)
    for r in ranks:
        assert r["optimizer"]["exp_avg"] == pytest.approx(single_process[0]["optimizer"]["exp_avg"], rel=1e-4)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_zero2_cpu_step_shards_the_optimizer_state(tmp_path, single_process):
    pytest.importorskip("deepspeed")
    ranks = _launch_step("zero2_cpu.yaml", tmp_path)
    assert all(r["distributed_type"] == "DistributedType.DEEPSPEED" for r in ranks)
    _check_data_parallel_step(ranks, single_process)
    union_m = single_process[0]["optimizer"]["exp_avg"]
    assert all(0 < r["optimizer"]["exp_avg"] < union_m for r in ranks)
    assert sum(r["optimizer"]["exp_avg"] for r in ranks) == pytest.approx(union_m, rel=1e-4)


@pytest.mark.multiprocess
@pytest.mark.slow  # ~60 s; test_ddp_cpu_two_ranks_share_one_step keeps 2 ranks in the default run
def test_zero3_cpu_step_shards_the_parameters(tmp_path, single_process):
    pytest.importorskip("deepspeed")
    ranks = _launch_step("zero3_cpu.yaml", tmp_path)
    assert all(r["distributed_type"] == "DistributedType.DEEPSPEED" for r in ranks)
    _check_data_parallel_step(ranks, single_process)  # params gathered from the shards
    full = single_process[0]["full_numel"]
    for r in ranks:
        assert r["full_numel"] == full
        # this rank stores only its partition (about half; each tensor padded to split evenly)
        assert full / 2 <= r["local_numel"] < 0.6 * full


@pytest.mark.multiprocess
@pytest.mark.slow
def test_zero3_cpu_magnet_update_copies_the_gathered_policy(tmp_path):
    """Under ZeRO-3 the reference is a separate DeepSpeed engine: after a magnet move its
    gathered weights equal the gathered policy's, on both ranks, while each stays sharded."""
    pytest.importorskip("deepspeed")
    launch("zero3_cpu.yaml", "--out", str(tmp_path), "--steps", "2", "--beta", "0.1", "--batch", "8",
           "--ref_update_every", "2")
    ranks = read_ranks(tmp_path, 2)
    for r in ranks:
        assert r["magnet_step"] == 2 and r["reference_equals_policy"]
        assert r["reference_numel"] == r["full_numel"] and r["local_numel"] < 0.6 * r["full_numel"]


GPU_CONFIGS = {"ddp.yaml": (None, "MULTI_GPU"), "zero2.yaml": (2, "DEEPSPEED"), "zero3.yaml": (3, "DEEPSPEED")}


@pytest.mark.parametrize("config", sorted(GPU_CONFIGS) + [c.replace(".yaml", "_cpu.yaml") for c in GPU_CONFIGS])
def test_shipped_configs_parse(config):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(CONFIGS / config))
    stage, dist = GPU_CONFIGS[config.replace("_cpu", "")]
    assert str(cfg.distributed_type).endswith(dist)
    assert cfg.main_process_port == 0  # a free port: concurrent runs cannot clash
    if stage is not None:
        assert cfg.deepspeed_config["zero_stage"] == stage
        # left "auto": the trainer fills them from TrainerConfig
        assert not {"gradient_clipping", "gradient_accumulation_steps"} & set(cfg.deepspeed_config)
    if config.endswith("_cpu.yaml"):
        assert (cfg.num_processes, str(cfg.mixed_precision)) == (2, "no")
    else:
        assert str(cfg.mixed_precision) == "bf16"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(GPU_CONFIGS))
def test_gpu_configs_run_on_cpu_with_mixed_precision_off(tmp_path, config):
    """The GPU configs are valid: with 2 processes and ``--mixed_precision no`` (a CPU run computes
    in float32) they run here on CPU too."""
    if GPU_CONFIGS[config][0] is not None:
        pytest.importorskip("deepspeed")
    launch(config, "--out", str(tmp_path), *STEP_ARGS,
           launcher_args=("--num_processes", "2", "--mixed_precision", "no"))
    r0, r1 = read_ranks(tmp_path, 2)
    assert r0["world_size"] == r1["world_size"] == 2 and r0["changed"]
    assert identical(r0["params"], r1["params"])
    if config == "zero3.yaml":
        assert r0["local_numel"] < r0["full_numel"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_gpu_config_as_shipped_on_cpu_ends_with_the_mixed_precision_error(tmp_path):
    """Their bf16 on a CPU run is refused with the fix named, on every rank, not computed in bf16."""
    with pytest.raises(AssertionError) as failed:
        launch("ddp.yaml", "--out", str(tmp_path), *STEP_ARGS, launcher_args=("--num_processes", "2"))
    assert "mixed_precision bf16 on a CPU run" in str(failed.value)
    assert "set mixed_precision 'no' in the accelerate config" in str(failed.value)


@pytest.mark.multiprocess
@pytest.mark.gpu
@pytest.mark.parametrize("config", sorted(GPU_CONFIGS))
def test_gpu_configs_on_gpus(tmp_path, config):
    torch = pytest.importorskip("torch")
    n = torch.cuda.device_count()
    if n < (2 if config == "ddp.yaml" else 1):
        pytest.skip(f"{config} needs {'2 GPUs' if config == 'ddp.yaml' else 'a GPU'}, found {n}")
    if GPU_CONFIGS[config][0] is not None:
        pytest.importorskip("deepspeed")
    launch(config, "--out", str(tmp_path), *STEP_ARGS, launcher_args=("--num_processes", str(n)))
    ranks = read_ranks(tmp_path, n)
    assert all(r["world_size"] == n and r["changed"] for r in ranks)
    assert all(identical(ranks[0]["params"], r["params"]) for r in ranks)
