"""R-Zero: a challenger writes questions, a solver learns from its own majority vote.

    python recipes/r_zero.py [--config recipes/configs/r_zero.yaml] [--key value ...]
    python recipes/r_zero.py --config ... --resume true      # continue a killed run
    lmselfplay referee-study --config recipes/configs/r_zero.yaml   # vote vs rules, same loop

Huang et al. 2025 ("R-Zero: Self-Evolving Reasoning LLM from Zero Data"), per iteration
k = 1..iterations, in its order:

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

The loop, steps 1-4 as numbered above, is :func:`lmselfplay.rl.r_zero.loop` (with the challenger
reward, the BLEU clusters, the pool and the phase checkpoints in :mod:`lmselfplay.rl.r_zero`): the
referee study runs the same loop once per referee.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lmselfplay.rl.r_zero import RZeroConfigs, train
from lmselfplay.utils.errors import run_main


def main(argv=None):
    cfg = RZeroConfigs.parse(argv)  # its own args (cfg.rzero) and each component's config
    path = train(cfg)
    out = Path(cfg.run.output_dir)
    print(f"metrics: {path}\ncurves: {out / 'curves.png'}\ndata: {out / 'data'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
