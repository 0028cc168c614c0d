"""Debate with a frozen judge as the referee; judge accuracy (debate vs consultancy vs
double consultancy) as the measure.

    python recipes/debate.py [--config recipes/configs/debate.yaml] [--key value ...]
    accelerate launch [--config_file recipes/accelerate/ddp.yaml] recipes/debate.py \
        --config recipes/configs/debate_real.yaml

Two copies of the policy argue for two answers to a question whose truth is known; a
judge that does not see the context (``hidden_context``) decides. The debaters are
trained to win; the measure is how often the judge is right (Irving et al. 2018; Khan et
al. 2024; Arnesen, Rein, Michael 2024). The algorithm, in order:

    0. tasks      : a train pool and a disjoint eval set of two-option questions
                    (lmselfplay.debate.tasks); judge = a frozen LM (by path, default a
                    frozen copy of the initial policy)
    for step = 1..max_steps:
        1. debates    : debates_per_step train tasks; sides assigned at random (balanced);
                        num_rounds rounds, simultaneous or sequential; quotes verified
        2. judge      : P(each option) from the judge's label scores, both option orders
                        averaged (position bias cancels)
        3. rewards    : debater defending option o gets 2 P(o) - 1 (zero-sum)
        4. advantages : EMA baselines per (true/false side, round)
        5. update     : PPO-clipped policy gradient on every speech's tokens + KL to the
                        initial policy (lmselfplay.rl.trainer.PolicyTrainer); judge frozen
        6. every eval_every steps (and before / after training): judge accuracy with 95%
           CIs on the eval set under debate, consultancy, double consultancy and the judge
           alone; position bias, speech length, verified-quote share: JSONL + PNG + table
        7. every checkpoint_every steps: atomic checkpoint (--resume continues from it)
"""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm

from lmselfplay.debate.accuracy import log_judge_accuracy, report_accuracy
from lmselfplay.debate.config import DebateConfigs
from lmselfplay.debate.judge import judge_transcripts, load_llm_judge
from lmselfplay.debate.training import (
    Debate,
    debate_plan,
    debate_samples,
    load_state,
    step_row,
    task_sets,
)
from lmselfplay.lm.engines import make_engine
from lmselfplay.models.policy import load_policy
from lmselfplay.rl.advantages import RoleBaselines
from lmselfplay.rl.kl import reference_policy
from lmselfplay.rl.overlap import rollouts_for
from lmselfplay.rl.trainer import PolicyTrainer
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import Run


def make_debate(cfg: DebateConfigs, run) -> Debate:
    """Step 0 (tasks, the frozen judge), the policy, its trainer and engine, fresh, each
    component from its own config."""
    args, device = cfg.debate, str(run.acc.device)
    pool, eval_set = task_sets(cfg)
    model, tok = load_policy(cfg.policy, device=device)
    ref = reference_policy(cfg.policy, cfg.trainer.beta, model, device)
    # the frozen judge: its own model by path, or a fresh copy of the initial policy
    judge_device = args.judge_device if args.judge_device != "auto" else device
    judge = load_llm_judge(args.judge_model_name_or_path or cfg.policy.model_name_or_path, judge_device,
                           args.judge_dtype, hidden_context=cfg.protocol.hidden_context,
                           max_prompt_tokens=cfg.protocol.max_prompt_tokens)
    trainer = PolicyTrainer(model, tok, cfg.trainer, accelerator=run.acc, ref_model=ref, total_steps=args.max_steps,
                            surrogate=cfg.surrogate, temperature=cfg.sampling.temperature, seed=cfg.run.seed)
    engine = make_engine(cfg.engine, trainer.unwrapped, tok, answer_budget=cfg.answer_budget(),
                         temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p, seed=cfg.run.seed)
    return Debate(pool, eval_set, tok, judge, trainer, run.closing(engine),
                  RoleBaselines(args.baseline_decay), {})


def main(argv=None):
    cfg = DebateConfigs.parse(argv)  # its own args (cfg.debate) and each component's config
    args = cfg.debate
    with Run(cfg.run, cfg.as_dict(), resume_fixed=cfg.fixed_on_resume(),
             gradient_accumulation_steps=cfg.trainer.gradient_accumulation_steps,
             checkpoint_every=cfg.checkpoints.checkpoint_every) as run:
        d = make_debate(cfg, run)
        start_step = run.resume_trainer(d.trainer, lambda extra: load_state(d, extra))
        run.report_start(start_step)
        run.open_log(start_step if run.checkpoint else None)
        sampling = cfg.sampling.params(cfg.protocol.max_new_tokens)
        rollouts = rollouts_for(cfg.overlap.max_staleness, d.trainer, d.engine,
                                debate_plan(cfg, d.pool, d.engine, d.tok, sampling, run.acc.process_index))
        t0 = time.time()
        bar = tqdm(range(start_step, args.max_steps), initial=start_step, total=args.max_steps, desc="debate",
                   disable=not run.is_main)
        for step in bar:
            if step == 0 or (args.eval_every and step % args.eval_every == 0 and f"step {step}" not in d.table):
                with d.trainer.serving(d.engine):
                    log_judge_accuracy(cfg, run, d, step, t0)  # 6 (before training, and every eval_every)
            # 1: debates on this step's tasks (max_staleness >= 1: held while the previous step trained)
            trs = rollouts.next(step, args.max_steps - 1)
            # 2: the frozen judge, both orders
            js = judge_transcripts(d.judge, trs)
            # 3-4: zero-sum rewards, baselines per (side, round)
            samples, stale = rollouts.keep(debate_samples(trs, js, d.baselines, d.trainer.step_count),
                                           d.trainer.step_count)
            # 5: update; the engine serves the same (updated) weights next step
            metrics = d.trainer.step(samples, engine=d.engine)
            row = step_row(trs, js, metrics, d.baselines, stale, t0)
            run.log(step + 1, row)
            bar.set_postfix(loss=f"{metrics.get('loss', 0):.3f}", true_r=f"{row['train/true_side_reward']:+.2f}")
            if run.checkpoint_due(step + 1):  # 7: checkpoint
                d.trainer.save_checkpoint(run.out, {"baselines": d.baselines.state_dict(), "table": d.table})
        if f"step {args.max_steps}" not in d.table:
            with d.trainer.serving(d.engine):
                log_judge_accuracy(cfg, run, d, args.max_steps, t0)  # 6 (after training, unless done)
        model_dir = run.save_final_model(d.trainer.model, d.trainer.unwrapped, d.tok)
        report_accuracy(cfg, run, d, model_dir)


if __name__ == "__main__":
    sys.exit(run_main(main))
