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

import dataclasses
import json
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from lmselfplay.debate.judge import judge_transcripts, load_llm_judge, side_rewards
from lmselfplay.debate.protocols import PROTOCOLS, ProtocolConfig, Transcript, run_protocol
from lmselfplay.debate.tasks import make_tasks
from lmselfplay.eval.debate_metrics import format_table, protocol_metrics
from lmselfplay.lm.engines import EngineConfig, SamplingParams, make_engine
from lmselfplay.lm.trajectory import Sample
from lmselfplay.models.policy import PolicyConfig, check_dtype, load_policy
from lmselfplay.rl.advantages import RoleBaselines
from lmselfplay.rl.overlap import rollouts_for
from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig, reference_policy
from lmselfplay.utils.checkpoint import atomic_write_text, save_json
from lmselfplay.utils.config import ConfigError, non_negative, parse_config, positive
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import PeriodicCheckpoints, Run, RunConfig


@dataclass
class DebateConfig(TrainerConfig, ProtocolConfig, PolicyConfig, EngineConfig, RunConfig, PeriodicCheckpoints):
    judge_model_name_or_path: str = field(default="", metadata={
        "help": "the judge (hub name or path); empty: a frozen copy of the initial policy"})
    judge_device: str = field(default="auto", metadata={"help": "auto | cpu | cuda | cuda:N"})
    judge_dtype: str = field(default="auto", metadata={"help": "auto | float32 | bfloat16 | float16"})
    task_families: str = field(default="arithmetic,programs", metadata={
        "help": "comma-separated: arithmetic, programs, reasoning_gym, dataset"})
    reasoning_gym_datasets: str = field(default="chain_sum,leg_counting", metadata={
        "help": "reasoning-gym dataset names (family reasoning_gym)"})
    dataset_path: str = field(default="", metadata={
        "help": "local json/jsonl/csv/parquet with question, context, correct, incorrect (family dataset)"})
    train_tasks: int = field(default=512, metadata={"help": "questions debated during training"})
    eval_tasks: int = field(default=64, metadata={"help": "held-out questions of every evaluation"})
    eval_protocols: str = field(default=",".join(PROTOCOLS), metadata={"help": "protocols evaluated: debate, consultancy, double_consultancy, none"})
    max_steps: int = field(default=30, metadata={"help": "training steps (each one trainer.step())"})
    debates_per_step: int = field(default=16, metadata={"help": "debates per training step"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling of speeches"})
    baseline_decay: float = field(default=0.9, metadata={"help": "EMA decay of the per-side, per-round baselines"})
    eval_every: int = field(default=0, metadata={"help": "0: evaluate only before and after training"})

    run_name = "debate"  # output_dir defaults to runs/debate

    def validate(self) -> None:
        positive(self, "debates_per_step", "train_tasks", "eval_tasks", "top_p")
        non_negative(self, "eval_every")
        bad = [p for p in self.eval_protocols.split(",") if p.strip() and p.strip() not in PROTOCOLS]
        if bad:
            raise ConfigError(f"unknown eval_protocols {bad}; known: {PROTOCOLS}")
        check_dtype(self.judge_dtype, "judge_dtype")

    def answer_budget(self) -> int:
        """The engine's answer budget (its KV cache is sized for it): a speech's."""
        return self.max_new_tokens


def task_sets(cfg):
    """Step 0: the eval set and a train pool without any of its questions."""
    kw = dict(reasoning_gym_names=cfg.reasoning_gym_datasets, dataset_path=cfg.dataset_path)
    eval_set = make_tasks(cfg.task_families, cfg.eval_tasks, cfg.seed + 10_000, **kw)
    seen = {(t.question, t.context) for t in eval_set}
    pool = [t for t in make_tasks(cfg.task_families, cfg.train_tasks, cfg.seed, **kw)
            if (t.question, t.context) not in seen]
    if not pool or not eval_set:
        raise ValueError(f"no tasks: {len(pool)} train, {len(eval_set)} eval from families {cfg.task_families!r}")
    return pool, eval_set


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


def debate_plan(cfg, pool, engine, tok, sampling, process_index):
    """``step -> play``: the step's tasks and seeds are drawn in the caller (seeded by seed,
    step, rank: resumable); ``play()`` holds the debates."""
    def at(step):
        rng = random.Random(f"{cfg.seed}/{step}/{process_index}")
        tasks = [rng.choice(pool) for _ in range(cfg.debates_per_step)]
        sp = dataclasses.replace(sampling, seed=rng.randrange(2**31))
        seed = rng.randrange(2**31)
        return lambda: run_protocol(tasks, "debate", engine, tok, cfg, sp, seed=seed)
    return at


def judge_accuracy(cfg, eval_set, engine, tok, judge, step, out_dir, write: bool):
    """Step 6: every protocol on the eval set, the same sampling seed at every checkpoint."""
    sampling = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                              seed=cfg.seed + 777)
    per, dumps = {}, []
    for proto in [p.strip() for p in cfg.eval_protocols.split(",") if p.strip()]:
        trs = run_protocol(eval_set, proto, engine, tok, cfg, sampling, seed=cfg.seed)
        js = judge_transcripts(judge, trs)
        per[proto] = protocol_metrics(trs, js)
        dumps += [json.dumps({"protocol": proto, "task": tr.task.id, "options": tr.options,
                              "correct": tr.task.correct, "p_correct": j.p_correct, "p_forward": j.p_forward,
                              "p_swapped": j.p_swapped, "speeches": [
                                  {"speaker": s.speaker, "round": s.round, "side": tr.options[tr.sides[s.speaker]],
                                   "text": s.text, "flags": s.flags} for s in tr.speeches]})
                  for tr, j in zip(trs, js)]
    if write:
        atomic_write_text(out_dir / f"eval_transcripts_step{step}.jsonl", "\n".join(dumps) + "\n")
    return per


@dataclass
class Debate:
    """What the loop works on, built once by :func:`build` (a resume then restores it)."""

    pool: list
    eval_set: list
    tok: object
    judge: object
    trainer: PolicyTrainer
    engine: object  # cfg.engine: hf | vllm | vllm-server
    baselines: RoleBaselines
    table: dict  # "step N" -> protocol -> metrics, one entry per evaluation


def build(cfg, run) -> Debate:
    """Step 0 (tasks, the frozen judge), the policy, its trainer and engine, fresh."""
    pool, eval_set = task_sets(cfg)
    model, tok = load_policy(cfg, device=str(run.acc.device))
    ref = reference_policy(cfg, model, str(run.acc.device))
    # the frozen judge: its own model by path, or a fresh copy of the initial policy
    judge_device = cfg.judge_device if cfg.judge_device != "auto" else str(run.acc.device)
    judge = load_llm_judge(cfg.judge_model_name_or_path or cfg.model_name_or_path, judge_device, cfg.judge_dtype,
                           hidden_context=cfg.hidden_context, max_prompt_tokens=cfg.max_prompt_tokens)
    trainer = PolicyTrainer(model, tok, cfg, accelerator=run.acc, ref_model=ref)
    engine = make_engine(cfg, trainer.unwrapped, tok, answer_budget=cfg.answer_budget(), temperature=cfg.temperature,
                         top_p=cfg.top_p, seed=cfg.seed)
    return Debate(pool, eval_set, tok, judge, trainer, run.closing(engine),
                  RoleBaselines(cfg.baseline_decay), {})


def load_state(d: Debate, extra: dict) -> None:
    """What the checkpoint saved besides the trainer: baselines and the accuracy table. The
    engine keeps the version of the weights it was built with, so the first ``serving`` of the
    resumed run pushes the restored ones (a server still holds what it loaded)."""
    d.baselines.load_state_dict(extra["baselines"])
    d.table.update(extra["table"])


def log_judge_accuracy(cfg, run, d: Debate, step, t0) -> None:
    """Step 6: every rank evaluates in step (ZeRO-3); rank 0 reports."""
    with d.trainer.serving(d.engine):
        per = judge_accuracy(cfg, d.eval_set, d.engine, d.tok, d.judge, step, run.out, run.is_main)
    d.table[f"step {step}"] = per
    if run.is_main:
        run.log(step, {**{f"{p}/{k}": v for p, mm in per.items() for k, v in mm.items()},
                       "judge/invalid": d.judge.invalid, "judge/prompt_cuts": d.judge.prompt_cuts,
                       "wall_s": time.time() - t0})
        _plot(run.logger, per)


def step_row(trs, js, metrics, baselines, stale, t0) -> dict:
    speeches = [s for tr in trs for s in tr.speeches]
    return {**{f"train/{k}": v for k, v in metrics.items()},
            "train/judge_accuracy": float(np.mean([j.correct for j in js])),
            "train/true_side_reward": float(np.mean([2 * j.p_correct - 1 for j in js])),
            "train/speech_tokens": float(np.mean([len(s.completion_ids) for s in speeches])),
            **{f"baseline/{k}": v for k, v in baselines.values.items()}, **stale, "wall_s": time.time() - t0}


def finish(cfg, run, d: Debate, t0) -> None:
    """Step 6 after training (unless done), the final model and the accuracy table."""
    if f"step {cfg.max_steps}" not in d.table:
        log_judge_accuracy(cfg, run, d, cfg.max_steps, t0)
    model_dir = run.save_final_model(d.trainer.model, d.trainer.unwrapped, d.tok)
    if run.is_main:
        text = format_table(d.table)
        atomic_write_text(run.out / "accuracy_table.txt", text + "\n")
        save_json(run.out / "accuracy_table.json", d.table)
        print(f"\njudge accuracy on {len(d.eval_set)} eval questions (hidden_context={cfg.hidden_context}):\n{text}")
        print(f"\ncurves: {run.out / 'curves.png'}\nmetrics: {run.logger.path}\nmodel: {model_dir}")


def main(argv=None):
    cfg = parse_config(DebateConfig, argv)
    with Run(cfg) as run:
        d = build(cfg, run)
        start_step = run.resume_trainer(d.trainer, lambda extra: load_state(d, extra))
        run.report_start(start_step)
        run.open_log(start_step if run.checkpoint else None)
        sampling = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
        rollouts = rollouts_for(cfg, d.trainer, d.engine,
                                debate_plan(cfg, d.pool, d.engine, d.tok, sampling, run.acc.process_index))
        t0 = time.time()
        bar = tqdm(range(start_step, cfg.max_steps), initial=start_step, total=cfg.max_steps, desc="debate",
                   disable=not run.is_main)
        for step in bar:
            if step == 0 or (cfg.eval_every and step % cfg.eval_every == 0 and f"step {step}" not in d.table):
                log_judge_accuracy(cfg, run, d, step, t0)  # 6 (before training, and every eval_every)
            # 1: debates on this step's tasks (max_staleness >= 1: held while the previous step trained)
            trs = rollouts.next(step, cfg.max_steps - 1)
            # 2: the frozen judge, both orders
            js = judge_transcripts(d.judge, trs)
            # 3-4: zero-sum rewards, baselines per (side, round)
            samples, stale = rollouts.keep(debate_samples(trs, js, d.baselines, d.trainer.step_count),
                                           d.trainer.step_count)
            # 5: update; the engine serves the same (updated) weights next step
            metrics = d.trainer.step(samples)
            row = step_row(trs, js, metrics, d.baselines, stale, t0)
            run.log(step + 1, row)
            bar.set_postfix(loss=f"{metrics.get('loss', 0):.3f}", true_r=f"{row['train/true_side_reward']:+.2f}")
            if run.checkpoint_due(step + 1):  # 7: checkpoint
                d.trainer.save_checkpoint(run.out, {"baselines": d.baselines.state_dict(), "table": d.table})
        finish(cfg, run, d, t0)


def _plot(logger, per):
    keys = [f"{p}/accuracy" for p in per] + [f"{p}/position_bias" for p in per if p != "none"][:1]
    keys += [f"{p}/verified_quote_share" for p in per if p != "none"][:1]
    keys += ["train/true_side_reward", "train/speech_tokens", "train/kl"]
    return logger.plot(keys, "curves.png", title="debate: judge accuracy")


if __name__ == "__main__":
    sys.exit(run_main(main))
