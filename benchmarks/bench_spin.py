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

``--plateau`` starts SPIN where its paper does, from an SFT model that more SFT no longer
improves (:func:`sft_plateau`): rounds of SPIN's own number of SFT epochs until a round
does not raise held-out accuracy beyond its paired 95% interval; SPIN then runs from the
last round's start, and the control is one more such round (the same passes over the data).

    python benchmarks/bench_spin.py [--config recipes/configs/spin.yaml] [--seed 0]
                                    [--set key=value ...] [--name NAME] [--no-control]
                                    [--control-epochs 1 [5 ...]]
                                    [--plateau [--plateau-epochs E] [--plateau-max-rounds 8]]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

from lmselfplay.spin.config import SpinConfigs
from lmselfplay.spin.held_out import held_out_scores, mean_ci_half_width, summarize
from lmselfplay.spin.pairs import tokenize_pairs
from lmselfplay.spin.trainers import load_model, sft_phase
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.metrics_logger import read_jsonl
from lmselfplay.utils.recipe_loader import run_recipe
from lmselfplay.utils.results import save_results

ROOT = Path(__file__).resolve().parents[1]


def paired_change(after, before, key):
    """Mean per-prompt change of ``key`` from ``before`` to ``after`` and its 95% half-width."""
    d = [float(a[key]) - float(b[key]) for a, b in zip(after, before, strict=True)]
    return sum(d) / len(d), mean_ci_half_width(d)


def with_changes(row, scores, start):
    dacc, dacc_ci = paired_change(scores, start, "correct")
    dll, dll_ci = paired_change(scores, start, "loglik")
    return {**row, "paired/accuracy_change": dacc, "paired/accuracy_change_ci": dacc_ci,
            "paired/loglik_change": dll, "paired/loglik_change_ci": dll_ci}


def spin_run(argv, out):
    t0 = time.time()
    run_recipe("spin", [*argv, "--output_dir", str(out)])
    wall = time.time() - t0
    start = read_jsonl(out / "eval" / "step-0.jsonl")
    rows = [with_changes(r, read_jsonl(out / "eval" / f"step-{r['step']}.jsonl"), start)
            for r in read_jsonl(out / "metrics.jsonl")]
    return rows, wall


def sft_scored(argv, start, data_dir, rejected_dir, out, epochs, lr=None):
    """``epochs`` epochs of SFT from the checkpoint ``start`` (at ``lr``, default the SFT
    phase's) on the supervised sets in ``data_dir``, saved in ``out/checkpoint-0``; returns
    that path and the per-prompt held-out scores (y' of the margin: ``rejected_dir``'s
    held-out answers)."""
    import datasets
    import torch
    from accelerate import PartialState

    from lmselfplay.lm.engines.hf import HFEngine
    from lmselfplay.models.policy import load_tokenizer
    cfg = SpinConfigs.parse(argv)
    cfg = dataclasses.replace(cfg, spin=dataclasses.replace(cfg.spin, sft_epochs=epochs,
                                                            sft_learning_rate=lr or cfg.spin.sft_learning_rate))
    state = PartialState(cpu=not torch.cuda.is_available())
    sup = datasets.load_from_disk(str(data_dir / "ds"))
    train_rows, held = sup["train"].to_list(), sup["eval"].to_list()
    tok = load_tokenizer(str(start))
    p_train, y_train, _ = tokenize_pairs(tok, train_rows, cfg.spin.max_completion_length)
    gen_len = cfg.spin.max_completion_length or max(len(c) for c in y_train)
    p_held, y_held, _ = tokenize_pairs(tok, held, gen_len)
    path = sft_phase(cfg, str(start), out, p_train, y_train, tok, state)
    rejected = datasets.load_from_disk(str(rejected_dir / "data" / "ds"))["eval"]["rejected_ids"]
    model, _ = load_model(cfg, str(path), state, lora=False)
    engine = HFEngine(model, tok, max_batch_size=cfg.spin.generation_batch_size)
    return path, held_out_scores(engine, state, held, p_held, y_held, rejected, gen_len, cfg)


def theta_0_of(argv, spin_out):
    """The theta_0 of the SPIN run in ``spin_out``: its SFT phase's ``checkpoint-0``, or the
    config's model when the run had no SFT phase."""
    from lmselfplay.models.policy import resolve_model_path

    if (spin_out / "checkpoint-0").exists():
        return spin_out / "checkpoint-0"
    return resolve_model_path(SpinConfigs.parse(argv).policy.model_name_or_path)


def control_run(argv, spin_out, out, epochs, lr=None):
    """``epochs`` more epochs of SFT from the SPIN run's theta_0 (at ``lr``, default the SFT
    phase's), evaluated like an iteration."""
    t0 = time.time()
    _, scores = sft_scored(argv, theta_0_of(argv, spin_out), spin_out / "data", spin_out / "iter-0",
                           out, epochs, lr)
    row = {**summarize(scores), "time/iteration_s": time.time() - t0}
    return with_changes(row, scores, read_jsonl(spin_out / "eval" / "step-0.jsonl"))


def sft_plateau(argv, work, epochs, max_rounds):
    """theta_0 the paper's way: SFT until more SFT no longer raises held-out accuracy. From
    the config's theta_0, rounds of ``epochs`` SFT epochs (one schedule each: SPIN's own
    number of passes over the data, so a round is the same compute of further SFT the
    control gets); after each round the paired accuracy change against the round's start is
    measured on the same prompts. The first round whose gain is not beyond that change's 95%
    half-width ends the search (or ``max_rounds``): theta_0 is that round's start. The data
    and the margin's y' come from a one-iteration SPIN run from the config's start
    (``work/probe``). Returns theta_0's checkpoint and one row per round."""
    probe = work / "probe"
    run_recipe("spin", [*argv, "--spin_iterations", "1", "--output_dir", str(probe)])
    start = theta_0_of(argv, probe)
    before = read_jsonl(probe / "eval" / "step-0.jsonl")
    curve = [{"round": 0, "sft_epochs": 0.0, **summarize(before)}]
    print(f"  [plateau] round 0 (the config's theta_0): accuracy {curve[0]['eval/accuracy']:.3f}", flush=True)
    for k in range(1, max_rounds + 1):
        t0 = time.time()
        path, scores = sft_scored(argv, start, probe / "data", probe / "iter-0", work / f"sft-{k}", epochs)
        gain, ci = paired_change(scores, before, "correct")
        curve.append({"round": k, "sft_epochs": k * epochs, **summarize(scores), "gain": gain,
                      "gain_ci": ci, "rises": gain > ci, "time_s": time.time() - t0})
        print(f"  [plateau] round {k} (+{epochs:g} SFT epochs): accuracy {curve[-1]['eval/accuracy']:.3f}, "
              f"{gain:+.3f} +- {ci:.3f} ({'rises' if gain > ci else 'no rise: plateau'}), {time.time() - t0:.0f} s",
              flush=True)
        if gain <= ci:
            break
        start, before = path, scores
    return start, curve


def fmt(row):
    return (f"{row['eval/accuracy']:.3f} [{row['eval/accuracy_ci_low']:.3f}, {row['eval/accuracy_ci_high']:.3f}]  "
            f"{row['paired/accuracy_change']:+.3f} +- {row['paired/accuracy_change_ci']:.3f}  "
            f"{row['eval/answer_loglik']:7.2f} +- {row['eval/answer_loglik_ci']:4.2f}  "
            f"{row['paired/loglik_change']:+6.2f} +- {row['paired/loglik_change_ci']:4.2f}  {row['eval/margin']:6.2f}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "recipes" / "configs" / "spin.yaml"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", nargs="*", default=[], help="extra key=value for the run")
    ap.add_argument("--control-epochs", type=float, nargs="+", default=None,
                    help="one control per value: that many SFT epochs from theta_0 (default 1; with --plateau "
                         "spin_iterations x num_train_epochs, SPIN's own number of epochs)")
    ap.add_argument("--control-lr", type=float, default=None,
                    help="learning rate of the controls (default: the config's sft_learning_rate)")
    ap.add_argument("--no-control", action="store_true")
    ap.add_argument("--plateau", action="store_true",
                    help="theta_0 = SFT until a round of --plateau-epochs more SFT epochs no longer raises held-out "
                         "accuracy (sft_plateau); the control gets that many further epochs unless "
                         "--control-epochs is given")
    ap.add_argument("--plateau-epochs", type=float, default=None,
                    help="SFT epochs per plateau round (default spin_iterations x num_train_epochs: SPIN's own)")
    ap.add_argument("--plateau-max-rounds", type=int, default=8)
    ap.add_argument("--name", default="bench_spin")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch


    torch.set_num_threads(args.threads)
    argv = ["--config", args.config, "--seed", str(args.seed), "--progress", "false", "--tensorboard", "false"]
    for kv in args.set:
        k, v = kv.split("=", 1)
        argv += [f"--{k}", *v.split()]
    load = os.getloadavg()[0]
    plateau, control_epochs, spin_epochs = [], args.control_epochs or [1.0], None
    with tempfile.TemporaryDirectory() as d:
        if args.plateau:
            spin = SpinConfigs.parse(argv).spin
            spin_epochs = args.plateau_epochs or spin.spin_iterations * spin.num_train_epochs
            theta_0, plateau = sft_plateau(argv, Path(d), spin_epochs, args.plateau_max_rounds)
            argv += ["--model_name_or_path", str(theta_0), "--sft_epochs", "0"]
            control_epochs = args.control_epochs or [spin_epochs]
        rows, wall = spin_run(argv, Path(d) / "spin")
        controls = [] if args.no_control else [
            {"epochs": e, **control_run(argv, Path(d) / "spin", Path(d) / f"control-{i}", e, args.control_lr)}
            for i, e in enumerate(control_epochs)]
    if plateau:
        reached = not plateau[-1].get("rises", True)
        print(f"\nSFT until a round of more SFT no longer raises held-out accuracy: theta_0 = round "
              f"{plateau[-1]['round'] - reached}" + ("" if reached else
              f" (no plateau within {args.plateau_max_rounds} rounds: theta_0 is still rising)"))
        for r in plateau:
            extra = f"  vs the round's start {r['gain']:+.3f} +- {r['gain_ci']:.3f}" if r["round"] else ""
            print(f"  round {r['round']}  +{r['sft_epochs']:g} SFT epochs  accuracy {r['eval/accuracy']:.3f} "
                  f"[{r['eval/accuracy_ci_low']:.3f}, {r['eval/accuracy_ci_high']:.3f}]{extra}")
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
                             "controls": controls, "control_lr": args.control_lr, "plateau": plateau,
                             "plateau_epochs": spin_epochs})


if __name__ == "__main__":
    sys.exit(run_main(main))
