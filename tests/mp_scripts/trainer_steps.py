"""Run a few PolicyTrainer steps on the tiny model; launched by the multi-process and
resume tests (``python`` for one process, ``accelerate launch --config_file ...`` for
several).

Every rank builds the same seeded model and the same global batch per step (a pure
function of ``--seed`` and the step index), computes RAE advantages on the whole batch
(so the baselines agree across ranks), and trains on its own slice ``batch[rank::world]``
— the ranks really share the work. All completions have the same length, so every rank
holds the same number of tokens and the DDP mean of per-rank token-mean gradients equals
the single-process token-mean gradient over the union.

With ``--targets`` every sample also carries a supervised target (a distribution over a few
tokens at one completion position, ``Sample.target``) and advantage 0, so with ``--beta 0``
the supervised-target cross-entropy is the whole loss.

Writes into ``--out``: ``rank<r>.json`` (world size, rank, distributed type, sharding
facts, metrics) and ``rank<r>.pt`` (full parameters gathered on every rank, baselines,
optimizer-state fingerprint and, without DeepSpeed, the gradients of the first optimizer
step as the optimizer saw them: after the ranks' all-reduce, after clipping). With ``--save_at k`` it checkpoints after step k and then
SIGKILLs itself (single process) or stops (several processes); ``--resume`` continues
from the latest checkpoint in ``--ckpt``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for lm_fixtures

from lm_fixtures import tiny_model, tiny_tokenizer  # noqa: E402

from lmselfplay.lm.batching import token_logprobs  # noqa: E402
from lmselfplay.lm.trajectory import Sample, role_key  # noqa: E402
from lmselfplay.rl.advantages import RoleBaselines  # noqa: E402
from lmselfplay.rl.distributed import read_full  # noqa: E402
from lmselfplay.rl.trainer import PolicyTrainer, TargetLossConfig, TrainerConfig  # noqa: E402
from lmselfplay.utils.checkpoint import latest_checkpoint  # noqa: E402

COMPLETION_LEN = 3


def global_batch(seed: int, step: int, n: int, vocab: int) -> list[tuple[list[int], list[int], float, str]]:
    """(prompt, completion, return, role) for every sample of one step, rank-independent."""
    rng = random.Random(seed * 1_000_003 + step)
    out = []
    for i in range(n):
        prompt = [1] + [rng.randrange(3, vocab) for _ in range(rng.randrange(3, 7))]
        completion = [rng.randrange(3, vocab) for _ in range(COMPLETION_LEN - 1)] + [2]
        out.append((prompt, completion, rng.choice([-1.0, 1.0]), role_key("nim", i % 2)))
    return out


def global_targets(seed: int, step: int, n: int, vocab: int) -> list[tuple[int, list[int], list[float]]]:
    """A ``Sample.target`` per sample of one step, rank-independent: (completion index,
    3 distinct token ids, their probabilities)."""
    rng = random.Random(seed * 7_000_003 + step)
    out = []
    for _ in range(n):
        w = [rng.random() + 0.1 for _ in range(3)]
        out.append((rng.randrange(COMPLETION_LEN), rng.sample(range(3, vocab), 3), [x / sum(w) for x in w]))
    return out


def capture_first_gradients(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    """Filled with every parameter's gradient at the first optimizer step (a pre-step hook
    on the torch optimizer inside accelerate's wrapper: DDP has all-reduced by then)."""
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    names = {id(p): n for n, p in trainer.unwrapped.named_parameters()}
    grads: dict[str, torch.Tensor] = {}

    def hook(optimizer, args, kwargs):
        if not grads:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        grads[names[id(p)]] = p.grad.detach().float().cpu().clone()

    opt.register_step_pre_hook(hook)
    return grads


def behaviour_logprobs(trainer: PolicyTrainer, batch) -> list[list[float]]:
    """On-policy log-probs from the current weights (ZeRO-3: gathered, a collective)."""
    out = []
    with trainer.generation_model() as m, torch.no_grad():
        for prompt, completion, _, _ in batch:
            ids = torch.tensor([prompt + completion], device=trainer.accelerator.device)
            lp, _ = token_logprobs(m, ids, torch.ones_like(ids))
            out.append(lp[0, len(prompt) - 1 :].float().cpu().tolist())
    return out


def sharding(trainer: PolicyTrainer) -> dict[str, int]:
    """Parameter elements held locally vs in the full model (ZeRO-3 sets ``ds_numel``)."""
    full = local = 0
    for p in trainer.model.parameters():
        if hasattr(p, "ds_numel"):
            full += int(p.ds_numel)
            local += int(p.ds_tensor.numel())
        else:
            full += p.numel()
            local += p.numel()
    return {"full_numel": full, "local_numel": local}


def full_params(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    """Every parameter in full, on every rank (ZeRO-3 gathers; a collective)."""
    names = [n for n, _ in trainer.unwrapped.named_parameters()]
    params = list(trainer.unwrapped.parameters())
    if any(hasattr(p, "ds_numel") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {n: p.detach().float().cpu().clone() for n, p in zip(names, params)}
    return {n: p.detach().float().cpu().clone() for n, p in zip(names, params)}


def reference_check(trainer: PolicyTrainer) -> dict[str, Any]:
    """After a magnet move: does the (gathered) reference equal the (gathered) policy?"""
    if not trainer.magnet_step:
        return {}
    ref = trainer.reference_weights()
    policy = read_full(list(trainer.unwrapped.parameters()), trainer.deepspeed_stage == 3)
    return {"magnet_step": trainer.magnet_step,
            "reference_equals_policy": len(ref) == len(policy) and all(torch.equal(a, b) for a, b in zip(ref, policy)),
            "reference_numel": sum(t.numel() for t in ref)}


def optimizer_fingerprint(trainer: PolicyTrainer) -> dict[str, float]:
    """Sum of |Adam moments| on this rank and the LR: equal only if the optimizer
    and scheduler states were restored."""
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    opt = getattr(opt, "optimizer", opt)  # DeepSpeed ZeRO wraps the torch optimizer
    m1 = m2 = 0.0
    steps = []
    for st in opt.state.values():
        if "exp_avg" in st:
            m1 += float(st["exp_avg"].abs().sum())
            m2 += float(st["exp_avg_sq"].abs().sum())
        if "step" in st:
            steps.append(float(st["step"]))
    return {"exp_avg": m1, "exp_avg_sq": m2, "adam_step": max(steps) if steps else 0.0,
            "lr": float(trainer.scheduler.get_last_lr()[0])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8, help="global samples per step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num_iterations", type=int, default=1)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--ref_update_every", type=int, default=0)
    ap.add_argument("--warmup_steps", type=int, default=0)
    ap.add_argument("--gradient_accumulation_steps", type=int, default=1)
    ap.add_argument("--only_rank0_data", action="store_true", help="train on batch[0::2] alone")
    ap.add_argument("--targets", action="store_true", help="supervised targets, advantage 0")
    ap.add_argument("--ckpt", default=None)
    ap.add_argument("--save_at", type=int, default=None)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)

    tok = tiny_tokenizer()
    model = tiny_model(seed=args.seed)
    cfg = TrainerConfig(learning_rate=args.lr, beta=args.beta, num_iterations=args.num_iterations,
                        gradient_accumulation_steps=args.gradient_accumulation_steps,
                        merge_identical=False, warmup_steps=args.warmup_steps,
                        lr_scheduler_type="linear", ref_update_every=args.ref_update_every)
    trainer = PolicyTrainer(model, tok, cfg, total_steps=100, target_loss=TargetLossConfig() if args.targets else None,
                            seed=args.seed)
    acc = trainer.accelerator
    rank, world = acc.process_index, acc.num_processes
    baselines = RoleBaselines(decay=0.5)
    if args.resume:
        ckpt = latest_checkpoint(args.ckpt)
        assert ckpt is not None, f"no checkpoint in {args.ckpt}"
        extra = trainer.load_checkpoint(ckpt)
        baselines.load_state_dict(extra["baselines"])
    before = full_params(trainer)
    grads = capture_first_gradients(trainer) if trainer.deepspeed_stage < 0 else {}
    metrics = {}
    while trainer.step_count < args.steps:
        batch = global_batch(args.seed, trainer.step_count, args.batch, len(tok))
        adv = baselines.advantages([b[3] for b in batch], [b[2] for b in batch])
        stride, offset = (2, 0) if args.only_rank0_data else (world, rank)
        mine = list(range(offset, len(batch), stride))
        lps = behaviour_logprobs(trainer, [batch[i] for i in mine])
        samples = [Sample(batch[i][0], batch[i][1], lp, advantage=float(adv[i]), reward=batch[i][2],
                          role=batch[i][3]) for i, lp in zip(mine, lps)]
        if args.targets:
            targets = global_targets(args.seed, trainer.step_count, args.batch, len(tok))
            for i, s in zip(mine, samples):
                s.target, s.advantage = targets[i], 0.0
        metrics = trainer.step(samples)
        if args.save_at is not None and trainer.step_count == args.save_at:
            trainer.save_checkpoint(args.ckpt, extra={"baselines": baselines.state_dict()})
            if world == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # a hard kill, right after the save
            return
    after = full_params(trainer)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = {"rank": rank, "world_size": world, "distributed_type": str(acc.distributed_type),
            "backend": str(acc.state.backend), "step_count": trainer.step_count,
            "changed": any(not torch.equal(before[k], after[k]) for k in after),
            "metrics": metrics, "optimizer": optimizer_fingerprint(trainer), **sharding(trainer),
            **reference_check(trainer)}
    torch.save({"params": after, "baselines": baselines.state_dict(), "grads": grads}, out / f"rank{rank}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps(info, indent=1))
    # an explicit teardown: left to interpreter exit, a ZeRO-3 rank was once seen to abort
    # ("terminate called without an active exception") after writing all of the above
    acc.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)  # two ranks share the cores
    main()
