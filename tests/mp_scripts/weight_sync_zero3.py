"""Walk the weight-sync buckets of a ZeRO-3 partitioned tiny model on every rank; launched by
``tests/lm/engines/test_vllm.py`` through ``accelerate launch --config_file zero3_cpu.yaml``.

Writes ``rank<r>.json`` into ``--out``: the engine names in push order, the largest
difference to the full (unsharded) weights, and per bucket the number of elements gathered
at that moment (must be the bucket's own, never the whole model).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for lm_fixtures

from lm_fixtures import tiny_model, tiny_tokenizer  # noqa: E402

from lmselfplay.lm.engines.weight_sync import iter_weight_buckets, weight_metadata  # noqa: E402
from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max_bytes", type=int, default=20_000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = tiny_model(seed=0)
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = PolicyTrainer(model, tiny_tokenizer(), TrainerConfig(beta=0.0))
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    params = list(trainer.unwrapped.parameters())
    assert all(hasattr(p, "ds_id") for p in params), "not partitioned"
    names, gathered, bucket_numel, err = [], [], [], 0.0
    for bucket in iter_weight_buckets(trainer.model, max_bytes=args.max_bytes):
        live = sum(p.ds_numel for p in params if p.ds_status == ZeroParamStatus.AVAILABLE)
        gathered.append(int(live))
        bucket_numel.append(int(sum(t.numel() for _, t in bucket)))
        for n, t in bucket:
            names.append(n)
            err = max(err, float((t.float() - full[n]).abs().max()))
    meta = weight_metadata(trainer.model)
    acc = trainer.accelerator
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{acc.process_index}.json").write_text(json.dumps({
        "world": acc.num_processes, "names": names, "max_abs_err": err, "gathered": gathered,
        "bucket_numel": bucket_numel, "full_numel": int(sum(p.ds_numel for p in params)),
        "meta_shapes": {n: s for n, _, s in meta}, "full_shapes": {n: list(t.shape) for n, t in full.items()},
        "released_after": all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in params)}))
    acc.wait_for_everyone()


if __name__ == "__main__":
    main()
