"""R-Zero: a challenger writes questions, a solver learns from its own majority vote.

    python recipes/r_zero.py [--config recipes/configs/r_zero.yaml] [--key value ...]
    python recipes/r_zero.py --config ... --resume true      # continue a killed run
    lmselfplay referee-study --config recipes/configs/r_zero.yaml   # vote vs rules, same loop

Huang et al. 2025 ("R-Zero: Self-Evolving Reasoning LLM from Zero Data"), per iteration
k = 1..rounds, in its order:

    1. challenger : challenger_steps times: the challenger writes num_questions questions
                    in a checkable form (task_form); the solver answers each m = num_answers
                    times; the referee gives p per question (vote: the agreement p-hat with
                    the majority; rules/executor: the true solve rate). Reward
                    1 - 2|p - 1/2| minus the repetition penalty lambda * |C|/N (C: the
                    question's cluster of near-duplicates by BLEU), clipped at 0; a
                    malformed question gets malformed_reward (below every other reward).
                    GRPO group advantages over questions from the same prompt; update.
    2. filter     : the challenger writes pool_size questions; the solver answers each m
                    times; the referee labels them; keep those whose referee votes are
                    filter_low..filter_high of m (and that are not held-out questions).
    3. solver     : solver_steps times: solver_batch kept questions, solver_group_size
                    answers each, reward 1 when an answer matches the referee's label (the
                    pseudo-label under the vote); GRPO group advantages; update.
    4. record     : the pool (questions, answers, labels, agreement, truth, kept) saved
                    with `datasets`; measures against the truth (label accuracy, reward
                    accuracy, difficulty, pass rate, diversity) and the solver's accuracy
                    on a fixed held-out set -> JSONL + TensorBoard + PNG. An atomic
                    checkpoint after every phase; --resume continues at the phase it was in.

The truth (rules / executor) is computed for every question so that the loop can be
measured; a vote-grounded loop never reads it. Challenger and solver are one policy in two
roles (default) or two copies of the base model (two_copies).

Engines: ``engine: hf | vllm | vllm-server`` (``make_engine``); with servers and two copies the
solver is served by ``vllm_server_urls`` and the challenger by ``challenger_vllm_server_urls``
(a server holds one model's weights). With ``max_staleness: k >= 1`` each training phase's next
step is generated while its current step trains (the challenger's questions with the solver's
answers to them; the solver's answers), and a sample more than k versions old is dropped; the
filter and the held-out evaluation always sample the current weights (docs/scale.md).

The loop below is steps 1-4 as numbered above; the run object, the challenger reward (the BLEU
clusters are :mod:`lmselfplay.rl.repetition`'s) and the phases are :mod:`lmselfplay.r_zero.steps`'s,
the pools and the phase checkpoints :mod:`lmselfplay.r_zero.checkpoints`'s, the measures
:mod:`lmselfplay.r_zero.metrics`'. The referee study runs :func:`train` once per referee.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

from tqdm.auto import tqdm

from lmselfplay.r_zero.checkpoints import (
    load_kept,
    phase_dirs,
    pool_dir,
    resume,
    save_final,
    save_phase,
    save_pool,
)
from lmselfplay.r_zero.config import RZeroConfigs
from lmselfplay.r_zero.metrics import heldout_accuracy, plot_run, pool_measures
from lmselfplay.r_zero.steps import (
    PHASES,
    RZero,
    build_pool,
    challenger_plan,
    challenger_step,
    solver_plan,
    solver_step,
)
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import Run


def train(cfg: RZeroConfigs) -> Path:
    """Run R-Zero with ``cfg``, steps 1-4 for every iteration from where a resumed run stopped;
    returns the metrics JSONL path. The checker and sandbox processes end with it, also on error."""
    with Run(cfg.run, cfg.as_dict(), resume_fixed=cfg.fixed_on_resume(),
             gradient_accumulation_steps=cfg.trainer.gradient_accumulation_steps,
             checkpoints=phase_dirs) as run:
        rz = run.closing(RZero(cfg, run))
        acc, out = rz.acc, rz.out
        start_it, start_phase = resume(rz)
        resumed = run.checkpoint is not None
        logger = run.open_log(rz.global_step if resumed else None)
        log = run.log
        t0 = time.time()
        bar = tqdm(total=cfg.rzero.rounds * len(PHASES), initial=(start_it - 1) * len(PHASES) + start_phase,
                   desc=f"r-zero ({cfg.rzero.referee})", disable=not acc.is_main_process)
        try:
            if not resumed:
                log(0, {"iteration": 0, **heldout_accuracy(rz, 0), "wall_s": 0.0})
            for it in range(start_it, cfg.rzero.rounds + 1):
                first = start_phase if it == start_it else 0
                # 1: challenger phase
                if first <= 0:  # max_staleness >= 1: a step's questions are written while the previous one trains
                    with closing(rz.rollouts(rz.challenger, challenger_plan(rz, it), others=(rz.solver,))) as rollouts:
                        for step in range(cfg.rzero.challenger_steps):
                            log(rz.global_step + 1, {"iteration": it, **challenger_step(rz, rollouts, step)})
                    save_phase(rz, it, 0)
                    bar.update(1)
                # 2: filter; 4: the pool saved with `datasets`, its measures logged
                if first <= 1:
                    records = build_pool(rz, it)
                    save_pool(pool_dir(out, it, acc.process_index), records)
                    log(rz.global_step, {"iteration": it, **pool_measures(records),
                                         **{f"bad/{k}": v for k, v in rz.bad.items()},
                                         "checker_timeouts": rz.matcher.math.timeouts, "wall_s": time.time() - t0})
                    save_phase(rz, it, 1)
                    bar.update(1)
                # 3: solver phase on the kept questions and their labels
                kept = load_kept(pool_dir(out, it, acc.process_index))
                study = Counter()
                # every rank makes the same number of updates (collectives); alone, none without data
                with closing(rz.rollouts(rz.solver, solver_plan(rz, kept, it))) as rollouts:
                    for step in range(cfg.rzero.solver_steps if kept or acc.num_processes > 1 else 0):
                        row = solver_step(rz, rollouts, step)
                        study.update({k: row.get(k, 0) for k in ("study/n_rewards", "study/rewards_right")})
                        log(rz.global_step, {"iteration": it, **row})
                # 4: measures of the iteration, held-out accuracy, checkpoint
                log(rz.global_step, {"iteration": it, **heldout_accuracy(rz, it), "study/reward_accuracy_iteration":
                                     study["study/rewards_right"] / study["study/n_rewards"]
                                     if study["study/n_rewards"] else float("nan"), "wall_s": time.time() - t0})
                save_phase(rz, it, 2)
                bar.update(1)
                if logger:
                    plot_run(cfg.rzero, logger)
            save_final(rz)
        finally:
            bar.close()
        return out / "metrics.jsonl"


def main(argv=None):
    cfg = RZeroConfigs.parse(argv)  # its own args (cfg.rzero) and each component's config
    path = train(cfg)
    out = Path(cfg.run.output_dir)
    print(f"metrics: {path}\ncurves: {out / 'curves.png'}\ndata: {out / 'data'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
