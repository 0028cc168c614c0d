"""The multi-node layout on one CPU machine: 2 trainer ranks (gloo, `accelerate launch`) and 2
simulated `vllm serve` processes (their URLs in ``--urls``), one config. Each step every rank
serves the learner's weights (rank 0 pushes to every server, all ranks walk the buckets), samples
its own prompts, trains. Before step ``--fail_push_at`` rank 0 makes the first server fail its
weight load: it must leave the rotation on every rank. Writes ``rank<r>.json``."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for lm_fixtures

from lm_fixtures import tiny_model, tiny_tokenizer  # noqa: E402
from sim_server import SimHTTPChannel  # noqa: E402

from lmselfplay.lm.engines.base import SamplingParams  # noqa: E402
from lmselfplay.lm.engines.vllm_server import VLLMServerEngine  # noqa: E402
from lmselfplay.lm.trajectory import Sample  # noqa: E402
from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig  # noqa: E402


def post(url: str, path: str, obj: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(obj).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--urls", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fail_push_at", type=int, default=2)
    args = ap.parse_args()
    urls = args.urls.split(",")
    tok = tiny_tokenizer()
    trainer = PolicyTrainer(tiny_model(seed=0), tok, TrainerConfig(num_iterations=1, beta=0.0, learning_rate=1e-2,
                                                                   merge_identical=False))
    rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
    engine = VLLMServerEngine(tok, urls, timeout=30, backoff=0.05, push_timeout=60,
                              channel_factory=lambda url, i: SimHTTPChannel(url), version=-1)
    record = {"rank": rank, "world": world, "steps": []}
    for step in range(args.steps):
        if step == args.fail_push_at and rank == 0:
            post(urls[0], "/sim/faults", {"fail_push": True})
        if rank == 1:
            time.sleep(0.2)  # the ranks drift: rank 1 reaches the push late, then samples at once
        with trainer.serving(engine):
            outs = engine.generate([[5, 6, 7, 10 + 4 * rank + k] for k in range(4)],
                                   SamplingParams(max_new_tokens=3, temperature=1.0, seed=step))
        record["steps"].append({"versions": sorted({o.version for o in outs}),
                                "in_rotation": [s.in_rotation for s in engine.pool.servers],
                                "server_versions": [s.version for s in engine.pool.servers]})
        trainer.step([Sample(o.prompt_ids, o.token_ids, o.logprobs, advantage=(-1.0) ** k, policy_version=o.version)
                      for k, o in enumerate(outs)], engine=engine)
    record["engine_version"] = engine.version
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(record))
    trainer.accelerator.wait_for_everyone()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
