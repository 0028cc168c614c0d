"""One accelerate-based policy-gradient trainer for every on-policy recipe.

Input: :class:`~lmselfplay.lm.trajectory.Sample` s with advantages (games, Absolute Zero,
R-Zero, debate all produce them). Per optimizer step it runs ``num_iterations`` passes
(PPO epochs) over the batch; each pass is exactly ``gradient_accumulation_steps``
micro-batches on every rank (empty ones are padded with a zero-loss forward) so that
DDP / DeepSpeed collectives always line up even when ranks hold different numbers of
samples. The loss, on the policy's own tokens only, per token t of sample i:

    ratio = exp(logp - behaviour_logp)          (also the importance correction for
                                                 rollouts from an engine a step behind)
    pg    = -min(ratio * A_i, clip(ratio, 1-eps, 1+eps) * A_i)
    kl    = exp(ref - logp) - (ref - logp) - 1  (k3 estimator, to the frozen reference)
    loss  = sum_t w_i * (pg + beta * kl - entropy_coef * H_t) / sum_t w_i
          + target_coef * sum_{i with a target} w_i * CE(target_i, softmax(logits_i / T)) / sum w_i

The second line is the supervised-target term (search distillation): a sample may carry
a target distribution over the vocabulary at one completion token (``Sample.target``);
its cross-entropy is averaged over the target samples of the batch (see ``_target_loss``).

Multi-process: `accelerate launch` with the configs in ``recipes/accelerate/`` (DDP,
DeepSpeed ZeRO-2/3). On CPU the process group uses gloo.
"""

from __future__ import annotations

import copy
import datetime
import math
import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from lmselfplay.lm.batching import pad_batch, token_logprobs
from lmselfplay.lm.engines.staleness import mean_abs_logprob_diff
from lmselfplay.lm.trajectory import Sample, merge_identical
from lmselfplay.utils.checkpoint import CheckpointWriteError, commit_dir, prune_checkpoints


@dataclass
class TrainerConfig:
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate"})
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    lr_scheduler_type: str = field(default="constant_with_warmup",
                                   metadata={"help": "any transformers scheduler name"})
    warmup_steps: int = 0
    max_steps: int = field(default=200, metadata={"help": "trainer.step() calls the LR schedule spans"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per pass"})
    num_iterations: int = field(default=2, metadata={"help": "PPO passes over each batch"})
    epsilon: float = field(default=0.2, metadata={"help": "PPO clip range"})
    beta: float = field(default=0.1, metadata={"help": "KL coefficient to the reference policy"})
    entropy_coef: float = 0.0
    temperature: float = field(default=1.0, metadata={"help": "must equal the sampling temperature"})
    merge_identical: bool = field(default=True, metadata={"help": "merge equal (prompt, answer) turns"})
    target_coef: float = field(default=1.0, metadata={"help": "weight of the supervised-target cross-entropy"})
    seed: int = 0


def is_partitioned(model: Any) -> bool:
    """True when the weights were sharded at load time (DeepSpeed ZeRO-3 init)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def make_accelerator(gradient_accumulation_steps: int = 1, log_with: Any = None, project_dir: str | None = None,
                     timeout_s: float | None = None):
    """An Accelerator; on CPU with several processes the process group is gloo (NCCL
    needs GPUs). A single process gets no process group at all. ``timeout_s`` (the recipes'
    ``collective_timeout_s``) bounds how long a rank waits in a collective for a peer that
    died: it then fails with an error instead of hanging.

    Under ``accelerate launch`` (torchrun) on a machine without CUDA, accelerate finds no
    device and sets ``distributed_type`` NO unless ``cpu=True``: the ranks would then
    train unsynced copies. So several processes without CUDA get ``cpu=True``
    (``MULTI_CPU``, gloo), except under DeepSpeed, which runs on its CPU accelerator and
    needs its own process-group init (skipped by accelerate when ``cpu=True``)."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    pg: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    cpu = False
    if not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        pg["backend"] = "gloo"
        cpu = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true"
    handlers = [InitProcessGroupKwargs(**pg)] if pg else []
    return Accelerator(gradient_accumulation_steps=gradient_accumulation_steps, kwargs_handlers=handlers,
                       log_with=log_with, project_dir=project_dir, cpu=cpu)


def collate(samples: list[Sample], pad_id: int, device: torch.device,
            ref: dict[int, list[float]] | None = None) -> dict[str, torch.Tensor]:
    """Right-padded batch; ``mask`` marks completion tokens as positions in the shifted
    (next-token) frame, aligned with ``behaviour`` log-probs."""
    ids, attn = pad_batch([s.prompt_ids + s.completion_ids for s in samples], pad_id)
    n, width = ids.shape
    mask = torch.zeros((n, width - 1))
    old = torch.zeros((n, width - 1))
    ref_lp = torch.zeros((n, width - 1))
    adv = torch.zeros(n)
    weight = torch.zeros(n)
    for r, s in enumerate(samples):
        a, b = len(s.prompt_ids) - 1, len(s.prompt_ids) + len(s.completion_ids) - 1
        mask[r, a:b] = 1.0
        old[r, a:b] = torch.tensor(s.behaviour_logprobs[: b - a], dtype=torch.float)
        if ref is not None:
            ref_lp[r, a:b] = torch.tensor(ref[id(s)], dtype=torch.float)
        adv[r] = s.advantage / s.weight  # merged samples: mean advantage, counted `weight` times
        weight[r] = s.weight
    return {k: v.to(device) for k, v in dict(input_ids=ids, attention_mask=attn, mask=mask, old=old,
                                             ref=ref_lp, adv=adv, weight=weight).items()}


class PolicyTrainer:
    def __init__(self, model: Any, tokenizer: Any, config: TrainerConfig, accelerator: Any = None,
                 ref_model: Any = None):
        from transformers import get_scheduler

        self.cfg = config
        self.tokenizer = tokenizer
        self.accelerator = accelerator or make_accelerator(config.gradient_accumulation_steps)
        self.is_peft = hasattr(model, "disable_adapter")
        if config.beta > 0 and ref_model is None and not self.is_peft:
            if is_partitioned(model):
                raise ValueError("the model was loaded partitioned (DeepSpeed ZeRO-3 init): a deep copy of it "
                                 "is not a reference model; load a second copy and pass ref_model=")
            ref_model = copy.deepcopy(model)  # the initial policy, frozen
        self._fill_deepspeed_config()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                                weight_decay=config.weight_decay)
        # max_steps / warmup_steps count trainer.step() calls; each makes num_iterations
        # optimizer steps, and the schedule advances once per optimizer step
        per_call = max(1, config.num_iterations)
        sched = get_scheduler(config.lr_scheduler_type, opt, num_warmup_steps=config.warmup_steps * per_call,
                              num_training_steps=config.max_steps * per_call)
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(model, opt, sched)
        self.ref_model = None
        if ref_model is not None:
            ref_model.requires_grad_(False).eval()
            if self.deepspeed_stage == 3:
                from trl.models.utils import prepare_deepspeed

                ref_model = prepare_deepspeed(ref_model, self.accelerator)
            else:
                ref_model = ref_model.to(self.accelerator.device)
            self.ref_model = ref_model
        self.step_count = 0
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    # --- helpers --------------------------------------------------------------------
    def _fill_deepspeed_config(self) -> None:
        """DeepSpeed wants a micro-batch size (no dataloader is prepared here: our
        micro-batches vary, the value only feeds its throughput logging) and does the
        clipping itself; fill those "auto" fields from the trainer config."""
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        if plugin is None:
            return
        ds = plugin.deepspeed_config
        if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
            ds["train_micro_batch_size_per_gpu"] = 1
        if ds.get("gradient_clipping", "auto") == "auto":
            ds["gradient_clipping"] = float(self.cfg.max_grad_norm)

    @property
    def deepspeed_stage(self) -> int:
        """The ZeRO stage when running under DeepSpeed, else -1."""
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        return int(plugin.zero_stage) if plugin is not None else -1

    @property
    def unwrapped(self) -> Any:
        return self.accelerator.unwrap_model(self.model)

    @contextmanager
    def generation_model(self) -> Iterator[Any]:
        """The bare model for an engine to generate with (gathers ZeRO-3 shards)."""
        from trl.models.utils import unwrap_model_for_generation

        with unwrap_model_for_generation(self.model, self.accelerator) as m:
            yield m

    @contextmanager
    def serving(self, engine: Any) -> Iterator[Any]:
        """Inside the block ``engine`` serves the learner's current weights: the one way
        recipes hand the learner to an engine. An engine that shares the learner's module
        (HF: ``shares_module``) serves the gathered module (ZeRO-3: every rank together);
        one with its own copy (vLLM) gets a bucketed push when it is behind the trainer."""
        if getattr(engine, "shares_module", False):
            with self.generation_model() as m:
                engine.update_weights(m, version=self.step_count)
                yield engine
            return
        if engine.version != self.step_count:  # every rank calls this: ZeRO-3 gathers per bucket
            engine.update_weights(self.model, version=self.step_count)
        yield engine

    @torch.no_grad()
    def _ref_logprobs(self, samples: list[Sample], chunk: int = 64) -> dict[int, list[float]]:
        """Reference log-probs of every sample's completion, computed once per step."""
        out: dict[int, list[float]] = {}
        for i in range(0, len(samples), chunk):
            part = samples[i : i + chunk]
            b = collate(part, self.pad_id, self.accelerator.device)
            if self.ref_model is not None:
                lp, _ = token_logprobs(self.ref_model, b["input_ids"], b["attention_mask"], self.cfg.temperature)
            else:
                with self.unwrapped.disable_adapter():  # PEFT: the base model is the reference
                    lp, _ = token_logprobs(self.model, b["input_ids"], b["attention_mask"], self.cfg.temperature)
            for r, s in enumerate(part):
                a = len(s.prompt_ids) - 1
                out[id(s)] = lp[r, a : a + len(s.completion_ids)].float().cpu().tolist()
        return out

    def _micro_batches(self, samples: list[Sample], rng: random.Random) -> list[list[Sample]]:
        order = list(samples)
        rng.shuffle(order)
        k = self.cfg.gradient_accumulation_steps
        size = math.ceil(len(order) / k) if order else 0
        return [order[i * size : (i + 1) * size] for i in range(k)]

    # --- the step -------------------------------------------------------------------
    def step(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step per pass (``num_iterations`` passes) on this rank's samples.
        Metrics include ``logprob_diff``: mean |current - behaviour| log-prob of the sampled
        tokens in the first pass, before any update (the staleness detector's measure)."""
        cfg, acc = self.cfg, self.accelerator
        if cfg.merge_identical:
            samples = merge_identical(samples)
        rng = random.Random(cfg.seed * 1_000_003 + self.step_count * 7919 + acc.process_index)
        total_tokens = sum(len(s.completion_ids) * s.weight for s in samples)
        stats: dict[str, list[float]] = {k: [] for k in ("loss", "pg_loss", "kl", "entropy", "clip_frac",
                                                         "ratio", "grad_norm", "logprob_diff", "target_ce")}
        ref = self._ref_logprobs(samples) if cfg.beta > 0 and samples else None
        self._target_total = sum(s.weight for s in samples if s.target is not None)
        self.model.train()
        for it in range(cfg.num_iterations):
            for mb in self._micro_batches(samples, rng):
                with acc.accumulate(self.model):
                    loss, parts = self._micro_loss(mb, total_tokens, ref, first_pass=it == 0)
                    acc.backward(loss)
                    if acc.sync_gradients and cfg.max_grad_norm > 0:
                        gn = acc.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                        if gn is not None:
                            stats["grad_norm"].append(float(gn))
                    self.optimizer.step()
                    if acc.sync_gradients:  # once per optimizer step: accelerate's wrapper
                        self.scheduler.scheduler.step()  # would step num_processes times
                    self.optimizer.zero_grad()
                for k, v in parts.items():
                    stats[k].append(v)
        self.step_count += 1
        out = {k: sum(v) / len(v) for k, v in stats.items() if v}
        out.update(samples=float(len(samples)), tokens=float(total_tokens),
                   lr=float(self.scheduler.get_last_lr()[0]))
        return out

    def _micro_loss(self, mb: list[Sample], total_tokens: float, ref: dict[int, list[float]] | None,
                    first_pass: bool = False):
        cfg, acc = self.cfg, self.accelerator
        if not mb:  # keep collectives aligned across ranks: a forward with zero loss
            ids = torch.full((1, 2), self.pad_id, dtype=torch.long, device=acc.device)
            logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
            return logits.sum() * 0.0, {}
        b = collate(mb, self.pad_id, acc.device, ref)
        need_entropy = cfg.entropy_coef > 0
        lp, ent = token_logprobs(self.model, b["input_ids"], b["attention_mask"], cfg.temperature, True)
        if not need_entropy:
            ent = ent.detach()  # logged (collapse shows as entropy -> 0), not optimized
        mask = b["mask"]
        w = b["weight"].unsqueeze(1) * mask
        ratio = torch.exp(torch.clamp(lp - b["old"], -20, 20))
        adv = b["adv"].unsqueeze(1)
        unclipped, clipped = ratio * adv, torch.clamp(ratio, 1 - cfg.epsilon, 1 + cfg.epsilon) * adv
        pg = -torch.minimum(unclipped, clipped)
        tok = pg
        kl = torch.zeros_like(tok)
        if cfg.beta > 0:
            d = b["ref"] - lp
            kl = torch.exp(d) - d - 1.0
            tok = tok + cfg.beta * kl
        if need_entropy:
            tok = tok - cfg.entropy_coef * ent
        # token-mean over this rank's whole batch; accelerate / DeepSpeed divide by the
        # number of accumulation steps, so multiply it back
        denom = max(total_tokens, 1.0)
        loss = (tok * w).sum() / denom * cfg.gradient_accumulation_steps
        target_loss, target_ce = self._target_loss(mb)
        loss = loss + cfg.target_coef * target_loss * cfg.gradient_accumulation_steps
        with torch.no_grad():
            wsum = w.sum().clamp_min(1e-8)
            parts = {"loss": float((tok * w).sum() / wsum), "pg_loss": float((pg * w).sum() / wsum),
                     "kl": float((kl * w).sum() / wsum),
                     "clip_frac": float((((ratio - 1).abs() > cfg.epsilon).float() * w).sum() / wsum),
                     "ratio": float((ratio * w).sum() / wsum)}
            if ent is not None:
                parts["entropy"] = float((ent * w).sum() / wsum)
            if first_pass:  # the weights the engine should have sampled with (staleness detector)
                parts["logprob_diff"] = mean_abs_logprob_diff(lp, b["old"], w)
            if target_ce is not None:
                parts["target_ce"] = target_ce
        return loss, parts

    def _target_loss(self, mb: list[Sample]) -> tuple[torch.Tensor | float, float | None]:
        """Cross-entropy from each sample's target distribution (``Sample.target``: index
        into the completion, token ids, probabilities) to the policy's next-token
        distribution at that completion token, weighted by ``Sample.weight`` and divided
        by the total target weight of this rank's batch (set in ``step``). One extra
        forward over the micro-batch's target samples only; 0 when it has none. Under
        DeepSpeed ZeRO-3 (forwards gather shards collectively) every rank must then make
        the same number of forwards: not yet guaranteed, untested multi-process."""
        rows = [s for s in mb if s.target is not None]
        if not rows:
            return 0.0, None
        b = collate(rows, self.pad_id, self.accelerator.device)
        pos = torch.tensor([len(s.prompt_ids) - 1 + s.target[0] for s in rows], device=b["input_ids"].device)
        logits = self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        logp = torch.log_softmax(logits[torch.arange(len(rows)), pos].float() / self.cfg.temperature, dim=-1)
        ce = torch.stack([-(logp[r, s.target[1]] * torch.tensor(s.target[2], device=logp.device)).sum()
                          for r, s in enumerate(rows)])
        w = b["weight"]
        return (ce * w).sum() / max(self._target_total, 1e-8), float((ce * w).detach().sum() / w.sum())

    # --- checkpoints ----------------------------------------------------------------
    def save_checkpoint(self, output_dir: str | Path, extra: dict[str, Any] | None = None,
                        keep: int = 2) -> Path:
        """Everything to resume exactly: model, optimizer, scheduler, RNG (all ranks,
        via ``accelerator.save_state``) + ``extra`` (baselines, league, counters) as
        JSON/torch, written into a temp dir and renamed (atomic)."""
        acc = self.accelerator
        out = Path(output_dir)
        final = out / f"checkpoint-{self.step_count}"
        tmp = out / f".checkpoint-{self.step_count}.tmp"
        try:
            if acc.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            acc.wait_for_everyone()
            acc.save_state(str(tmp))
            state = acc.get_state_dict(self.model)  # every rank: ZeRO-3 gathers shards
            acc.wait_for_everyone()  # every rank's files are in tmp before the marker
            if acc.is_main_process:
                torch.save({"extra": extra or {}, "step_count": self.step_count,
                            "trainer_config": asdict(self.cfg)}, tmp / "lmselfplay_state.pt")
                self.unwrapped.save_pretrained(str(tmp / "model"), state_dict=state, safe_serialization=True)
                self.tokenizer.save_pretrained(str(tmp / "model"))
                commit_dir(tmp, final)
                prune_checkpoints(out, keep)
        except OSError as e:  # disk full, permission: the previous checkpoint stays as it was
            if acc.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointWriteError.of(final, e) from e
        acc.wait_for_everyone()
        return final

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        self.accelerator.load_state(str(path))
        blob = torch.load(Path(path) / "lmselfplay_state.pt", weights_only=False)
        self.step_count = int(blob["step_count"])
        return blob["extra"]

