"""TRL's trainers as SPIN uses them: models loaded per process, ``DPOTrainer`` fed the token ids
made by THE formatter, the trainer arguments both phases share, the optional SFT phase
(theta_0), and theta_{t+1} saved as a plain HF folder (LoRA merged), atomically."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

from accelerate import PartialState

from lmselfplay.models.policy import load_policy
from lmselfplay.spin.config import SpinConfigs
from lmselfplay.utils.checkpoint import atomic_dir, save_json

IDS = ("prompt_ids", "chosen_ids", "rejected_ids")


def load_model(cfg: SpinConfigs, path: str | None, state: PartialState, lora: bool) -> tuple[Any, Any]:
    """The model at ``path`` (None: the embedded one) and its tokenizer, on this process's device."""
    device = "cpu" if state.device.type == "cpu" else str(state.device)
    return load_policy(cfg.policy, model_name_or_path=path, device=device, use_lora=lora)


def save_iterate(trainer: Any, tokenizer: Any, final_dir: Path, info: dict[str, Any]) -> None:
    """theta_{t+1} as a plain HF folder (LoRA merged), written atomically by the main process."""
    acc = trainer.accelerator
    acc.wait_for_everyone()
    state_dict = acc.get_state_dict(trainer.model)  # gathers ZeRO-3 shards
    if acc.is_main_process:
        model = acc.unwrap_model(trainer.model)
        with atomic_dir(final_dir) as tmp:
            if hasattr(model, "merge_and_unload"):  # LoRA: theta_{t+1} = base + adapter, merged
                model.merge_and_unload().save_pretrained(tmp)
            else:
                model.save_pretrained(tmp, state_dict=state_dict)
            tokenizer.save_pretrained(tmp)
            save_json(tmp / "spin_state.json", info)
    acc.wait_for_everyone()


@functools.cache
def pretokenized_dpo_trainer() -> type:
    """``DPOTrainer`` fed with token ids we made ourselves (``prompt_ids``, ``chosen_ids``,
    ``rejected_ids``): TRL's own text tokenization would add an EOS to truncated samples and
    re-tokenize y' from its decoded text, so it could train on tokens nobody generated. Built
    on first use: importing TRL takes seconds that ``--help``, a refused output folder or a
    config error should not wait for."""
    from trl import DPOTrainer

    class PretokenizedDPOTrainer(DPOTrainer):
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            if set(IDS) <= set(dataset.column_names):
                return dataset
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)

    return PretokenizedDPOTrainer


def trainer_args(cfg: SpinConfigs, out: Path, on_cpu: bool, **kw: Any) -> dict[str, Any]:
    """The TRL arguments the SFT and DPO phases share (bf16 only off the CPU, with a bf16 or auto
    dtype); ``kw``: the phase's own (epochs, learning rate)."""
    return dict(output_dir=str(out), per_device_train_batch_size=cfg.spin.per_device_train_batch_size,
                gradient_accumulation_steps=cfg.spin.gradient_accumulation_steps,
                lr_scheduler_type=cfg.spin.lr_scheduler_type, warmup_steps=cfg.spin.warmup_steps,
                gradient_checkpointing=cfg.policy.gradient_checkpointing, logging_steps=cfg.spin.logging_steps,
                save_strategy="steps", save_steps=cfg.spin.save_steps, save_total_limit=1,
                use_cpu=on_cpu, bf16=not on_cpu and cfg.policy.dtype in ("auto", "bfloat16"),
                report_to="none", seed=cfg.run.seed, data_seed=cfg.run.seed,
                disable_tqdm=not cfg.spin.progress, **kw)


def last_trainer_checkpoint(path: Path) -> str | None:
    """The newest in-phase trainer checkpoint under ``path`` (resume inside an iteration), or None."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(path)) if path.is_dir() else None


def sft_phase(cfg: SpinConfigs, start: str | None, out: Path, prompts: list[list[int]],
              answers: list[list[int]], tokenizer: Any, state: PartialState) -> Path:
    """Supervised fine-tuning of ``start`` on the data answers (loss on the answer tokens),
    ``sft_epochs`` epochs at ``sft_learning_rate``; saved as ``out/checkpoint-0``."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    model, _ = load_model(cfg, start, state, lora=cfg.policy.use_lora)
    if not cfg.policy.use_lora:
        model.float()  # float32 master weights (AdamW loses bf16 updates); bf16=True autocasts
    sft = datasets.Dataset.from_dict({
        "input_ids": [p + y for p, y in zip(prompts, answers)],
        "completion_mask": [[0] * len(p) + [1] * len(y) for p, y in zip(prompts, answers)]})
    args = SFTConfig(**trainer_args(cfg, out / "sft", state.device.type == "cpu", num_train_epochs=cfg.spin.sft_epochs,
                                    learning_rate=cfg.spin.sft_learning_rate),
                     completion_only_loss=True, max_length=None, packing=False)
    trainer = SFTTrainer(model=model, args=args, train_dataset=sft, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=last_trainer_checkpoint(out / "sft"))
    save_iterate(trainer, tokenizer, out / "checkpoint-0", {"iteration": 0, "phase": "sft"})
    if state.is_main_process:
        shutil.rmtree(out / "sft", ignore_errors=True)
    return out / "checkpoint-0"
