"""Learning, side by side: this project's RLVR (``recipes/rlvr.py``) against TRL's ``GRPOTrainer``
and a supervised control, on the same model, task set, held-out items, reward and budget.

Arms, each from the same starting weights, per seed:

* ``ours``: the recipe itself (``run_recipe("rlvr", ...)``), its ``eval/heldout/accuracy`` rows;
* ``trl``: ``GRPOTrainer`` on the same questions in the same order (the recipe's training stream,
  ``TaskSet.training_batch(step, prompts_per_step)``), the same prompt token ids (THE formatter),
  reward = the same :class:`~lmselfplay.verifiers.task_referee.TaskReferee`, the same group size,
  learning rate, warm-up, clip, beta, passes per batch (``num_iterations``), token-mean loss
  (``loss_type="dapo"``), group-scaled advantages, temperature and answer budget; ``max_steps``
  batches. Its held-out accuracy is measured by the same greedy evaluation as ours;
* ``sft``: the same trainer as ours on the items' worked answers (``TaskItem.worked``, else the
  answer in its format), advantage 1, no KL, one pass: supervised learning on the same questions,
  one answer each (the control that says how fast this model can learn the task at all).

It prints each arm's held-out accuracy before and after (95% Wilson intervals), the gain, the
mean and worst gain over seeds, the ratio of our gain to TRL's and each arm's wall time, and
writes ``benchmarks/results/bench_rlvr.json`` (``--name`` for another file).

    python benchmarks/bench_rlvr.py [--model embedded:v8] [--task arithmetic] [--seeds 0 1 2]
        [--max-steps 200] [--arms ours,trl,sft] [--learning-rate 1e-4] [--warmup-steps 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from lmselfplay.lm.engines import HFEngine, SamplingParams
from lmselfplay.lm.prompt import encode_completion, encode_prompt, text_for_prompt_ids
from lmselfplay.lm.trajectory import Sample
from lmselfplay.models.policy import PolicyConfig, load_policy, resolve_model_path
from lmselfplay.rl.trainer import PolicyTrainer, SurrogateConfig, TrainerConfig
from lmselfplay.rlvr.metrics import heldout_accuracy
from lmselfplay.tasks.task_sets import TaskItem, TaskSet
from lmselfplay.utils.recipe_loader import run_recipe
from lmselfplay.utils.results import save_results
from lmselfplay.verifiers.task_referee import TaskReferee


def heldout(model: Any, tok: Any, items: list[TaskItem], referee: TaskReferee, max_new_tokens: int) -> dict:
    """Greedy held-out accuracy of ``model``: the recipe's own evaluation (:func:`heldout_accuracy`)."""
    greedy = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, seed=0)
    return heldout_accuracy(HFEngine(model, tok), tok, referee, items, greedy)


def run_ours(a: argparse.Namespace, seed: int, out: Path) -> tuple[list[dict], float]:
    t0 = time.perf_counter()
    argv = ["--model_name_or_path", a.model, "--task", a.task, "--heldout_size", str(a.heldout_size),
            "--max_steps", str(a.max_steps), "--prompts_per_step", str(a.prompts_per_step),
            "--num_generations", str(a.num_generations), "--max_new_tokens", str(a.max_new_tokens),
            "--learning_rate", str(a.learning_rate), "--warmup_steps", str(a.warmup_steps),
            "--num_iterations", str(a.num_iterations), "--beta", str(a.beta), "--epsilon", str(a.epsilon),
            "--eval_every", str(a.eval_every), "--checkpoint_every", "0", "--seed", str(seed),
            "--output_dir", str(out), "--tensorboard", "false"]
    if a.task_config:
        argv += ["--task_config", a.task_config]
    run_recipe("rlvr", argv)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval/heldout/accuracy" in r], time.perf_counter() - t0


def trainer_config(a: argparse.Namespace, **kw: Any) -> TrainerConfig:
    fields = {"learning_rate": a.learning_rate, "warmup_steps": a.warmup_steps, "num_iterations": a.num_iterations,
              "beta": a.beta}
    cfg = TrainerConfig(**(fields | kw))
    cfg.validate()
    return cfg


def run_sft(a: argparse.Namespace, seed: int, tasks: TaskSet, referee: TaskReferee) -> tuple[list[dict], float]:
    torch.manual_seed(seed)
    model, tok = load_policy(PolicyConfig(model_name_or_path=a.model), device="cpu")
    trainer = PolicyTrainer(model, tok, trainer_config(a, num_iterations=1, beta=0.0),
                            total_steps=a.max_steps, surrogate=SurrogateConfig(), seed=seed)
    engine = HFEngine(trainer.unwrapped, tok)
    rows = [{"step": 0, **heldout(trainer.unwrapped, tok, tasks.heldout, referee, a.max_new_tokens)}]
    t0 = time.perf_counter()
    for step in range(a.max_steps):
        samples = []
        for t in tasks.training_batch(step, a.prompts_per_step):
            target = t.worked or (f"<answer>{t.answer}</answer>" if t.answer_format == "answer" else f"#### {t.answer}")
            p, c = encode_prompt(tok, t.prompt), encode_completion(tok, target)
            samples.append(Sample(p, c, engine.score([p], [c])[0], 1.0, 1.0, "sft", t.kind, trainer.step_count))
        trainer.step(samples, engine=engine)
        if (a.eval_every and (step + 1) % a.eval_every == 0) or step + 1 == a.max_steps:
            rows.append({"step": step + 1, **heldout(trainer.unwrapped, tok, tasks.heldout, referee, a.max_new_tokens)})
    return rows, time.perf_counter() - t0


def run_trl(a: argparse.Namespace, seed: int, tasks: TaskSet, referee: TaskReferee, out: Path) -> tuple[list[dict], float]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(seed)
    model, tok = load_policy(PolicyConfig(model_name_or_path=a.model), device="cpu")
    stream = [t for step in range(a.max_steps) for t in tasks.training_batch(step, a.prompts_per_step)]
    by_text = {text_for_prompt_ids(tok, t.prompt): t for t in stream}

    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return [v.reward for v in referee.score([by_text[p] for p in prompts], completions)]

    rows = [{"step": 0, **heldout(model, tok, tasks.heldout, referee, a.max_new_tokens)}]

    class Evaluate(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001 - TRL's callback signature
            step = state.global_step // a.num_iterations
            if state.global_step % a.num_iterations == 0 and a.eval_every and step % a.eval_every == 0 \
                    and step < a.max_steps:
                rows.append({"step": step, **heldout(model, tok, tasks.heldout, referee, a.max_new_tokens)})

    cfg = GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, fp16=False, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, seed=seed, per_device_train_batch_size=a.prompts_per_step * a.num_generations,
        gradient_accumulation_steps=1, num_generations=a.num_generations, max_completion_length=a.max_new_tokens,
        num_iterations=a.num_iterations, beta=a.beta, epsilon=a.epsilon, loss_type="dapo", scale_rewards="group",
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=a.learning_rate, weight_decay=0.0, max_grad_norm=1.0,
        lr_scheduler_type="constant_with_warmup", warmup_steps=a.warmup_steps * a.num_iterations, optim="adamw_torch",
        max_steps=a.max_steps * a.num_iterations, shuffle_dataset=False, dataloader_num_workers=0,
        dataloader_pin_memory=False, remove_unused_columns=False)
    ds = Dataset.from_dict({"prompt": [text_for_prompt_ids(tok, t.prompt) for t in stream]})
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=ds, processing_class=tok,
                          callbacks=[Evaluate()])
    t0 = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - t0
    rows.append({"step": a.max_steps, **heldout(trainer.model, tok, tasks.heldout, referee, a.max_new_tokens)})
    return rows, elapsed


def summary(rows: list[dict]) -> dict[str, float]:
    first, last = rows[0], rows[-1]
    return {"before": first["eval/heldout/accuracy"], "after": last["eval/heldout/accuracy"],
            "after_ci": [last["eval/heldout/ci_low"], last["eval/heldout/ci_high"]],
            "before_ci": [first["eval/heldout/ci_low"], first["eval/heldout/ci_high"]],
            "gain": last["eval/heldout/accuracy"] - first["eval/heldout/accuracy"],
            "beyond_intervals": last["eval/heldout/ci_low"] > first["eval/heldout/ci_high"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded:v8")
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--task-config", default="")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", default="ours,trl,sft")
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--prompts-per-step", type=int, default=16)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--heldout-size", type=int, default=500)
    ap.add_argument("--learning-rate", type=float, default=1e-4)
    ap.add_argument("--warmup-steps", type=int, default=0)
    ap.add_argument("--num-iterations", type=int, default=2)
    ap.add_argument("--beta", type=float, default=0.05)
    ap.add_argument("--epsilon", type=float, default=0.2)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", default="bench_rlvr")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    a.model = str(resolve_model_path(a.model))
    arms = [x for x in a.arms.split(",") if x]
    referee = TaskReferee()
    results: dict[str, Any] = {"args": vars(a), "arms": {}}
    try:
        for arm in arms:
            per_seed = {}
            for seed in a.seeds:
                tasks = TaskSet(a.task, a.heldout_size, seed=seed,
                                task_config=json.loads(a.task_config) if a.task_config else None)
                with tempfile.TemporaryDirectory() as tmp:
                    if arm == "ours":
                        rows, secs = run_ours(a, seed, Path(tmp) / "run")
                    elif arm == "trl":
                        rows, secs = run_trl(a, seed, tasks, referee, Path(tmp))
                    else:
                        rows, secs = run_sft(a, seed, tasks, referee)
                per_seed[str(seed)] = {"rows": rows, "seconds": secs, **summary(rows)}
                s = per_seed[str(seed)]
                print(f"{arm:5s} seed {seed}: {s['before']:.3f} -> {s['after']:.3f} "
                      f"[{s['after_ci'][0]:.3f}, {s['after_ci'][1]:.3f}] gain {s['gain']:+.3f} ({secs:.0f} s)", flush=True)
            gains = [s["gain"] for s in per_seed.values()]
            results["arms"][arm] = {"seeds": per_seed, "mean_gain": statistics.mean(gains), "worst_gain": min(gains),
                                    "mean_seconds": statistics.mean(s["seconds"] for s in per_seed.values()),
                                    "all_beyond_intervals": all(s["beyond_intervals"] for s in per_seed.values())}
    finally:
        referee.close()
    print("\narm    mean gain  worst gain  beyond CIs on every seed  mean seconds")
    for arm, r in results["arms"].items():
        print(f"{arm:6s} {r['mean_gain']:+.3f}     {r['worst_gain']:+.3f}      {str(r['all_beyond_intervals']):5s}"
              f"                     {r['mean_seconds']:.0f}")
    if "ours" in results["arms"] and "trl" in results["arms"]:
        trl = results["arms"]["trl"]["mean_gain"]
        results["ours_over_trl_gain"] = results["arms"]["ours"]["mean_gain"] / trl if trl else float("nan")
        results["ours_over_trl_seconds"] = results["arms"]["ours"]["mean_seconds"] / results["arms"]["trl"]["mean_seconds"]
        print(f"ours / TRL: gain {results['ours_over_trl_gain']:.2f}x, time {results['ours_over_trl_seconds']:.2f}x")
    print(save_results(a.name, results))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
