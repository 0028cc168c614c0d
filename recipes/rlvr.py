"""RL with verifiable rewards (RLVR) on a fixed task set: the positive control.

    python recipes/rlvr.py [--config recipes/configs/rlvr.yaml] [--key value ...]
    python recipes/rlvr.py --config ... --task reasoning_gym:chain_sum --task_config '{"max_terms": 3}'
    python recipes/rlvr.py --config ... --task jsonl:my_questions.jsonl
    python recipes/rlvr.py --config ... --resume true          # continue a killed run

GRPO (Shao et al. 2024, DeepSeekMath) with the rules as the referee: the same trainer, engine
and advantages as the self-play recipes, on questions whose answers are known. What a language
recipe's self-generated or vote-grounded rewards must be measured against: the third arm of the
referee study (fixed data + rules; R-Zero is self-generated + rules, and self-generated + vote).

    for step = 1..max_steps:
        1. questions : prompts_per_step training items of the task set (a stream seeded by
                       seed and step that never draws a held-out item)
        2. sample    : G = num_generations answers per question from the current policy
        3. reward    : r = 1 when the item's own checker accepts the final answer, else 0
                       (arithmetic: math equivalence with the known answer; program: the printed
                       value; reasoning_gym: the task's score_answer; jsonl: the given answer)
        4. advantage : A_i = (r_i - mean(r_group)) / std(r_group)   (scale_rewards false: no std);
                       advantage reward: A_i = r_i (REINFORCE without a baseline)
        5. update    : num_iterations passes of the PPO-clipped surrogate
                       min(rho A, clip(rho, 1 - epsilon, 1 + epsilon) A) - beta KL(pi || pi_ref),
                       token-mean over the batch (lmselfplay/rl/trainer.py)
        6. every eval_every steps and at the end: greedy accuracy on the held-out items with a
           95% Wilson interval (eval/heldout/accuracy, .../ci_low, .../ci_high, per family);
           JSONL + TensorBoard + curves.png; every checkpoint_every steps an atomic checkpoint
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from lmselfplay.lm.engines import make_engine
from lmselfplay.models.policy import load_policy
from lmselfplay.rl.kl import reference_policy
from lmselfplay.rl.trainer import PolicyTrainer
from lmselfplay.rlvr.config import RLVRConfigs
from lmselfplay.rlvr.metrics import heldout_accuracy, plot, print_final
from lmselfplay.rlvr.steps import (
    advantages_of,
    generate,
    group_stats,
    make_task_set,
    samples_of,
    sampling,
)
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import Run
from lmselfplay.verifiers.task_referee import TaskReferee


def train(cfg: RLVRConfigs) -> Path:
    """Run the positive control with ``cfg``; returns the metrics JSONL path."""
    args = cfg.rlvr
    tasks = make_task_set(cfg)  # a bad task, file or setting: one line, before the model loads
    with Run(cfg.run, cfg.as_dict(), resume_fixed=cfg.fixed_on_resume(),
             gradient_accumulation_steps=cfg.trainer.gradient_accumulation_steps,
             checkpoint_every=cfg.checkpoints.checkpoint_every) as run:
        acc = run.acc
        model, tok = load_policy(cfg.policy, device=str(acc.device))
        trainer = PolicyTrainer(model, tok, cfg.trainer, accelerator=acc, total_steps=args.max_steps,
                                ref_model=reference_policy(cfg.policy, cfg.trainer.beta, model, str(acc.device)),
                                surrogate=cfg.surrogate, temperature=cfg.sampling.temperature, seed=cfg.run.seed)
        engine = run.closing(make_engine(cfg.engine, trainer.unwrapped, tok, answer_budget=args.max_new_tokens,
                                         temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                                         seed=cfg.run.seed))
        referee = run.closing(TaskReferee(timeout_s=args.check_timeout_s))
        start = run.resume_trainer(trainer, lambda extra: None)  # the task stream is seeded by the step
        run.report_start(start)
        logger = run.open_log(start if run.checkpoint else None)

        def evaluate(step: int) -> dict[str, float]:  # 6
            with trainer.serving(engine):
                row = heldout_accuracy(engine, tok, referee, tasks.heldout, sampling(cfg, -1, acc.process_index, greedy=True))
            run.log(step, {**row, "wall_s": time.time() - t0})
            return row

        t0 = time.time()
        first = evaluate(start) if start == 0 else {}
        bar = tqdm(range(start, args.max_steps), initial=start, total=args.max_steps, desc="rlvr",
                   disable=not run.is_main)
        for step in bar:
            items = [t for t in tasks.training_batch(step, args.prompts_per_step)  # 1
                     for _ in range(args.num_generations)]
            with trainer.serving(engine):
                version = engine.version
                completions = generate(engine, tok, items, sampling(cfg, step, acc.process_index))  # 2
            verdicts = referee.score(items, [c.text for c in completions])  # 3
            rewards = np.array([v.reward for v in verdicts])
            advantages = advantages_of(rewards.reshape(-1, args.num_generations), args)  # 4
            metrics = trainer.step(samples_of(completions, advantages, rewards, items, version), engine=engine)  # 5
            stats = group_stats(rewards.reshape(-1, args.num_generations))
            run.log(step + 1, {**metrics, **stats, "wall_s": time.time() - t0})
            bar.set_postfix(reward=f"{stats['train/reward']:.2f}")
            if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.max_steps:
                evaluate(step + 1)
            if run.checkpoint_due(step + 1):
                trainer.save_checkpoint(run.out)
        last = evaluate(args.max_steps)
        model_dir = run.save_final_model(trainer.model, trainer.unwrapped, tok)
        if run.is_main:
            plot(logger)
            print_final(first, last, logger, model_dir)
        return run.out / "metrics.jsonl"


def main(argv=None):
    cfg = RLVRConfigs.parse(argv)  # its own args (cfg.rlvr) and each component's config
    train(cfg)


if __name__ == "__main__":
    sys.exit(run_main(main))
