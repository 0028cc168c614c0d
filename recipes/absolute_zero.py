"""Absolute Zero (Zhao et al. 2025): one policy proposes and solves code tasks; the
sandboxed Python executor is the referee. No external data.

    python recipes/absolute_zero.py --config recipes/configs/absolute_zero.yaml [--key value ...]
    accelerate launch --config_file recipes/accelerate/zero2.yaml recipes/absolute_zero.py \\
        --config recipes/configs/absolute_zero_qwen_coder.yaml

A task is (program, input, output) with one part hidden: deduction (predict the output),
abduction (find an input giving the output), induction (write the program from I/O pairs);
see :mod:`lmselfplay.verifiers.code_tasks`. Buffers (one per type) start from the identity
program and the project's generated programs.

The algorithm, in order (every rank runs its own proposals; gradients are averaged):

    for step = 1..max_steps:
        1. propose    : per task type, proposals_per_type programs + input(s), each prompt
                        showing `references` tasks sampled from that type's buffer
                        (proposal_style io: the program for one reference's I/O pair, the
                        task taking that reference's inputs - what the embedded model can do)
        2. validate   : one executor batch (two hash seeds): parses, runs inside the limits,
                        deterministic, JSON output. Invalid: invalid_penalty (format error:
                        format_penalty); valid: into the buffer (deduplicated by normalized AST)
        3. solve      : num_generations attempts per task (the step's valid tasks, topped up
                        from the buffer to solve_tasks_per_type), checked in one executor batch
        4. rewards    : solver 1 / 0 (format error: format_penalty); proposer learnability
                        0 if r_solve = 0 else 1 - r_solve over its task's attempts
        5. advantages : TRR++ - normalized within each (task type, role) bucket: six baselines
        6. update     : PPO clip + KL to the initial policy, proposer and solver samples in one
                        trainer step
        7. every eval_every steps: held-out accuracy per type on fixed generated tasks never
           trained on (95% Wilson CIs); JSONL + PNG + TensorBoard; every checkpoint_every
           steps an atomic checkpoint with the buffers (--resume continues exactly)

The engine comes from ``engine: hf | vllm | vllm-server`` (``make_engine``). With
``max_staleness: k >= 1`` (a vLLM engine or servers) steps 1-3 of step t + 1 run while step t
trains, and a proposal or attempt sampled more than k weight versions ago is dropped
(``staleness/dropped``, ``staleness/age``; docs/scale.md).

The steps the loop below calls (the numbered comments) are :mod:`lmselfplay.absolute_zero.steps`'s, the
evaluation (step 7) :mod:`lmselfplay.absolute_zero.metrics`'.
"""

from __future__ import annotations

import sys
import time

from accelerate.utils import gather_object
from tqdm.auto import tqdm

from lmselfplay.absolute_zero.config import AbsoluteZeroConfigs
from lmselfplay.absolute_zero.metrics import heldout_tasks, log_eval, print_final
from lmselfplay.absolute_zero.steps import (
    SharedReferee,
    load_buffers,
    rollout_plan,
    seed_buffers,
    train_step,
)
from lmselfplay.lm.engines import make_engine
from lmselfplay.models.policy import load_policy
from lmselfplay.rl.kl import reference_policy
from lmselfplay.rl.overlap import rollouts_for
from lmselfplay.rl.trainer import PolicyTrainer
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import Run
from lmselfplay.verifiers.code_tasks import CodeReferee, task_key


def main(argv=None):
    cfg = AbsoluteZeroConfigs.parse(argv)  # its own args (cfg.absolute_zero) and each component's config
    args = cfg.absolute_zero
    with Run(cfg.run, cfg.as_dict(), resume_fixed=cfg.fixed_on_resume(),
             gradient_accumulation_steps=cfg.trainer.gradient_accumulation_steps,
             checkpoint_every=cfg.checkpoints.checkpoint_every) as run:
        acc, out_dir = run.acc, run.out
        model, tok = load_policy(cfg.policy, device=str(acc.device))
        trainer = PolicyTrainer(model, tok, cfg.trainer, accelerator=acc, total_steps=args.max_steps,
                                ref_model=reference_policy(cfg.policy, cfg.trainer.beta, model, str(acc.device)),
                                surrogate=cfg.surrogate, temperature=cfg.sampling.temperature, seed=cfg.run.seed)
        engine = run.closing(make_engine(cfg.engine, trainer.unwrapped, tok, answer_budget=args.answer_budget(),
                                         temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                                         seed=cfg.run.seed))
        referee = SharedReferee(run.closing(CodeReferee(cfg.executor)))  # sandboxes end with the run
        heldout = heldout_tasks(cfg, referee)
        buffers = seed_buffers(cfg, referee, {task_key(t) for ts in heldout.values() for t in ts})
        start_step = run.resume_trainer(trainer, lambda extra: load_buffers(buffers, extra, acc.process_index))
        run.report_start(start_step)
        logger = run.open_log(start_step if run.checkpoint else None)
        # max_staleness >= 1: a step's rollouts are played while the previous step trains
        plan = rollout_plan(cfg, acc, engine, tok, referee, buffers, lambda step: run.checkpoint_due(step + 1))
        rollouts = run.closing(rollouts_for(cfg.overlap.max_staleness, trainer, engine, plan))  # closed (waited for) before the referee
        t0 = time.time()
        bar = tqdm(range(start_step, args.max_steps), initial=start_step, total=args.max_steps,
                   desc="absolute zero", disable=not run.is_main)
        for step in bar:
            resumed_here = run.checkpoint is not None and step == start_step  # evaluated before the kill
            if args.eval_every and step % args.eval_every == 0 and not resumed_here:
                with trainer.serving(engine):  # 7; every rank evaluates in step (ZeRO-3)
                    log_eval(cfg, acc, engine, tok, referee, heldout, logger, step, t0)
            ro = rollouts.next(step, args.max_steps - 1)  # 1-3
            row = train_step(cfg, acc, trainer, engine, ro, rollouts, step, out_dir)  # 4-6
            run.log(step + 1, {**row, "wall_s": time.time() - t0})
            bar.set_postfix(valid=f"{row['propose/valid_rate']:.2f}", solve=f"{row['solve/solve_rate']:.2f}")
            if run.checkpoint_due(step + 1):
                # every rank proposes its own tasks: one buffer set per rank, as this step left them
                trainer.save_checkpoint(out_dir, {"buffers": gather_object([ro.buffers])})
        with trainer.serving(engine):
            final = log_eval(cfg, acc, engine, tok, referee, heldout, logger, args.max_steps, t0)
        model_dir = run.save_final_model(trainer.model, trainer.unwrapped, tok)
        if run.is_main:
            print_final(final, logger, model_dir)


if __name__ == "__main__":
    sys.exit(run_main(main))
