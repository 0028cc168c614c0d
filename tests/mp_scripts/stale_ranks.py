"""Two gloo ranks, two trainer steps, each with rank 0's sampled rollouts all too old and rank
1's fresh, so rank 0 trains on nothing: the first step counts per rank, the second sums the
counts over the ranks (``drop_stale`` with ``rank_sum_of``). Writes ``rank<r>.json``: what
each rank kept, the counts, and whether the parameters are finite and equal across ranks."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for lm_fixtures

import torch  # noqa: E402
from lm_fixtures import tiny_model, tiny_tokenizer  # noqa: E402
from trainer_steps import full_params  # noqa: E402

from lmselfplay.lm.trajectory import Sample  # noqa: E402
from lmselfplay.rl.overlap import drop_stale, rank_sum_of  # noqa: E402
from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    trainer = PolicyTrainer(tiny_model(seed=0), tiny_tokenizer(), TrainerConfig(num_iterations=1, beta=0.1,
                                                                                learning_rate=1e-2))
    acc = trainer.accelerator
    rank = acc.process_index
    record = {"rank": rank, "world": acc.num_processes, "steps": []}
    for summed in (False, True):
        version = trainer.step_count + 3
        made = [Sample([5, 6, 7], [10 + k, 11], [-1.0, -1.0], advantage=(-1.0) ** k,
                       policy_version=version - (3 if rank == 0 else 0)) for k in range(3)]
        kept, stale = drop_stale(made, version, 1, rank_sum_of(acc) if summed else None)
        metrics = trainer.step(kept)
        # in full (under ZeRO-3 the local tensors are empty placeholders: they would always agree)
        flat = torch.cat([p.flatten() for p in full_params(trainer).values()])
        gathered = acc.gather(flat.unsqueeze(0))
        loss = metrics.get("loss")
        finite = bool(torch.isfinite(flat).all()) and (loss is None or math.isfinite(loss))
        record["steps"].append({"summed": summed, "kept": len(kept), "stale": stale, "loss": loss,
                                "finite": finite, "numel": flat.numel(),
                                "ranks_equal": bool(torch.equal(gathered[0], gathered[-1]))})
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
