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

* one formatter (SPIN issue #33): generation prompts come from
  :func:`lmselfplay.lm.prompt.encode_prompt`, and the SAME token ids (prompt, data answer via
  :func:`~lmselfplay.lm.prompt.encode_completion`, the sampled y' token ids as sampled) are
  what ``DPOTrainer`` trains on — nothing is re-tokenized from text;
* generation length = training length (SPIN issue #9): y' may be as long as the longest
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

import copy
import dataclasses
import functools
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from lmselfplay.lm.engines.base import SamplingParams, generate_fitting
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.prompt import encode_completion, encode_prompt, format_prompt
from lmselfplay.models.policy import (
    PolicyConfig,
    load_policy,
    load_tokenizer,
    prompt_style_of,
    resolve_model_path,
)
from lmselfplay.spin.data import answers_match, load_supervised
from lmselfplay.utils.checkpoint import atomic_dir, atomic_write_text, save_json
from lmselfplay.utils.config import (
    ConfigError,
    non_negative,
    parse_config,
    positive,
)
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import Run, RunConfig
from lmselfplay.utils.stats import wilson

IDS = ("prompt_ids", "chosen_ids", "rejected_ids")


@dataclass
class SpinConfig(PolicyConfig, RunConfig):
    # data
    dataset: str | None = field(default=None, metadata={
        "help": "datasets name, .jsonl/.json/.parquet/.csv file or save_to_disk folder with "
                "prompt+answer (or prompt+completion, question+answer, messages); "
                "default: the project's arithmetic word problems"})
    dataset_split: str = field(default="train", metadata={"help": "split of the dataset to use"})
    num_train_examples: int = field(default=256, metadata={"help": "training prompts (SPIN's data set size)"})
    num_eval_examples: int = field(default=64, metadata={"help": "held-out prompts for accuracy and likelihood"})
    # SPIN
    spin_iterations: int = field(default=3, metadata={"help": "SPIN iterations: generate, then train on (data, own answer) pairs"})
    beta_per_iteration: list[float] = field(default_factory=lambda: [0.1], metadata={
        "help": "lambda_t per iteration (DPO beta); the last value repeats. The paper: 0.1 ... then 5.0"})
    max_completion_length: int | None = field(default=None, metadata={
        "help": "generation length of y' = longest trained answer; None: the longest data answer"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the model's own answers"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling of the model's own answers"})
    generation_batch_size: int = field(default=64, metadata={"help": "prompts per generate call"})
    # DPO (names as in TRL's DPOConfig)
    num_train_epochs: float = field(default=2.0, metadata={"help": "DPO epochs per SPIN iteration"})
    learning_rate: float = field(default=5e-7, metadata={"help": "DPO learning rate"})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "any transformers scheduler name"})
    warmup_steps: float = field(default=0.1, metadata={"help": "int: steps; float in [0, 1): ratio"})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "DPO pairs per device and step"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    loss_type: str = field(default="sigmoid", metadata={"help": "TRL DPO loss type (sigmoid = SPIN's logistic loss)"})
    rpo_alpha: float = field(default=0.0, metadata={
        "help": "weight of an NLL term on the chosen (data) answer (RPO's alpha; TRL's loss_type 'sft' "
                "beside loss_type): keeps DPO from lowering the data likelihood along with y'"})
    logging_steps: int = field(default=10, metadata={"help": "optimizer steps between log rows"})
    save_steps: int = field(default=50, metadata={"help": "optimizer steps between in-iteration checkpoints"})
    # optional SFT phase -> theta_0 (when the model has not been fine-tuned on the data)
    sft_epochs: float = field(default=0.0, metadata={"help": "SFT epochs on the data before SPIN (theta_0); 0: none"})
    sft_learning_rate: float = field(default=1e-4, metadata={"help": "learning rate of the SFT phase"})
    # run
    seed: int = field(default=0, metadata={"help": "seed of data, sampling and training"})
    progress: bool = field(default=True, metadata={"help": "show progress bars"})

    run_name = "spin"  # output_dir defaults to runs/spin; a checkpoint per iteration (checkpoint-<t>)

    def validate(self) -> None:
        positive(self, "num_train_examples", "spin_iterations", "temperature", "top_p", "generation_batch_size",
                 "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "logging_steps", "save_steps")
        non_negative(self, "num_eval_examples", "learning_rate", "warmup_steps", "rpo_alpha", "sft_epochs",
                     "sft_learning_rate")
        if self.max_completion_length is not None:
            positive(self, "max_completion_length")
        if not self.beta_per_iteration:
            raise ConfigError("beta_per_iteration must hold at least one lambda")
        bad = [b for b in self.beta_per_iteration
               if not (isinstance(b, int | float) and not isinstance(b, bool) and math.isfinite(b) and b > 0)]
        if bad:
            raise ConfigError(f"beta_per_iteration values must be positive, got {bad}")


def dpo_losses(cfg: SpinConfig) -> dict[str, Any]:
    """DPOConfig's loss fields: the pairwise loss, plus the NLL on the data answer when
    ``rpo_alpha`` > 0 (loss = pairwise + rpo_alpha * NLL(y | x), as RPO / TRL's MPO weights)."""
    if cfg.rpo_alpha == 0:
        return {"loss_type": [cfg.loss_type]}
    return {"loss_type": [cfg.loss_type, "sft"], "loss_weights": [1.0, float(cfg.rpo_alpha)]}


def beta_at(cfg: SpinConfig, t: int) -> float:
    """lambda_t: the schedule's t-th value, its last one past its end (SpinConfig checked them)."""
    return float(cfg.beta_per_iteration[min(t, len(cfg.beta_per_iteration) - 1)])


# --- the pieces every iteration uses ------------------------------------------------------

def tokenize_pairs(tokenizer: Any, rows: list[dict[str, Any]], max_completion: int | None
                   ) -> tuple[list[list[int]], list[list[int]], int]:
    """THE formatter: prompt ids (what generation conditions on) and data-answer ids (+EOS).

    Returns (prompt_ids, chosen_ids, number of answers cut to ``max_completion``)."""
    prompts = [encode_prompt(tokenizer, r["prompt"]) for r in rows]
    chosen = [encode_completion(tokenizer, r["answer"]) for r in rows]
    cut = 0
    if max_completion is not None:
        cut = sum(len(c) > max_completion for c in chosen)
        chosen = [c[:max_completion] for c in chosen]
    return prompts, chosen, cut


def sharded(state: PartialState, items: list[Any], fn: Any) -> list[Any]:
    """``fn(my contiguous share of items)`` on every process, gathered back in order."""
    with state.split_between_processes(list(items)) as mine:
        out = fn(list(mine)) if len(mine) else []
    return gather_object(out) if state.num_processes > 1 else out


def generate(engine: HFEngine, prompts: list[list[int]], sp: SamplingParams, batch: int,
             progress: bool, desc: str) -> list[Any]:
    out = []
    for i in tqdm(range(0, len(prompts), batch), desc=desc, disable=not progress, leave=False):
        chunk_sp = dataclasses.replace(sp, seed=None if sp.seed is None else sp.seed + i)
        out += generate_fitting(engine, prompts[i : i + batch], chunk_sp)
    return out


def opponent_answers(engine: HFEngine, prompts: list[list[int]], sp: SamplingParams,
                     cfg: SpinConfig, desc: str) -> list[tuple[list[int], str, str]]:
    """y' for each prompt: (sampled token ids exactly as sampled, their text, finish reason)."""
    return [(c.token_ids, c.text, c.finish_reason)
            for c in generate(engine, prompts, sp, cfg.generation_batch_size, cfg.progress, desc)]


def iteration_dataset(tokenizer: Any, rows: list[dict[str, Any]], prompts: list[list[int]],
                      chosen: list[list[int]], ys: list[tuple[list[int], str, str]], t: int,
                      generator: str) -> Any:
    import datasets

    return datasets.Dataset.from_dict({
        "prompt": [r["prompt"] for r in rows],
        "formatted_prompt": [format_prompt(tokenizer, r["prompt"]) for r in rows],
        "chosen": [r["answer"] for r in rows],
        "rejected": [y[1] for y in ys],
        "prompt_ids": prompts, "chosen_ids": chosen, "rejected_ids": [y[0] for y in ys],
        "finish_reason": [y[2] for y in ys],
        "iteration": [t] * len(rows), "generator": [generator] * len(rows)})


def sequence_logliks(engine: HFEngine, prompts: list[list[int]], completions: list[list[int]]
                     ) -> list[float]:
    return [float(sum(lp)) for lp in engine.score(prompts, completions, batch_size=32)]


def load_model(cfg: SpinConfig, path: str | None, state: PartialState, lora: bool) -> tuple[Any, Any]:
    device = "cpu" if state.device.type == "cpu" else str(state.device)
    return load_policy(cfg, model_name_or_path=path, device=device, use_lora=lora)


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


def trainer_args(cfg: SpinConfig, out: Path, on_cpu: bool, **kw: Any) -> dict[str, Any]:
    return dict(output_dir=str(out), per_device_train_batch_size=cfg.per_device_train_batch_size,
                gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                lr_scheduler_type=cfg.lr_scheduler_type, warmup_steps=cfg.warmup_steps,
                gradient_checkpointing=cfg.gradient_checkpointing, logging_steps=cfg.logging_steps,
                save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=1,
                use_cpu=on_cpu, bf16=not on_cpu and cfg.dtype in ("auto", "bfloat16"),
                report_to="none", seed=cfg.seed, data_seed=cfg.seed,
                disable_tqdm=not cfg.progress, **kw)


def last_trainer_checkpoint(path: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(path)) if path.is_dir() else None


def save_dataset(ds: Any, final_dir: Path, state: PartialState) -> None:
    if state.is_main_process:
        with atomic_dir(final_dir) as tmp:
            ds.save_to_disk(str(tmp / "ds"))
    state.wait_for_everyone()


def load_dataset_dir(final_dir: Path) -> Any:
    import datasets

    return datasets.load_from_disk(str(final_dir / "ds"))


def sft_phase(cfg: SpinConfig, start: str | None, out: Path, prompts: list[list[int]],
              answers: list[list[int]], tokenizer: Any, state: PartialState) -> Path:
    """Supervised fine-tuning of ``start`` on the data answers (loss on the answer tokens),
    ``sft_epochs`` epochs at ``sft_learning_rate``; saved as ``out/checkpoint-0``."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    model, _ = load_model(cfg, start, state, lora=cfg.use_lora)
    if not cfg.use_lora:
        model.float()  # float32 master weights (AdamW loses bf16 updates); bf16=True autocasts
    sft = datasets.Dataset.from_dict({
        "input_ids": [p + y for p, y in zip(prompts, answers)],
        "completion_mask": [[0] * len(p) + [1] * len(y) for p, y in zip(prompts, answers)]})
    args = SFTConfig(**trainer_args(cfg, out / "sft", state.device.type == "cpu", num_train_epochs=cfg.sft_epochs,
                                    learning_rate=cfg.sft_learning_rate),
                     completion_only_loss=True, max_length=None, packing=False)
    trainer = SFTTrainer(model=model, args=args, train_dataset=sft, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=last_trainer_checkpoint(out / "sft"))
    save_iterate(trainer, tokenizer, out / "checkpoint-0", {"iteration": 0, "phase": "sft"})
    if state.is_main_process:
        shutil.rmtree(out / "sft", ignore_errors=True)
    return out / "checkpoint-0"


# --- evaluation on held-out prompts --------------------------------------------------------

def held_out_scores(engine: HFEngine, state: PartialState, held: list[dict[str, Any]],
                    prompts: list[list[int]], chosen: list[list[int]], rejected: list[list[int]],
                    gen_len: int, cfg: SpinConfig) -> list[dict[str, Any]]:
    """Per held-out prompt, under the model in ``engine``: log p(y|x) of the data answer,
    log p(y'|x) of the iteration opponent's answer, the answer length, the greedy answer and
    whether its final answer is right. Every process takes its share; all get every row."""

    def shard(ii: list[int]) -> list[dict[str, Any]]:
        ll_y = sequence_logliks(engine, [prompts[i] for i in ii], [chosen[i] for i in ii])
        ll_r = sequence_logliks(engine, [prompts[i] for i in ii], [rejected[i] for i in ii])
        greedy = generate(engine, [prompts[i] for i in ii], SamplingParams(gen_len, temperature=0.0),
                          cfg.generation_batch_size, False, "eval")
        return [{"loglik": a, "loglik_rejected": b, "answer_tokens": len(chosen[i]), "greedy": g.text,
                 "correct": answers_match(g.text, held[i]["answer"], held[i]["final"])}
                for i, a, b, g in zip(ii, ll_y, ll_r, greedy)]

    return sharded(state, list(range(len(held))), shard)


def summarize(scores: list[dict[str, Any]]) -> dict[str, float]:
    """Mean margin log p(y|x) - log p(y'|x), data-answer log-likelihood (with its 95%
    half-width), per-token log-likelihood and greedy exact-answer accuracy (95% Wilson)."""
    n = len(scores)
    ll = [s["loglik"] for s in scores]
    correct = sum(s["correct"] for s in scores)
    lo, hi = wilson(correct, n)
    return {"eval/margin": sum(s["loglik"] - s["loglik_rejected"] for s in scores) / n,
            "eval/answer_loglik": sum(ll) / n,
            "eval/answer_loglik_ci": mean_ci_half_width(ll),
            "eval/answer_loglik_per_token": sum(ll) / sum(s["answer_tokens"] for s in scores),
            "eval/accuracy": correct / n, "eval/accuracy_ci_low": lo, "eval/accuracy_ci_high": hi}


def held_out_metrics(engine: HFEngine, state: PartialState, held: list[dict[str, Any]],
             prompts: list[list[int]], chosen: list[list[int]], rejected: list[list[int]],
             gen_len: int, cfg: SpinConfig, save_to: Path | None = None) -> dict[str, float]:
    """:func:`summarize` of :func:`held_out_scores`; the per-prompt rows also go to ``save_to``
    (JSON lines, main process, atomic) so runs can be compared prompt by prompt (paired)."""
    scores = held_out_scores(engine, state, held, prompts, chosen, rejected, gen_len, cfg)
    if save_to is not None and state.is_main_process:
        atomic_write_text(save_to, "".join(json.dumps(s) + "\n" for s in scores))
    return summarize(scores)


def mean_ci_half_width(xs: list[float], z: float = 1.96) -> float:
    """Half-width of the normal-approximation 95% interval of the mean of ``xs``."""
    if len(xs) < 2:
        return float("nan")
    m = sum(xs) / len(xs)
    return z * math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


# --- the recipe ----------------------------------------------------------------------------

def supervised_data(cfg: SpinConfig, run: Run) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The supervised train and held-out sets: generated or loaded once, saved with the run
    (``data/``) so a resume sees the same sets."""
    import datasets

    out = run.out
    if (out / "data" / "COMPLETE").exists():
        sup = load_dataset_dir(out / "data")
        return sup["train"].to_list(), sup["eval"].to_list()
    train_rows, held = load_supervised(cfg.dataset, cfg.num_train_examples, cfg.num_eval_examples,
                                       cfg.seed, cfg.dataset_split)
    save_dataset(datasets.DatasetDict({"train": datasets.Dataset.from_list(train_rows),
                                       "eval": datasets.Dataset.from_list(held)}), out / "data", run.acc)
    return train_rows, held


@dataclass
class Pairs:
    """The tokenized data: prompts and data answers of the train and held-out sets."""

    tokenizer: Any
    p_train: list[list[int]]
    y_train: list[list[int]]
    p_held: list[list[int]]
    y_held: list[list[int]]
    gen_len: int  # the answer budget of y' (and of the greedy held-out answers)


def tokenized(cfg: SpinConfig, run: Run, source: str | None, train_rows, held) -> Pairs:
    tokenizer = load_tokenizer(source, prompt_style_of(cfg))
    p_train, y_train, cut_train = tokenize_pairs(tokenizer, train_rows, cfg.max_completion_length)
    gen_len = cfg.max_completion_length or max(len(c) for c in y_train)
    p_held, y_held, _ = tokenize_pairs(tokenizer, held, gen_len)
    if cut_train and run.is_main:
        print(f"note: {cut_train} data answers are longer than max_completion_length={gen_len} "
              f"and were cut (no EOS)", file=sys.stderr)
    return Pairs(tokenizer, p_train, y_train, p_held, y_held, gen_len)


def opponent_dataset(cfg: SpinConfig, run: Run, engine: HFEngine, pairs: Pairs, train_rows, held, t: int,
                     theta_t: str | None) -> Any:
    """Steps 1-2 of iteration ``t`` (once: saved in ``iter-t/data``): y' ~ p_theta_t(.|x) for
    every training and held-out prompt, from the same prompt ids the trainer will see, up to
    the training length; chosen = data answer, rejected = y', tagged."""
    import datasets

    it_dir = run.out / f"iter-{t}"
    if not (it_dir / "data" / "COMPLETE").exists():
        state = run.acc
        sp = SamplingParams(max_new_tokens=pairs.gen_len, temperature=cfg.temperature, top_p=cfg.top_p,
                            seed=cfg.seed * 1_000_003 + 7919 * t + 104_729 * state.process_index)
        gen = sharded(state, pairs.p_train + pairs.p_held, lambda ps: opponent_answers(
            engine, ps, sp, cfg, f"generate y' (iteration {t})"))
        n, who, tok = len(pairs.p_train), str(theta_t), pairs.tokenizer
        save_dataset(datasets.DatasetDict({
            "train": iteration_dataset(tok, train_rows, pairs.p_train, pairs.y_train, gen[:n], t, who),
            "eval": iteration_dataset(tok, held, pairs.p_held, pairs.y_held, gen[n:], t, who)}),
            it_dir / "data", state)
    return load_dataset_dir(it_dir / "data")


def dpo_update(cfg: SpinConfig, run: Run, model: Any, pairs: Pairs, data: Any, t: int, theta_t: str | None,
               lam: float) -> tuple[Path, dict[str, Any]]:
    """Step 3: theta_{t+1} by DPO with beta = lambda_t against the frozen reference theta_t,
    saved as ``checkpoint-<t+1>`` (the next iteration starts from it); its training stats."""
    from trl import DPOConfig

    it_dir = run.out / f"iter-{t}"
    if cfg.use_lora:
        del model
        model, _ = load_model(cfg, theta_t, run.acc, lora=True)
        ref_model = None  # reference = adapter disabled = theta_t (TRL does this for PEFT)
    else:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        model.float()  # float32 master weights (AdamW loses bf16 updates); bf16=True autocasts
    args = DPOConfig(**trainer_args(cfg, it_dir / "trainer", run.acc.device.type == "cpu",
                                    num_train_epochs=cfg.num_train_epochs, learning_rate=cfg.learning_rate),
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


PLOT_KEYS = ["eval/accuracy", "eval/margin", "eval/answer_loglik", "eval/answer_loglik_per_token",
             "train/loss", "train/reward_accuracy"]


def log_iteration(run: Run, t: int, row: dict[str, Any]) -> None:
    """The iteration's row in the log, the curves and a one-line summary (main process)."""
    run.log(t + 1, row)
    if run.is_main:
        run.logger.plot(PLOT_KEYS, "spin_metrics.png", title="SPIN on held-out prompts")
        print(json.dumps({"iteration": t + 1, **{k: round(v, 4) if isinstance(v, float) else v
                                                   for k, v in row.items()}}), file=sys.stderr)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse_config(SpinConfig, argv)
    with Run(cfg, trains_with="state") as run:
        out, state = run.out, run.acc
        torch.manual_seed(cfg.seed)
        train_rows, held = supervised_data(cfg, run)
        # theta_0: the given model, or the output of the optional SFT phase (checkpoint-0).
        base = resolve_model_path(cfg.model_name_or_path)  # None -> the embedded model's folder
        last = run.checkpoint
        start = int(last.name.split("-")[1]) if last is not None else 0
        pairs = tokenized(cfg, run, str(last) if last is not None else base, train_rows, held)
        if last is None and cfg.sft_epochs > 0:
            sft_phase(cfg, base, out, pairs.p_train, pairs.y_train, pairs.tokenizer, state)
        run.report_start(start, "iteration")
        if start >= cfg.spin_iterations and run.is_main:
            print(f"{out}: all {cfg.spin_iterations} iterations are done", file=sys.stderr)
        run.open_log(start if start > 0 else None)
        summary: dict[str, Any] = {"iterations": []}
        for t in tqdm(range(start, cfg.spin_iterations), desc="SPIN", disable=not cfg.progress):
            t0 = time.time()
            theta_t = str(out / f"checkpoint-{t}") if (out / f"checkpoint-{t}").exists() else base
            model, _ = load_model(cfg, theta_t, state, lora=False)
            engine = HFEngine(model, pairs.tokenizer, max_batch_size=cfg.generation_batch_size, version=t)
            # 1-2. the opponent theta_t answers every prompt: the iteration's (data, y') pairs
            data = opponent_dataset(cfg, run, engine, pairs, train_rows, held, t, theta_t)
            r_held = data["eval"]["rejected_ids"]
            if t == 0:  # theta_0 on the held-out set (every process takes its share)
                run.log(0, held_out_metrics(engine, state, held, pairs.p_held, pairs.y_held, r_held, pairs.gen_len,
                                            cfg, out / "eval" / "step-0.jsonl"))
            same = sum(a == b for a, b in zip(data["train"]["chosen_ids"], data["train"]["rejected_ids"]))
            # 3. theta_{t+1}: DPO with beta = lambda_t against the frozen reference theta_t
            lam = beta_at(cfg, t)
            nxt, train_stats = dpo_update(cfg, run, model, pairs, data, t, theta_t, lam)
            del model, engine
            # Held-out metrics under theta_{t+1} (y' still the opponent theta_t's answers).
            model, _ = load_model(cfg, str(nxt), state, lora=False)
            metrics = held_out_metrics(HFEngine(model, pairs.tokenizer, cfg.generation_batch_size, t + 1), state,
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
