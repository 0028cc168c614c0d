"""Step 6 of the debate recipe: how often the frozen judge is right on the eval set under each
protocol (debate, consultancy, double consultancy, the judge alone), with the same sampling seed
at every evaluation so checkpoints are compared on the same draws; the metrics go to the log and
``curves.png``, every transcript to ``eval_transcripts_step<N>.jsonl``, and the table of every
evaluation to ``accuracy_table.txt`` / ``.json``."""

from __future__ import annotations

import json
import time

from lmselfplay.debate.judge import judge_transcripts
from lmselfplay.debate.metrics import format_table, protocol_metrics
from lmselfplay.debate.protocols import run_protocol
from lmselfplay.debate.training import Debate
from lmselfplay.utils.checkpoint import atomic_write_text, save_json


def judge_accuracy(cfg, eval_set, engine, tok, judge, step, out_dir, write: bool):
    """Step 6: every protocol on the eval set, the same sampling seed at every checkpoint."""
    sampling = cfg.sampling.params(cfg.protocol.max_new_tokens, cfg.run.seed + 777)
    per, dumps = {}, []
    for proto in [p.strip() for p in cfg.debate.eval_protocols.split(",") if p.strip()]:
        trs = run_protocol(eval_set, proto, engine, tok, cfg.protocol, sampling, seed=cfg.run.seed)
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


def log_judge_accuracy(cfg, run, d: Debate, step, t0) -> None:
    """Step 6 on the weights ``d.engine`` serves (the caller serves them; under ZeRO-3 every rank
    evaluates in step); rank 0 reports."""
    per = judge_accuracy(cfg, d.eval_set, d.engine, d.tok, d.judge, step, run.out, run.is_main)
    d.table[f"step {step}"] = per
    if run.is_main:
        run.log(step, {**{f"{p}/{k}": v for p, mm in per.items() for k, v in mm.items()},
                       "judge/invalid": d.judge.invalid, "judge/prompt_cuts": d.judge.prompt_cuts,
                       "wall_s": time.time() - t0})
        plot_accuracy(run.logger, per)


def plot_accuracy(logger, per):
    """``curves.png``: accuracy per protocol, the first debating protocol's position bias and
    verified-quote share, and the training curves (true side's reward, speech length, KL)."""
    keys = [f"{p}/accuracy" for p in per] + [f"{p}/position_bias" for p in per if p != "none"][:1]
    keys += [f"{p}/verified_quote_share" for p in per if p != "none"][:1]
    keys += ["train/true_side_reward", "train/speech_tokens", "train/kl"]
    return logger.plot(keys, "curves.png", title="debate: judge accuracy")


def report_accuracy(cfg, run, d: Debate, model_dir) -> None:
    """The table of every evaluation as text and JSON, printed with where the run's files are
    (main process)."""
    if run.is_main:
        text = format_table(d.table)
        atomic_write_text(run.out / "accuracy_table.txt", text + "\n")
        save_json(run.out / "accuracy_table.json", d.table)
        print(f"\njudge accuracy on {len(d.eval_set)} eval questions (hidden_context={cfg.protocol.hidden_context}):\n{text}")
        print(f"\ncurves: {run.out / 'curves.png'}\nmetrics: {run.logger.path}\nmodel: {model_dir}")
