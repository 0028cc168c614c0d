"""The training side of debate (``recipes/debate.py``'s steps 0-5 and 7):

* :func:`task_sets` — step 0: the eval set and a train pool without any of its questions;
* :func:`debate_plan` — step 1: each step's tasks and seeds, drawn from (seed, step, rank) so a
  resumed run plays the same debates; the debates themselves run when the plan's play is called;
* :func:`debate_samples` — steps 3-4: one trainer sample per speech, reward 2 P(own option) - 1
  (zero-sum), advantage against the EMA baseline of (true / false side, round);
* :func:`step_row` — the step's log row;
* :class:`Debate` — what the loop works on; :func:`load_state` — step 7's checkpoint, restored.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass

import numpy as np

from lmselfplay.debate.judge import side_rewards
from lmselfplay.debate.protocols import Transcript, run_protocol
from lmselfplay.debate.tasks import make_tasks
from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.advantages import RoleBaselines
from lmselfplay.rl.trainer import PolicyTrainer


def task_sets(cfg):
    """Step 0: the eval set and a train pool without any of its questions."""
    kw = dict(reasoning_gym_names=cfg.debate.reasoning_gym_datasets, dataset_path=cfg.debate.dataset_path)
    eval_set = make_tasks(cfg.debate.task_families, cfg.debate.eval_tasks, cfg.run.seed + 10_000, **kw)
    seen = {(t.question, t.context) for t in eval_set}
    pool = [t for t in make_tasks(cfg.debate.task_families, cfg.debate.train_tasks, cfg.run.seed, **kw)
            if (t.question, t.context) not in seen]
    if not pool or not eval_set:
        raise ValueError(f"no tasks: {len(pool)} train, {len(eval_set)} eval from families {cfg.debate.task_families!r}")
    return pool, eval_set


def debate_plan(cfg, pool, engine, tok, sampling, process_index):
    """``step -> play``: the step's tasks and seeds are drawn in the caller (seeded by seed,
    step, rank: resumable); ``play()`` holds the debates."""
    def at(step):
        rng = random.Random(f"{cfg.run.seed}/{step}/{process_index}")
        tasks = [rng.choice(pool) for _ in range(cfg.debate.debates_per_step)]
        sp = dataclasses.replace(sampling, seed=rng.randrange(2**31))
        seed = rng.randrange(2**31)
        return lambda: run_protocol(tasks, "debate", engine, tok, cfg.protocol, sp, seed=seed)
    return at


def debate_samples(transcripts: list[Transcript], judgments, baselines: RoleBaselines, version: int):
    """Steps 3-4: one Sample per speech; reward 2 P(own option) - 1; advantage against the
    baseline of (true / false side, round)."""
    rows = []  # (speech, role, reward)
    for tr, j in zip(transcripts, judgments):
        rewards = side_rewards(tr, j)
        for s in tr.speeches:
            side = "true" if tr.side_is_correct(s.speaker) else "false"
            rows.append((s, f"debate/{side}/round{s.round}", rewards[s.speaker], tr.task.family))
    adv = baselines.advantages([r[1] for r in rows], [r[2] for r in rows])
    return [Sample(s.prompt_ids, s.completion_ids, s.logprobs, float(a), float(r), role, fam,
                   version if s.version is None else s.version) for (s, role, r, fam), a in zip(rows, adv)]


def step_row(trs, js, metrics, baselines, stale, t0) -> dict:
    """The step's log row: the trainer's metrics, the judge's accuracy on the step's debates, the
    true side's mean reward, the mean speech length, every baseline and the staleness counts."""
    speeches = [s for tr in trs for s in tr.speeches]
    return {**{f"train/{k}": v for k, v in metrics.items()},
            "train/judge_accuracy": float(np.mean([j.correct for j in js])),
            "train/true_side_reward": float(np.mean([2 * j.p_correct - 1 for j in js])),
            "train/speech_tokens": float(np.mean([len(s.completion_ids) for s in speeches])),
            **{f"baseline/{k}": v for k, v in baselines.values.items()}, **stale, "wall_s": time.time() - t0}


@dataclass
class Debate:
    """What the loop works on, built once by the recipe's ``make_debate`` (a resume then restores it)."""

    pool: list
    eval_set: list
    tok: object
    judge: object
    trainer: PolicyTrainer
    engine: object  # cfg.engine: hf | vllm | vllm-server
    baselines: RoleBaselines
    table: dict  # "step N" -> protocol -> metrics, one entry per evaluation


def load_state(d: Debate, extra: dict) -> None:
    """What the checkpoint saved besides the trainer: baselines and the accuracy table. The
    engine keeps the version of the weights it was built with, so the first ``serving`` of the
    resumed run pushes the restored ones (a server still holds what it loaded)."""
    d.baselines.load_state_dict(extra["baselines"])
    d.table.update(extra["table"])
