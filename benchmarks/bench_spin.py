"""Does SPIN move the model toward the data? Each iteration on held-out prompts, with a control.

Runs `recipes/spin.py` with a config (default: the shipped `recipes/configs/spin.yaml`) and
prints, per iteration, the held-out greedy exact-answer accuracy (95% Wilson interval), the
data answers' log-likelihood (mean +- 95% half-width), the margin log p(y|x) - log p(y'|x)
and the wall time, plus the paired change from theta_0 of accuracy and log-likelihood (mean
of the per-prompt differences +- its 95% normal half-width: the same prompts are scored every
iteration, so a change is measured much more tightly than two separate intervals suggest).
The control is the paper's: more epochs of plain SFT from the same start theta_0 (one
control per ``--control-epochs`` value), evaluated on the same held-out prompts (its margin
against the same y').

    python benchmarks/bench_spin.py [--config recipes/configs/spin.yaml] [--seed 0]
                                    [--set key=value ...] [--name NAME] [--no-control]
                                    [--control-epochs 1 [5 ...]]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

from lmselfplay.utils.metrics_logger import read_jsonl
from lmselfplay.utils.results import save_results

ROOT = Path(__file__).resolve().parents[1]


def load_recipe():
    from lmselfplay.utils.recipe_loader import load_recipe as _load

    return _load("spin")


def paired_change(recipe, after, before, key):
    """Mean per-prompt change of ``key`` from ``before`` to ``after`` and its 95% half-width."""
    d = [float(a[key]) - float(b[key]) for a, b in zip(after, before, strict=True)]
    return sum(d) / len(d), recipe.mean_ci_half_width(d)


def with_changes(recipe, row, scores, start):
    dacc, dacc_ci = paired_change(recipe, scores, start, "correct")
    dll, dll_ci = paired_change(recipe, scores, start, "loglik")
    return {**row, "paired/accuracy_change": dacc, "paired/accuracy_change_ci": dacc_ci,
            "paired/loglik_change": dll, "paired/loglik_change_ci": dll_ci}


def spin_run(recipe, argv, out):
    t0 = time.time()
    recipe.main([*argv, "--output_dir", str(out)])
    wall = time.time() - t0
    start = read_jsonl(out / "eval" / "step-0.jsonl")
    rows = [with_changes(recipe, r, read_jsonl(out / "eval" / f"step-{r['step']}.jsonl"), start)
            for r in read_jsonl(out / "metrics.jsonl")]
    return rows, wall


def control_run(recipe, argv, spin_out, out, epochs, lr=None):
    """``epochs`` more epochs of SFT from the SPIN run's theta_0 (at ``lr``, default the SFT
    phase's), evaluated like an iteration."""
    import datasets
    import torch
    from accelerate import PartialState

    from lmselfplay.lm.engines.hf import HFEngine
    from lmselfplay.models.policy import load_tokenizer, resolve_model_path
    from lmselfplay.utils.config import parse_config

    t0 = time.time()
    cfg = parse_config(recipe.SpinConfig, argv)
    cfg = dataclasses.replace(cfg, sft_epochs=epochs, sft_learning_rate=lr or cfg.sft_learning_rate)
    state = PartialState(cpu=not torch.cuda.is_available())
    start = spin_out / "checkpoint-0" if (spin_out / "checkpoint-0").exists() else resolve_model_path(
        cfg.model_name_or_path)
    sup = datasets.load_from_disk(str(spin_out / "data" / "ds"))
    train_rows, held = sup["train"].to_list(), sup["eval"].to_list()
    tok = load_tokenizer(str(start))
    p_train, y_train, _ = recipe.tokenize_pairs(tok, train_rows, cfg.max_completion_length)
    gen_len = cfg.max_completion_length or max(len(c) for c in y_train)
    p_held, y_held, _ = recipe.tokenize_pairs(tok, held, gen_len)
    path = recipe.sft_phase(cfg, str(start), out, p_train, y_train, tok, state)
    rejected = datasets.load_from_disk(str(spin_out / "iter-0" / "data" / "ds"))["eval"]["rejected_ids"]
    model, _ = recipe.load_model(cfg, str(path), state, lora=False)
    engine = HFEngine(model, tok, max_batch_size=cfg.generation_batch_size)
    scores = recipe.held_out_scores(engine, state, held, p_held, y_held, rejected, gen_len, cfg)
    row = {**recipe.summarize(scores), "time/iteration_s": time.time() - t0}
    return with_changes(recipe, row, scores, read_jsonl(spin_out / "eval" / "step-0.jsonl"))


def fmt(row):
    return (f"{row['eval/accuracy']:.3f} [{row['eval/accuracy_ci_low']:.3f}, {row['eval/accuracy_ci_high']:.3f}]  "
            f"{row['paired/accuracy_change']:+.3f} +- {row['paired/accuracy_change_ci']:.3f}  "
            f"{row['eval/answer_loglik']:7.2f} +- {row['eval/answer_loglik_ci']:4.2f}  "
            f"{row['paired/loglik_change']:+6.2f} +- {row['paired/loglik_change_ci']:4.2f}  {row['eval/margin']:6.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "recipes" / "configs" / "spin.yaml"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", nargs="*", default=[], help="extra key=value for the run")
    ap.add_argument("--control-epochs", type=float, nargs="+", default=[1.0],
                    help="one control per value: that many SFT epochs from theta_0")
    ap.add_argument("--control-lr", type=float, default=None,
                    help="learning rate of the controls (default: the config's sft_learning_rate)")
    ap.add_argument("--no-control", action="store_true")
    ap.add_argument("--name", default="bench_spin")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    argv = ["--config", args.config, "--seed", str(args.seed), "--progress", "false", "--tensorboard", "false"]
    for kv in args.set:
        k, v = kv.split("=", 1)
        argv += [f"--{k}", *v.split()]
    recipe = load_recipe()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        rows, wall = spin_run(recipe, argv, Path(d) / "spin")
        controls = [] if args.no_control else [
            {"epochs": e, **control_run(recipe, argv, Path(d) / "spin", Path(d) / f"control-{i}", e,
                                                 args.control_lr)}
            for i, e in enumerate(args.control_epochs)]
    print(f"\nSPIN on held-out prompts ({args.config}, seed {args.seed}, {' '.join(args.set)}); "
          f"wall {wall:.0f} s, load average {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'iteration':<22} {'accuracy [95% CI]':<22}  {'change vs theta_0':<16}  {'loglik(y|x) +- CI':<15}  "
          f"{'change vs theta_0':<15}  {'margin':>6}  {'time(s)':>7}")
    for r in rows:
        name = "0 (theta_0)" if r["step"] == 0 else str(r["step"])
        print(f"{name:<22} {fmt(r)}  {r.get('time/iteration_s', 0):7.0f}")
    for c in controls:
        name = f"control: +{c['epochs']:g} SFT ep."
        print(f"{name:<22} {fmt(c)}  {c['time/iteration_s']:7.0f}")
    save_results(args.name, {"config": args.config, "seed": args.seed, "set": args.set, "wall_s": wall,
                             "load_start": load, "load_end": os.getloadavg()[0], "iterations": rows,
                             "controls": controls, "control_lr": args.control_lr})


if __name__ == "__main__":
    main()
