"""The colocated vLLM engine: a ``vllm.LLM`` inside the training process, fed the trainer's
weights after every step. Install with ``pip install lmselfplay[vllm]`` (GPU; vLLM is imported
only when an engine is built).

Log-probabilities (the :mod:`~lmselfplay.lm.engines.base` invariant, ``generate(...).logprobs ==
score(prompt, completion)``): the protocol wants ``log_softmax(logits / T)`` *before* top-p.
vLLM returns one of (engine-wide ``logprobs_mode``, vLLM >= 0.10.2):

* ``raw_logprobs``: ``log_softmax(logits)`` before temperature — the protocol's value at T = 1
  (any top-p) and for greedy decoding;
* ``processed_logprobs``: after temperature *and* top-k/top-p (renormalized over the nucleus)
  — the protocol's value at any T when top_p = 1, and for greedy decoding.

No mode gives T != 1 together with top_p < 1; such a call is refused (ValueError) rather than
returning log-probs the trainer's importance ratios would misread. :func:`logprobs_mode_for`
picks the mode from the sampling temperature. ``score`` uses ``prompt_logprobs``, which vLLM
computes before any sampling processor, i.e. at T = 1 only; ``score(temperature != 1)`` is
refused. Tolerance: vLLM and the trainer run different kernels; in float32 they agree to
~1e-5 per token, in bfloat16 to ~1e-2 (what the weight-sync check's threshold allows for).

Completions are cut exactly like the HF engine's: at the first EOS (kept), else at the
shortest prefix whose text contains a stop string (kept). Seeds: one seed per call becomes
per-prompt seeds ``seed + i`` (identical prompts still get independent samples).

Weights: the engine starts from the model's config with dummy weights (``load_format="dummy"``,
no checkpoint on disk) and :meth:`VLLMEngine.update_weights` pushes the trainer's tensors bucket
by bucket (:mod:`~lmselfplay.lm.engines.weight_sync`: ZeRO-3 gathered per bucket, LoRA
merged), then resets the prefix cache (cached KV of the old weights would otherwise be reused).
The engine runs in :func:`engine_dtype` (``vllm_dtype``: the model's declared dtype, not the
trainer's float32 masters) and every bucket is cast to it on the way (:func:`cast_bucket`).
Sleep mode (optional) frees the GPU memory of the KV cache and weights while the trainer steps:
once per step (:meth:`VLLMEngine.sleep`), woken by the next rollout after emptying the CUDA cache.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import torch

from lmselfplay.lm.engines.base import (
    Completion,
    SamplingParams,
    end_token_ids,
    native_stops,
    to_completion,
)
from lmselfplay.lm.engines.weight_sync import SyncStats, iter_state_buckets, iter_weight_buckets

INSTALL_HINT = "pip install lmselfplay[vllm]"
# The tested matrix (docs/scale.md; pyproject's [vllm] extra says the same): vLLM 0.26 is the first
# whose /reset_prefix_cache reports success; 0.33 is refused: nothing here has run it and TRL 1.16
# supports vLLM 0.22-0.31 only. vLLM 0.32.0 (its CPU build) ran the real-engine tests.
VLLM_MIN, VLLM_BELOW = (0, 26), (0, 33)


def check_vllm_version(version: str) -> None:
    """ImportError naming the tested range when ``version`` is outside it."""
    import re

    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None or not VLLM_MIN <= (int(m[1]), int(m[2])) < VLLM_BELOW:
        raise ImportError(f"vLLM {version} is outside the tested range >={VLLM_MIN[0]}.{VLLM_MIN[1]},"
                          f"<{VLLM_BELOW[0]}.{VLLM_BELOW[1]} (0.33 and later never ran here; TRL 1.16 supports vLLM 0.22-0.31): `{INSTALL_HINT}` installs one")


def require_vllm() -> Any:
    """The ``vllm`` module, or an ImportError naming the extra to install (also for a version
    outside the tested range)."""
    try:
        import vllm
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"the vLLM engine needs vLLM, which is not installed: `{INSTALL_HINT}` "
                          f"(a CUDA machine; see docs/scale.md). ({e})") from e
    check_vllm_version(getattr(vllm, "__version__", "unknown"))
    return vllm


def logprobs_mode_for(temperature: float) -> str:
    """The vLLM ``logprobs_mode`` whose values equal the protocol's at this temperature."""
    return "raw_logprobs" if temperature in (0.0, 1.0) else "processed_logprobs"


# vLLM's "off" value of every sampling processor the run's SamplingParams does not turn on. Sent
# explicitly: a server otherwise fills them from the checkpoint's generation_config (Qwen: top_k 20,
# repetition_penalty 1.05), and the sampled tokens would not come from the recorded log-probs.
NEUTRAL_SAMPLING = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                    "frequency_penalty": 0.0}


def sampling_fields(sp: SamplingParams, end_ids: list[int], stops: list[str] | None) -> dict[str, Any]:
    """Every vLLM sampling field of one request, from the run's SamplingParams alone (the HF
    engine's rule): temperature / top_p / max tokens as given, ``stops`` (the engine's own stop
    strings: :func:`~lmselfplay.lm.engines.base.native_stops`) and every end-of-turn token
    (``end_ids``), every other processor off, the sampled tokens' log-probs returned. The
    per-request ``seed`` is added by the caller."""
    greedy = sp.temperature <= 0
    fields: dict[str, Any] = {"n": 1, "max_tokens": int(sp.max_new_tokens), "min_tokens": 0,
                              "temperature": 0.0 if greedy else float(sp.temperature),
                              "top_p": 1.0 if greedy else float(sp.top_p), **NEUTRAL_SAMPLING,
                              "stop": list(stops or []), "stop_token_ids": list(end_ids),
                              "ignore_eos": False, "logprobs": 0, "include_stop_str_in_output": True,
                              "skip_special_tokens": True}
    for name in NEUTRAL_SAMPLING:  # a SamplingParams that gained such a field sets it
        value = getattr(sp, name, None)
        if value is not None:
            fields[name] = value
    return fields


def check_logprobs_mode(mode: str, sp: SamplingParams) -> None:
    """Refuse a sampling whose vLLM log-probs would not be ``log_softmax(logits / T)`` pre-top-p
    (penalties change the distribution itself: refused in every mode)."""
    greedy = sp.temperature <= 0
    truncates = sp.top_p < 1.0 or (getattr(sp, "top_k", None) or 0) > 0 or (getattr(sp, "min_p", None) or 0) > 0
    ok = greedy or (mode == "raw_logprobs" and sp.temperature == 1.0) or \
        (mode == "processed_logprobs" and not truncates)
    if not ok:
        raise ValueError(
            f"vLLM logprobs_mode={mode!r} cannot give the pre-top-p log-probs at temperature={sp.temperature}, "
            f"top_p={sp.top_p}: use top_p=1 with processed_logprobs, or temperature=1 with raw_logprobs")
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = getattr(sp, name, None)
        if value is not None and value != NEUTRAL_SAMPLING[name]:
            raise ValueError(f"{name}={value}: vLLM's log-probs do not include penalties, so the trainer's "
                             "importance ratios would be wrong; leave it at its neutral value")


ENGINE_DTYPES = ("auto", "bfloat16", "float16", "float32")


def declared_dtype(model: Any) -> str | None:
    """The dtype the model's config declares (``dtype`` / ``torch_dtype``: the checkpoint's, or the
    one it was loaded in), as a name; None when absent. The trainer's float32 master weights
    (:func:`~lmselfplay.rl.trainer.master_weights`) leave the config as it was, so this is the
    model's dtype whatever the trainer did to its parameters."""
    from lmselfplay.lm.engines.hf import unwrap

    m = unwrap(model)
    m = m.get_base_model() if hasattr(m, "get_base_model") else m
    config = getattr(m, "config", None)
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return None if value is None else str(value).removeprefix("torch.")


def engine_dtype(setting: str, model: Any, cuda: bool | None = None) -> str:
    """The colocated engine's dtype (``vllm_dtype``): a named dtype as given; ``auto`` is the
    model's declared half dtype (bfloat16 / float16), and for a declared float32 or none bfloat16
    on CUDA (float16 where the GPU has no bfloat16) — a float32 engine doubles weight memory and
    push bytes and gets no FlashAttention — and float32 on the CPU."""
    if setting not in ENGINE_DTYPES:
        raise ValueError(f"vllm_dtype must be one of {', '.join(ENGINE_DTYPES)}, got {setting!r}")
    if setting != "auto":
        return setting
    declared = declared_dtype(model)
    if declared in ("bfloat16", "float16"):
        return declared
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if not cuda:
        return "float32"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def empty_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def request_seeds(seed: int | None, n: int) -> list[int | None]:
    """Per-prompt seeds from one call seed (None -> unseeded)."""
    return [None] * n if seed is None else [(seed + i) % (2**31) for i in range(n)]


def export_config(model: Any, tokenizer: Any) -> str:
    """A folder with the model's config and tokenizer (no weights) for ``load_format="dummy"``."""
    from lmselfplay.lm.engines.hf import unwrap

    folder = tempfile.mkdtemp(prefix="lmselfplay-vllm-")
    m = unwrap(model)
    config = getattr(m, "config", None)
    if config is None:
        raise TypeError(f"the vLLM engine needs a transformers model with a .config, got {type(m).__name__}")
    base = getattr(m, "get_base_model", None)  # PEFT: the base model's config
    (base().config if base else config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _ensure_launcher_env() -> None:
    """``external_launcher`` runs vLLM inside this process; it reads torch.distributed's
    variables (set by accelerate/torchrun; defaults for a single process)."""
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def _worker_can_reload(worker: Any) -> bool:
    """Runs on a vLLM worker: does it reload weights in place from an iterator?"""
    return callable(getattr(worker, "reload_weights", None))


def _refresh_tied_head(model: Any) -> None:
    """Runs on a vLLM worker's model. A tied LM head shares the embedding's weight but is its
    own layer: an in-place reload loads nothing into it, so any copy its post-load processing
    made is not refreshed (vLLM's CPU build keeps a packed GEMM copy: the head would keep
    the old weights; found by the weight-sync check). Re-run it there; GPU builds keep no copy."""
    from vllm.platforms import current_platform

    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if current_platform.is_cpu() and tied and method is not None:
        method.process_weights_after_loading(head)


def cast_bucket(bucket: list[tuple[str, torch.Tensor]], dtype: torch.dtype) -> list[tuple[str, torch.Tensor]]:
    """A bucket's floating tensors in the engine's dtype (the trainer's float32 master weights
    travel at the engine's width: half the bytes for a bfloat16 engine); others as they are."""
    return [(k, t.to(dtype) if t.is_floating_point() else t) for k, t in bucket]


class VLLMEngine:
    """Colocated vLLM serving ``model``'s current weights (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, gpu_memory_utilization: float = 0.3,
                 enable_sleep_mode: bool = False, logprobs_mode: str = "raw_logprobs",
                 bucket_bytes: int = 256 << 20, max_model_len: int | None = None, dtype: str = "auto",
                 seed: int = 0, enforce_eager: bool = False, version: int = 0,
                 distributed_executor_backend: str | None = "auto", **llm_kwargs: Any):
        vllm = require_vllm()
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        self.tokenizer = tokenizer
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.eos_id = tokenizer.eos_token_id
        self.end_ids = end_token_ids(tokenizer)
        self.logprobs_mode = logprobs_mode
        self.bucket_bytes = bucket_bytes
        self.enable_sleep_mode = enable_sleep_mode
        self.version = version
        self.last_sync = SyncStats()
        self._asleep = self._weights_awake = False
        self._folder = export_config(model, tokenizer)
        if distributed_executor_backend == "auto":
            # in-process executor, so weights are loaded without serialization: TRL's
            # external_launcher on CUDA; vLLM's CPU build has no launcher, run it uniprocess
            distributed_executor_backend = "external_launcher" if torch.cuda.is_available() else None
        # the engine core in this process: the weight stream is a generator, not picklable
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if not torch.cuda.is_available():
            # vLLM's CPU build rewinds a seeded request's generator when a chunked prefill
            # discards its token, which CPU generators cannot do: prefill whole prompts
            longest = max_model_len or getattr(getattr(model, "config", None), "max_position_embeddings", 8192)
            llm_kwargs.setdefault("enable_chunked_prefill", False)
            llm_kwargs.setdefault("max_num_batched_tokens", max(8192, int(longest)))
        if distributed_executor_backend == "external_launcher":
            _ensure_launcher_env()
        self.dtype = engine_dtype(dtype, model)  # logged every step by the trainer (engine/dtype)
        self.over_long_prompts = 0
        self.llm = None
        try:
            self.llm = vllm.LLM(model=self._folder, tokenizer=self._folder, load_format="dummy", dtype=self.dtype,
                                gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode,
                                logprobs_mode=logprobs_mode, max_model_len=max_model_len, seed=seed,
                                enforce_eager=enforce_eager, enable_prefix_caching=True,
                                distributed_executor_backend=distributed_executor_backend, **llm_kwargs)
            self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)  # prompt_limit reads it
            self._has_reload = all(self.llm.collective_rpc(_worker_can_reload))
            self.update_weights(model, version=version)
        except BaseException:
            self.close()
            raise

    # --- generation -----------------------------------------------------------------
    def generate(self, prompts_token_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        if not prompts_token_ids:
            return []
        check_logprobs_mode(self.logprobs_mode, sampling)
        vllm = require_vllm()
        fields = sampling_fields(sampling, self.end_ids, native_stops(self.tokenizer, sampling))
        params = [vllm.SamplingParams(**fields, seed=s) for s in request_seeds(sampling.seed, len(prompts_token_ids))]
        self._wake()
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts_token_ids], params, use_tqdm=False)
        completions = []
        for p, o in zip(prompts_token_ids, outs):
            seq = o.outputs[0]
            toks = list(seq.token_ids)
            lps = [seq.logprobs[k][t].logprob for k, t in enumerate(toks)] if seq.logprobs is not None else []
            completions.append(to_completion(self.tokenizer, p, toks, lps, self.end_ids, sampling.stop))
        return completions

    # --- teacher forcing ------------------------------------------------------------
    def score(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
              temperature: float = 1.0, batch_size: int | None = None) -> list[list[float]]:
        """Per-token log-probs of each completion given its prompt (``prompt_logprobs``)."""
        if temperature != 1.0:
            raise ValueError("vLLM computes prompt log-probs before temperature: score() supports temperature=1 "
                             f"only, got {temperature}; score with the HF engine instead")
        if not prompt_ids:
            return []
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("score() needs a non-empty prompt (the first token has no log-prob)")
        vllm = require_vllm()
        sp = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        self._wake()
        outs = self.llm.generate([{"prompt_token_ids": list(p) + list(c)} for p, c in zip(prompt_ids, completion_ids)],
                                 sp, use_tqdm=False)
        res = []
        for p, c, o in zip(prompt_ids, completion_ids, outs):
            pl = o.prompt_logprobs
            res.append([pl[len(p) + k][t].logprob for k, t in enumerate(c)])
        return res

    # --- weights --------------------------------------------------------------------
    def update_weights(self, model: Any, version: int | None = None) -> None:
        """Push ``model``'s weights (a module, possibly ZeRO-3 / PEFT wrapped, or a state dict),
        bucket by bucket, then reset the prefix cache. Every rank must call it under ZeRO-3."""
        t0 = time.perf_counter()
        stats = SyncStats()
        if self.enable_sleep_mode and self._asleep and not self._weights_awake:
            empty_cuda_cache()  # the trainer's freed blocks back to the driver, for vLLM to map
            self.llm.wake_up(tags=["weights"])  # TRL's order: weights now, the KV cache at generate
            self._weights_awake = True
        buckets = iter_state_buckets(model, self.bucket_bytes) if isinstance(model, dict) else \
            iter_weight_buckets(model, self.bucket_bytes)

        def stream():  # one bucket materialized at a time, consumed by vLLM as it goes
            for bucket in buckets:
                bucket = cast_bucket(bucket, getattr(torch, self.dtype))
                stats.add(bucket)
                yield from bucket

        if self._has_reload:
            # vLLM's in-place reload restores each layer's checkpoint layout, loads, and re-runs
            # its post-load processing (kernel repacking on CPU, quantization): a plain
            # model.load_weights would write into the processed layout
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream(),
                                                              "is_checkpoint_format": True})
        else:  # older vLLM (TRL's colocate path): unprocessed bf16/fp16 layers load directly
            self.llm.apply_model(lambda m: m.load_weights(weights=stream()) and None)
        self.llm.apply_model(_refresh_tied_head)
        self.llm.reset_prefix_cache()
        stats.seconds = time.perf_counter() - t0
        self.last_sync = stats
        self.version = self.version + 1 if version is None else version

    # --- sleep mode -----------------------------------------------------------------
    def sleep(self) -> None:
        """Level 1: weights offloaded to CPU (kept), KV cache freed — the trainer gets the memory.
        The trainer calls it once at the start of each step (``PolicyTrainer.step``); the next
        ``generate`` / ``score`` / push wakes the engine, so it sleeps at most once per step
        however many rollouts the step made. A no-op without sleep mode or when asleep."""
        if self.enable_sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep, self._weights_awake = True, False

    def _wake(self) -> None:
        if self.enable_sleep_mode and self._asleep:
            tags = ["kv_cache"] if self._weights_awake else None
            empty_cuda_cache()  # waking maps fresh memory: the trainer's cached blocks must be released first
            self.llm.wake_up(tags=tags)
            self._asleep = False

    def close(self) -> None:
        """Shut vLLM down (its process groups, its GPU memory) and remove its config folder.
        Call it before the trainer's process group is destroyed (``accelerator.end_training``):
        vLLM's own shutdown tears down the groups it created."""
        import gc
        import shutil

        self.llm = None  # the last reference: vLLM's finalizer shuts the engine core down
        gc.collect()
        shutil.rmtree(getattr(self, "_folder", ""), ignore_errors=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
