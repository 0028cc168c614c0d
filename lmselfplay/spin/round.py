"""One SPIN iteration (Algorithm 1 of Chen et al. 2024), as the recipe's loop calls it:

* :func:`opponent_dataset` — step 1: the opponent theta_t answers every training and held-out
  prompt (y' ~ p_theta_t(. | x), from the prompt ids the trainer will see, up to the training
  length); chosen = the data answer, rejected = y', tagged with the iteration and the generating
  checkpoint; made once and saved in ``iter-<t>/data``;
* :func:`dpo_update` — step 2: theta_{t+1} by DPO with beta = lambda_t against the frozen
  reference theta_t (never ``ref_model=None`` without LoRA: TRL would reload it from
  ``config._name_or_path``), saved as ``checkpoint-<t+1>``.
* :func:`partial_progress` — whether a run folder holds work of an unfinished iteration that
  ``--resume`` continues from (before any ``checkpoint-<t>`` exists).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.prompt import format_prompt
from lmselfplay.spin.config import SpinConfigs, dpo_losses
from lmselfplay.spin.pairs import Pairs, load_dataset_dir, save_dataset
from lmselfplay.spin.sampling import opponent_answers, sharded
from lmselfplay.spin.trainers import (
    IDS,
    last_trainer_checkpoint,
    load_model,
    pretokenized_dpo_trainer,
    save_iterate,
    trainer_args,
)
from lmselfplay.utils.run import Run


def iteration_dataset(tokenizer: Any, rows: list[dict[str, Any]], prompts: list[list[int]],
                      chosen: list[list[int]], ys: list[tuple[list[int], str, str]], t: int,
                      generator: str) -> Any:
    """The iteration's pairs as a data set: text and token ids of prompt, chosen (data answer) and
    rejected (y' as sampled), y's finish reason, the iteration and the generating checkpoint."""
    import datasets

    return datasets.Dataset.from_dict({
        "prompt": [r["prompt"] for r in rows],
        "formatted_prompt": [format_prompt(tokenizer, r["prompt"]) for r in rows],
        "chosen": [r["answer"] for r in rows],
        "rejected": [y[1] for y in ys],
        "prompt_ids": prompts, "chosen_ids": chosen, "rejected_ids": [y[0] for y in ys],
        "finish_reason": [y[2] for y in ys],
        "iteration": [t] * len(rows), "generator": [generator] * len(rows)})


def opponent_dataset(cfg: SpinConfigs, run: Run, engine: HFEngine, pairs: Pairs, train_rows, held, t: int,
                     theta_t: str | None) -> Any:
    """Step 1 of iteration ``t`` (once: saved in ``iter-t/data``): y' ~ p_theta_t(.|x) for
    every training and held-out prompt, from the same prompt ids the trainer will see, up to
    the training length; chosen = data answer, rejected = y', tagged."""
    import datasets

    it_dir = run.out / f"iter-{t}"
    if not (it_dir / "data" / "COMPLETE").exists():
        state = run.acc
        sp = cfg.sampling.params(pairs.gen_len, cfg.run.seed * 1_000_003 + 7919 * t + 104_729 * state.process_index)
        gen = sharded(state, pairs.p_train + pairs.p_held, lambda ps: opponent_answers(
            engine, ps, sp, cfg, f"generate y' (iteration {t})"))
        n, who, tok = len(pairs.p_train), str(theta_t), pairs.tokenizer
        save_dataset(datasets.DatasetDict({
            "train": iteration_dataset(tok, train_rows, pairs.p_train, pairs.y_train, gen[:n], t, who),
            "eval": iteration_dataset(tok, held, pairs.p_held, pairs.y_held, gen[n:], t, who)}),
            it_dir / "data", state)
    return load_dataset_dir(it_dir / "data")


def dpo_update(cfg: SpinConfigs, run: Run, model: Any, pairs: Pairs, data: Any, t: int, theta_t: str | None,
               lam: float) -> tuple[Path, dict[str, Any]]:
    """Step 2: theta_{t+1} by DPO with beta = lambda_t against the frozen reference theta_t,
    saved as ``checkpoint-<t+1>`` (the next iteration starts from it); its training stats."""
    from trl import DPOConfig

    it_dir = run.out / f"iter-{t}"
    if cfg.policy.use_lora:
        del model
        model, _ = load_model(cfg, theta_t, run.acc, lora=True)
        ref_model = None  # reference = adapter disabled = theta_t (TRL does this for PEFT)
    else:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        model.float()  # float32 master weights (AdamW loses bf16 updates); bf16=True autocasts
    args = DPOConfig(**trainer_args(cfg, it_dir / "trainer", run.acc.device.type == "cpu",
                                    num_train_epochs=cfg.spin.num_train_epochs, learning_rate=cfg.spin.learning_rate),
                     beta=lam, **dpo_losses(cfg), max_length=None, precompute_ref_log_probs=False)
    trainer = pretokenized_dpo_trainer()(model=model, ref_model=ref_model, args=args,
                                         train_dataset=data["train"].select_columns(list(IDS)),
                                         processing_class=pairs.tokenizer)
    result = trainer.train(resume_from_checkpoint=last_trainer_checkpoint(it_dir / "trainer"))
    final = next((h for h in reversed(trainer.state.log_history) if "rewards/accuracies" in h), {})
    stats = {"train/loss": result.training_loss,  # mean over this run of the iteration
             "train/reward_accuracy": final.get("rewards/accuracies", float("nan")),
             "train/reward_margin": final.get("rewards/margins", float("nan")),
             "train/steps": trainer.state.global_step}
    nxt = run.out / f"checkpoint-{t + 1}"
    save_iterate(trainer, pairs.tokenizer, nxt, {"iteration": t + 1, "beta": lam, "generator": str(theta_t)})
    if run.is_main:  # theta_{t+1} is safe: the mid-iteration trainer state can go
        shutil.rmtree(it_dir / "trainer", ignore_errors=True)
    return nxt, stats


def partial_progress(out: Path) -> bool:
    """Whether ``out`` holds what a resume continues from before any ``checkpoint-<t>``: the
    supervised sets (``data``), the SFT phase's trainer checkpoints (``sft``) or an iteration's
    folder (``iter-<t>``: its data set, its DPOTrainer checkpoints)."""
    return (out / "data").is_dir() or (out / "sft").is_dir() or any(p.is_dir() for p in out.glob("iter-*"))
