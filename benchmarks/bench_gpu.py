"""The main job's trainer step and the HF engine on one GPU, with no vLLM, DeepSpeed or network.

    python benchmarks/bench_gpu.py [--prompts 128] [--new_tokens 128] [--train_steps 3] [--out FILE]
    python benchmarks/bench_gpu.py --dry_run      # CPU, tiny sizes: checks the flow (a default test runs it)

For the lent machine's image (Python 3.12, torch 2.11 + CUDA 13, transformers 5.17, accelerate,
peft; nothing installable): it imports only those (and the standard library), and this checkout's
``lmselfplay`` from its folder when it is not installed (:func:`mount_checkout`). TRL's
``GRPOTrainer`` runs beside it only when ``trl`` and ``datasets`` import (their wheels can travel
with the call); otherwise its row says why it is missing. Well under 8 minutes on one H200.

The model is a Qwen2.5-0.5B-shaped stand-in built from config (24 layers, hidden 896, 14 query /
2 KV heads, MLP 4864, tied embeddings, the real 151,936-entry vocabulary) with random weights,
loaded in bfloat16 as the main job loads it on a GPU; ``PolicyTrainer`` then holds float32 master
weights and computes under bfloat16 autocast (:func:`lmselfplay.rl.trainer.master_weights`). The
tokenizer is the Qwen2.5 stand-in's (:mod:`lmselfplay.models.standins`: real chat template and
special tokens). Prompts are the main job's (tic-tac-toe and Nim positions through THE formatter).
Measured, each with its peak GPU memory (``torch.cuda.max_memory_allocated``; on CPU none):

  generation  ``HFEngine.generate`` of ``--prompts`` prompts x ``--new_tokens`` tokens (T = 1):
              generated tokens/s
  training    ``PolicyTrainer.step`` (the main job's defaults: 2 PPO passes, KL to the initial
              policy, the token cap per micro-batch) on those completions: trained tokens/s
              (prompt + completion) and seconds per step
  trl         the same batch shape in TRL's ``GRPOTrainer`` (generation + step), if it imports

Writes ``gpu.json`` (``gpu_dry.json`` for ``--dry_run``) under ``$OUT`` when set, else
benchmarks/results/, or ``--out FILE``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FULL = {"layers": 24, "hidden": 896, "heads": 14, "kv_heads": 2, "mlp": 4864, "vocab": 151936,
        "prompts": 128, "new_tokens": 128, "train_steps": 3, "num_generations": 8}
DRY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "mlp": 128, "vocab": 2048,
       "prompts": 4, "new_tokens": 6, "train_steps": 1, "num_generations": 2}


def mount_checkout() -> None:
    """Make ``lmselfplay`` importable from this checkout when it is not installed: the package
    folder, and the folders pyproject's ``package-dir`` maps into it (games, verifiers, eval)."""
    try:
        import lmselfplay.games  # noqa: F401
        return
    except ImportError:
        pass
    sys.path.insert(0, str(ROOT))
    import lmselfplay

    for name in ("games", "verifiers", "eval"):
        spec = importlib.util.spec_from_file_location(f"lmselfplay.{name}", ROOT / name / "__init__.py",
                                                      submodule_search_locations=[str(ROOT / name)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        setattr(lmselfplay, name, module)
        spec.loader.exec_module(module)


class Clock:
    """Wall seconds and peak GPU memory of the block it wraps (the device synchronized)."""

    def __init__(self, device: torch.device):
        self.device, self.seconds, self.peak_gb = device, 0.0, None

    def __enter__(self) -> Clock:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_gb = torch.cuda.max_memory_allocated() / 2**30
        self.seconds = time.perf_counter() - self.t0


def stand_in(s: dict, tok, device: torch.device, dtype: torch.dtype):
    """The Qwen2.5-0.5B-shaped model (random weights), declared and loaded in ``dtype``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["mlp"],
                      num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                      num_key_value_heads=s["kv_heads"], max_position_embeddings=32768, rope_theta=1e6,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None, dtype=dtype)
    return Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype)


def game_prompts(tok, n: int) -> list[list[int]]:
    """``n`` main-job prompts: tic-tac-toe and Nim positions a few random moves in."""
    from lmselfplay.games import make
    from lmselfplay.lm.prompt import encode_prompt

    rng, games, out = random.Random(0), [make("tictactoe"), make("nim")], []
    for i in range(n):
        game = games[i % 2]
        state = game.new_initial_state()
        for _ in range(rng.randrange(3)):
            if not game.is_terminal(state):
                state = game.apply(state, rng.choice(game.legal_actions(state)))
        out.append(encode_prompt(tok, game.observation_text(state, game.current_player(state))))
    return out


def measure_ours(s: dict, tok, prompts: list[list[int]], device: torch.device, dtype: torch.dtype) -> dict:
    """HFEngine generation, then PolicyTrainer steps on its completions (the main job's path)."""
    from lmselfplay.lm.engines import HFEngine, SamplingParams
    from lmselfplay.lm.trajectory import Sample
    from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig

    trainer = PolicyTrainer(stand_in(s, tok, device, dtype), tok,
                            TrainerConfig(learning_rate=1e-6), total_steps=max(s["train_steps"] + 1, 2))
    engine = HFEngine(trainer.unwrapped, tok, max_batch_size=len(prompts))
    sp = SamplingParams(max_new_tokens=s["new_tokens"], temperature=1.0, seed=0)
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=2, temperature=1.0, seed=1))  # kernels warm
    with Clock(device) as gen:
        outs = engine.generate(prompts, sp)
    generated = sum(len(o.token_ids) for o in outs)
    samples = [Sample(o.prompt_ids, o.token_ids, o.logprobs, advantage=1.0 if i % 2 else -1.0, role="bench/p0")
               for i, o in enumerate(outs) if o.token_ids]
    trained = sum(len(x.prompt_ids) + len(x.completion_ids) for x in samples)
    trainer.step(samples)  # warm (allocator, autocast caches)
    with Clock(device) as train:
        for _ in range(s["train_steps"]):
            metrics = trainer.step(samples)
    return {"generation": {"tokens": generated, "seconds": gen.seconds, "tokens_per_s": generated / gen.seconds,
                           "peak_gb": gen.peak_gb},
            "training": {"tokens_per_step": trained, "seconds_per_step": train.seconds / s["train_steps"],
                         "tokens_per_s": trained * s["train_steps"] / train.seconds, "peak_gb": train.peak_gb,
                         "logprob_diff": metrics.get("logprob_diff"), "micro_batch_cap": trainer.cfg.max_tokens_per_micro_batch},
            "master_dtype": str(next(trainer.unwrapped.parameters()).dtype),
            "parameters_m": sum(p.numel() for p in trainer.unwrapped.parameters()) / 1e6}


def measure_trl(s: dict, tok, prompts: list[list[int]], device: torch.device, dtype: torch.dtype) -> dict:
    """TRL's GRPOTrainer on the same prompts, completion budget, PPO passes and KL (generation +
    step per optimizer step); a row saying why when trl / datasets do not import or it fails."""
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer, __version__
    except ImportError as e:
        return {"skipped": f"{e.name or e} does not import"}
    texts = [tok.decode(p) for p in prompts]
    tokens = []

    def reward(completions, **_):
        tokens.append(sum(len(tok(c, add_special_tokens=False)["input_ids"]) for c in completions))
        return [float(i % 2) for i in range(len(completions))]

    steps = s["train_steps"] * 2  # num_iterations 2: one TRL batch = 2 optimizer steps, as ours
    cuda = device.type == "cuda"
    try:
        cfg = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="bench-gpu-trl-"), use_cpu=not cuda, bf16=cuda,
                         report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
                         per_device_train_batch_size=len(prompts), num_generations=s["num_generations"],
                         max_completion_length=s["new_tokens"], num_iterations=2, beta=0.1, loss_type="dapo",
                         temperature=1.0, top_p=1.0, top_k=0, learning_rate=1e-6, max_steps=steps + 2,
                         lr_scheduler_type="constant", dataloader_num_workers=0, remove_unused_columns=False)
        model = stand_in(s, tok, device, torch.float32)  # TRL keeps fp32 weights under its bf16 autocast
        folder = tempfile.mkdtemp(prefix="bench-gpu-model-")  # TRL reads the model's name_or_path
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        model.name_or_path = model.config._name_or_path = folder
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, processing_class=tok,
                              train_dataset=Dataset.from_dict({"prompt": texts * 4}))
        with Clock(device) as clock:
            trainer.train()
    except Exception as e:  # a TRL version whose API differs: the row says so, ours still stands
        return {"error": f"{type(e).__name__}: {str(e)[:300]}", "trl": __version__}
    per_step = clock.seconds / (steps + 2)
    return {"trl": __version__, "seconds_per_optimizer_step": per_step, "completion_tokens": sum(tokens),
            "completion_tokens_per_s": sum(tokens) / clock.seconds, "peak_gb": clock.peak_gb,
            "note": "generation + old/ref log-probs + step, TRL's own loop"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry_run", action="store_true", help="CPU, tiny sizes (the numbers mean nothing)")
    for key, value in FULL.items():
        ap.add_argument(f"--{key}", type=int, default=None, help=f"default {value} (dry run: {DRY[key]})")
    ap.add_argument("--no_trl", action="store_true", help="skip TRL's GRPOTrainer even if it imports")
    ap.add_argument("--out", default=None, help="results file (default: $OUT or benchmarks/results)")
    args = ap.parse_args(argv)
    mount_checkout()
    from lmselfplay.models.policy import load_tokenizer
    from lmselfplay.models.standins import ensure_standin
    from lmselfplay.utils.results import save_results

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        print("no CUDA device: run with --dry_run for the CPU check", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32  # the main job's load: bf16 on a GPU, fp32 on a CPU
    s = {k: getattr(args, k) if getattr(args, k) is not None else (DRY if args.dry_run else FULL)[k] for k in FULL}
    tok = load_tokenizer(str(ensure_standin("qwen2.5-instruct")))
    prompts = game_prompts(tok, s["prompts"])
    t0 = time.perf_counter()
    results = {"dry_run": args.dry_run, "sizes": s, "device": torch.cuda.get_device_name() if cuda else "cpu",
               "torch": torch.__version__, "transformers": __import__("transformers").__version__,
               "python": platform.python_version(), "load_dtype": str(dtype),
               "ours": measure_ours(s, tok, prompts, device, dtype)}
    results["trl"] = {"skipped": "--no_trl"} if args.no_trl else measure_trl(s, tok, prompts, device, dtype)
    results["wall_s"] = time.perf_counter() - t0
    print(json.dumps(results, indent=1, default=str))
    name = "gpu_dry" if args.dry_run else "gpu"
    out = Path(args.out) if args.out else None
    save_results(out.stem if out else name, results, out.parent if out else os.environ.get("OUT") or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
