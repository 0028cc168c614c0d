"""Peak memory of a trainer step and of HF-engine generation at a real vocabulary size,
measured side by side in one run (each case in a fresh process).

The model is a stand-in built from config (nothing downloaded): a Qwen2ForCausalLM with 2
layers x 64 wide and Qwen's 151936-entry vocabulary, so the vocabulary-sized tensors dominate
as they do on real models. Rows:

  trainer     one ``PolicyTrainer.step`` on B samples, with ``max_tokens_per_micro_batch`` = the
              cap and = 0 (no cap: one micro-batch holds the whole batch). Capped, the peak
              should stay flat as B grows past the cap; uncapped it grows with B.
  logprobs    forward + backward of the sampled tokens' log-probs and entropies from (B, T, V)
              logits: :func:`lmselfplay.lm.batching.logprobs_from_logits` (float32 blocks)
              against the full float32 ``log_softmax`` over (B, T, V).
  generation  ``HFEngine.generate`` of B prompts, with ``max_batch_size`` = the cap's rows and
              = 256; what it keeps per token is whatever ``lmselfplay/lm/engines/hf.py`` does.
  evaluation  ``HFEngine.score`` of B (prompt, completion) pairs — the exact game metrics' readout —
              projecting onto the vocabulary only the completion positions, a bounded number per
              forward (``kept``: :func:`lmselfplay.lm.batching.sequence_logprobs`), against one
              forward's full (B, T, V) logits (``full``). Kept, the peak stays flat as B grows.

Peak memory: on a GPU ``torch.cuda.max_memory_allocated`` during the measured call; on the CPU
the process's peak resident set (VmHWM, reset at the call) minus its resident set just before
the call, with glibc told to map every block of 64 KB or more on its own
(``MALLOC_MMAP_THRESHOLD_=65536``) so that freed tensors leave the resident set at once; with
its default heap, memory freed between micro-batches stays resident and the peak measures the
allocator's fragmentation instead of what the step holds.

    python benchmarks/bench_memory.py [--quick] [--batches 4 16 64] [--cap 256] [--parts ...] [--out FILE]
    python benchmarks/bench_memory.py --parts evaluation --batches 16 64 256 --prompt-len 96 --completion-len 8
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil
import torch
import torch.nn.functional as F

VOCAB = 151936  # Qwen2.5 / Qwen3


def stand_in(device: torch.device, vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=1, pad_token_id=0)
    return Qwen2ForCausalLM(cfg).to(device)


def word_tokenizer(vocab: int):
    """A tokenizer over the stand-in's ids (the engine decodes what it samples)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, vocab)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux); False if unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    """Bytes: VmHWM of this process (since the last reset), else ``ru_maxrss`` (since start)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Peak:
    """Peak memory (MB) above the level at entry, of the block it wraps."""

    def __init__(self, device: torch.device):
        self.device, self.mb = device, 0.0

    def __enter__(self):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            reset_peak_rss()
            self.start = psutil.Process().memory_info().rss
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.mb = (torch.cuda.max_memory_allocated() - self.start) / 2**20
        else:
            self.mb = (peak_rss() - self.start) / 2**20


def samples(batch: int, prompt_len: int, completion_len: int, vocab: int):
    from lmselfplay.lm.trajectory import Sample

    g = torch.Generator().manual_seed(batch)
    return [Sample(torch.randint(2, vocab, (prompt_len,), generator=g).tolist(),
                   torch.randint(2, vocab, (completion_len,), generator=g).tolist(),
                   (-torch.rand(completion_len, generator=g) * 10).tolist(), advantage=float(i % 3 - 1))
            for i in range(batch)]


def case_trainer(c: dict, device: torch.device) -> float:
    from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig

    cfg = TrainerConfig(learning_rate=1e-4, beta=0.0, num_iterations=1, merge_identical=False,
                        max_tokens_per_micro_batch=c["cap"])
    trainer = PolicyTrainer(stand_in(device, c["vocab"]), SimpleNamespace(pad_token_id=0), cfg)
    batch = samples(c["batch"], c["prompt_len"], c["completion_len"], c["vocab"])
    with Peak(device) as peak:
        trainer.step(batch)
    return peak.mb


def full_log_softmax(logits: torch.Tensor, ids: torch.Tensor):
    """The (B, T, V) float32 computation the blocks replace."""
    logp_all = F.log_softmax(logits[:, :-1].float(), dim=-1)
    lp = logp_all.gather(2, ids[:, 1:].unsqueeze(2)).squeeze(2)
    return lp, -(logp_all.exp() * logp_all).sum(-1)


def case_logprobs(c: dict, device: torch.device) -> float:
    from lmselfplay.lm.batching import logprobs_from_logits

    width = c["prompt_len"] + c["completion_len"]
    logits = torch.randn(c["batch"], width, c["vocab"], device=device, requires_grad=True)
    ids = torch.randint(0, c["vocab"], (c["batch"], width), device=device)
    with Peak(device) as peak:
        if c["cap"] == "blocks":
            lp, ent = logprobs_from_logits(logits, ids, 1.0, True)
        else:
            lp, ent = full_log_softmax(logits, ids)
        (lp.sum() + ent.sum()).backward()
    return peak.mb


def case_generation(c: dict, device: torch.device) -> float:
    from lmselfplay.lm.engines import HFEngine, SamplingParams

    engine = HFEngine(stand_in(device, c["vocab"]).eval(), word_tokenizer(c["vocab"]), max_batch_size=c["cap"])
    prompts = [p.prompt_ids for p in samples(c["batch"], c["prompt_len"], 1, c["vocab"])]
    sp = SamplingParams(max_new_tokens=c["completion_len"], temperature=1.0, top_p=1.0, seed=0)
    with Peak(device) as peak:
        engine.generate(prompts, sp)
    return peak.mb


def case_evaluation(c: dict, device: torch.device) -> float:
    from lmselfplay.lm.engines import HFEngine

    engine = HFEngine(stand_in(device, c["vocab"]).eval(), word_tokenizer(c["vocab"]))
    batch = samples(c["batch"], c["prompt_len"], c["completion_len"], c["vocab"])
    prompts, completions = [s.prompt_ids for s in batch], [s.completion_ids for s in batch]
    with Peak(device) as peak:
        if c["cap"] == "kept":
            engine.score(prompts, completions)
        else:  # what scoring did before: the whole logits tensor of one forward
            ids = torch.tensor([p + q for p, q in zip(prompts, completions)], device=device)
            with torch.no_grad():
                full_log_softmax(engine.model(input_ids=ids).logits, ids)
    return peak.mb


CASES = {"trainer": case_trainer, "logprobs": case_logprobs, "generation": case_generation,
         "evaluation": case_evaluation}


def run_case(c: dict, fresh: bool, device: torch.device) -> float:
    """One case, in a fresh interpreter when ``fresh`` (its peak is then its own)."""
    if not fresh:
        return CASES[c["part"]](c, device)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run([sys.executable, __file__, "--case", json.dumps(c)], capture_output=True, text=True,
                          timeout=1800, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"case {c} failed:\n{proc.stderr[-3000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def table(name: str, rows: list[dict], low: str, high: str) -> None:
    print(f"\n{name}: peak MB  ({low} vs {high}, ratio {high}/{low})")
    for b in sorted({r["batch"] for r in rows}):
        a = next(r["peak_mb"] for r in rows if r["batch"] == b and str(r["cap"]) == low)
        z = next(r["peak_mb"] for r in rows if r["batch"] == b and str(r["cap"]) == high)
        print(f"  batch {b:4d}: {a:9.1f} {z:9.1f}   x{z / max(a, 1e-9):6.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes, every case in this process (checks the script runs; numbers not comparable)")
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--completion-len", type=int, default=16)
    ap.add_argument("--cap", type=int, default=256, help="max_tokens_per_micro_batch of the capped rows")
    ap.add_argument("--out", default=None, help="results file (default benchmarks/results/memory.json)")
    ap.add_argument("--parts", nargs="+", default=["trainer", "logprobs", "generation", "evaluation"],
                    choices=list(CASES))
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    if args.case:
        c = json.loads(args.case)
        print(CASES[c["part"]](c, device))
        return
    if args.quick:
        args.batches, args.prompt_len, args.completion_len, args.cap, args.vocab = [2, 8], 4, 4, 16, 2048
    shape = {"prompt_len": args.prompt_len, "completion_len": args.completion_len, "vocab": args.vocab}
    rows_of_cap = max(1, args.cap // (args.prompt_len + args.completion_len))
    plan = {"trainer": [args.cap, 0], "logprobs": ["blocks", "full"], "generation": [rows_of_cap, 256],
            "evaluation": ["kept", "full"]}
    results: dict = {"device": device.type, "cap_tokens": args.cap, "fresh_process_per_case": not args.quick,
                     **shape}
    for part, caps in ((p, plan[p]) for p in args.parts):
        results[part] = [{"part": part, "batch": b, "cap": cap, **shape} for b in args.batches for cap in caps]
        for r in results[part]:
            r["peak_mb"] = run_case(r, not args.quick, device)
        table(part, results[part], str(caps[0]), str(caps[1]))
    from lmselfplay.utils.results import save_results

    out = Path(args.out) if args.out else None
    save_results(out.stem if out else "memory", results, out.parent if out else None)


if __name__ == "__main__":
    main()
