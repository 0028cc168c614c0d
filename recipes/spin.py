"""SPIN: self-play fine-tuning against the supervised data, on TRL's ``DPOTrainer``.

    python recipes/spin.py --config recipes/configs/spin.yaml
    accelerate launch recipes/spin.py --config recipes/configs/spin.yaml
    accelerate launch --config_file recipes/accelerate/ddp_cpu.yaml recipes/spin.py --config ...  # 2 CPU procs, gloo
    accelerate launch --config_file recipes/accelerate/zero2.yaml recipes/spin.py --config ...    # GPUs
    python recipes/spin.py --config ... --resume        # continue a killed run

Algorithm 1 of Chen et al. 2024 ("Self-Play Fine-Tuning Converts Weak Language Models to
Strong Language Models", arXiv:2401.01335), in its order:

    input: supervised pairs {(x_i, y_i)}, the SFT model p_theta0, iterations T
    for t = 0 .. T-1:
        1. for every x_i, sample y'_i ~ p_theta_t(. | x_i)                   (the opponent)
        2. theta_{t+1} = argmin sum_i l( lam_t log p(y_i|x_i)/p_theta_t(y_i|x_i)
                                         - lam_t log p(y'_i|x_i)/p_theta_t(y'_i|x_i) )
    output: theta_T

With the logistic loss ``l`` step 2 IS the DPO loss with chosen = the data answer y_i,
rejected = the model's own answer y'_i, reference = theta_t and beta = lam_t, so step 2 is
one ``DPOTrainer`` run; ``rpo_alpha`` > 0 adds ``rpo_alpha * NLL(y_i | x_i)`` to it (RPO), so the
data answer is pulled up, not only the model's own answer pushed down. The idealised maths (fixed point p_data, rate |1 - 1/lam|) is in
:mod:`lmselfplay.spin.objective`.

Two traps of the reference implementation are closed by construction here:

* one formatter (uclaml/SPIN#33): generation prompts come from
  :func:`lmselfplay.lm.prompt.encode_prompt`, and the SAME token ids (prompt, data answer via
  :func:`~lmselfplay.lm.prompt.encode_completion`, the sampled y' token ids as sampled) are
  what ``DPOTrainer`` trains on — nothing is re-tokenized from text;
* generation length = training length (uclaml/SPIN#9): y' may be as long as the longest
  data answer in the training set (``max_completion_length``), and DPO does not truncate.

The reference theta_t is passed explicitly (a frozen copy; with LoRA: the adapter
disabled, i.e. the merged theta_t underneath it) — never ``ref_model=None``, which makes
TRL reload the reference from ``config._name_or_path``.

Output (``output_dir``): ``data/`` (the supervised train / held-out sets),
``checkpoint-0`` (theta_0, only when the optional SFT phase ran), ``iter-<t>/data``
(the iteration's data set: prompt, chosen, rejected = exactly what theta_t generated, the
iteration and the generating checkpoint), ``iter-<t>/trainer`` (DPOTrainer checkpoints,
for resuming inside an iteration), ``checkpoint-<t+1>`` (theta_{t+1}, atomic),
``metrics.jsonl`` + TensorBoard + ``spin_metrics.png`` (held-out margin, answer
log-likelihood and exact-answer accuracy per iteration), ``eval/step-<t>.jsonl`` (the same
per held-out prompt, for paired comparisons between iterations).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.models.policy import resolve_model_path
from lmselfplay.spin.config import SpinConfigs, beta_at
from lmselfplay.spin.held_out import held_out_metrics, log_iteration
from lmselfplay.spin.pairs import supervised_data, tokenized
from lmselfplay.spin.round import dpo_update, opponent_dataset, partial_progress
from lmselfplay.spin.trainers import load_model, sft_phase
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import Run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = SpinConfigs.parse(argv)  # its own args (cfg.spin), the policy's and the run's configs
    args = cfg.spin
    with Run(cfg.run, cfg.as_dict(), resume_fixed=cfg.fixed_on_resume(),
             trains_with="state", partial_progress=partial_progress) as run:
        out, state = run.out, run.acc
        torch.manual_seed(cfg.run.seed)
        train_rows, held = supervised_data(cfg, run)
        # theta_0: the given model, or the output of the optional SFT phase (checkpoint-0).
        base = resolve_model_path(cfg.policy.model_name_or_path)  # None -> the embedded model's folder
        last = run.checkpoint
        start = int(last.name.split("-")[1]) if last is not None else 0
        pairs = tokenized(cfg, run, str(last) if last is not None else base, train_rows, held)
        if last is None and args.sft_epochs > 0:
            sft_phase(cfg, base, out, pairs.p_train, pairs.y_train, pairs.tokenizer, state)
        run.report_start(start, "iteration")
        if start >= args.spin_iterations and run.is_main:
            print(f"{out}: all {args.spin_iterations} iterations are done", file=sys.stderr)
        run.open_log(start if start > 0 else None)
        summary: dict[str, Any] = {"iterations": []}
        for t in tqdm(range(start, args.spin_iterations), desc="SPIN", disable=not args.progress):
            t0 = time.time()
            theta_t = str(out / f"checkpoint-{t}") if (out / f"checkpoint-{t}").exists() else base
            model, _ = load_model(cfg, theta_t, state, lora=False)
            engine = HFEngine(model, pairs.tokenizer, max_batch_size=args.generation_batch_size, version=t)
            # 1. the opponent theta_t answers every prompt: the iteration's (data, y') pairs
            data = opponent_dataset(cfg, run, engine, pairs, train_rows, held, t, theta_t)
            r_held = data["eval"]["rejected_ids"]
            if t == 0:  # theta_0 on the held-out set (every process takes its share)
                run.log(0, held_out_metrics(engine, state, held, pairs.p_held, pairs.y_held, r_held, pairs.gen_len,
                                            cfg, out / "eval" / "step-0.jsonl"))
            same = sum(a == b for a, b in zip(data["train"]["chosen_ids"], data["train"]["rejected_ids"]))
            # 2. theta_{t+1}: DPO with beta = lambda_t against the frozen reference theta_t
            lam = beta_at(cfg, t)
            nxt, train_stats = dpo_update(cfg, run, model, pairs, data, t, theta_t, lam)
            del model, engine
            # Held-out metrics under theta_{t+1} (y' still the opponent theta_t's answers).
            model, _ = load_model(cfg, str(nxt), state, lora=False)
            metrics = held_out_metrics(HFEngine(model, pairs.tokenizer, args.generation_batch_size, t + 1), state,
                                       held, pairs.p_held, pairs.y_held, r_held, pairs.gen_len, cfg,
                                       out / "eval" / f"step-{t + 1}.jsonl")
            row = {**metrics, **train_stats, "beta": lam, "gen/identical_to_data": same / len(pairs.p_train),
                   "gen/mean_len": sum(map(len, data["train"]["rejected_ids"])) / len(pairs.p_train),
                   "time/iteration_s": time.time() - t0}
            summary["iterations"].append({"iteration": t + 1, **row})
            log_iteration(run, t, row)
            del model
    summary["output_dir"] = str(out)
    return summary


if __name__ == "__main__":
    sys.exit(run_main(main))
