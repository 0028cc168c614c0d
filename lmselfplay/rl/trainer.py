"""One accelerate-based policy-gradient trainer for every on-policy recipe.

Input: :class:`~lmselfplay.lm.trajectory.Sample` s with advantages (games, Absolute Zero,
R-Zero, debate all produce them). Per optimizer step it runs ``num_iterations`` passes
(PPO epochs) over the batch, one optimizer step each. A pass cuts the batch into
``gradient_accumulation_steps`` groups and each group into micro-batches of at most
``max_tokens_per_micro_batch`` padded tokens, so memory per forward stays bounded however
large the batch; every rank makes the same number of micro-batches (empty ones are padded
with a zero-loss forward) so that DDP / DeepSpeed collectives always line up even when ranks
hold different numbers of samples. The loss is a sum over the whole batch divided by its
token count, so the micro-batching does not change it, nor does the order the samples are cut
in: each group is cut longest first (:func:`~lmselfplay.rl.micro_batches.by_length`), so a row is
padded to rows of about its own length. Trained weights are float32 (master weights,
:func:`~lmselfplay.rl.precision.master_weights`). The loss, on the policy's own tokens only, per
token t of sample i (its terms: :mod:`lmselfplay.rl.losses`):

    ratio = exp(logp - behaviour_logp)          (also the importance correction for
                                                 rollouts from an engine a step behind)
    pg    = -min(ratio * A_i, clip(ratio, 1-eps, 1+eps) * A_i)
    kl    = exp(ref - logp) - (ref - logp) - 1  (k3 estimator, to the reference policy;
                                                 kl_estimator "exact": see kl.kl_per_token)
    loss  = sum_t w_i * (pg + beta_i(t) * kl - entropy_coef * H_t) / sum_t w_i
          + target_coef * sum_{i with a target} w_i * CE(target_i, softmax(logits_i / T)) / sum w_i

``pg`` is the clipped surrogate of :class:`SurrogateConfig` (``epsilon``, ``tis_cap``); a
trainer built without one (search self-play, whose samples all have advantage 0) has no such
term. ``beta_i(t) = beta[game/role of sample i] * schedule(t)``: one KL coefficient per game and
role (:class:`~lmselfplay.rl.kl.KLCoefficient`, :meth:`PolicyTrainer.kl_coef`), scaled by a schedule over
the trainer's steps (:func:`~lmselfplay.rl.kl.beta_factor`). The reference is the initial policy, or with
``ref_update_every = M`` the "magnet" of magnetic mirror descent (Sokota et al. 2022): every
M steps it is replaced by the current policy, so the regularized equilibrium the last
iterate converges to walks toward the unregularized one (Nash, in a two-player zero-sum
game) instead of staying tied to the initial policy. Under LoRA the initial reference is the
adapter-disabled model; a moved magnet is a frozen copy of the adapter weights, swapped in
for the reference forward.

The last line is the supervised-target term (search distillation): a sample may carry
a target distribution over the vocabulary at one completion token (``Sample.target``);
its cross-entropy is averaged over the target samples of the batch (:func:`~lmselfplay.rl.losses.target_term`).
Its fields are their own :class:`TargetLossConfig`, given only by the recipes that make target
samples (a trainer without it rejects a target sample). ``target_passes`` adds passes over the
pure-target samples alone (distillation targets that
need more optimizer steps than the policy-gradient turns of the same batch should get).
Pure-target samples that share a prefix share its tokens in one forward row
(:func:`~lmselfplay.rl.targets.pack_targets`), and a micro-batch of them projects onto the vocabulary only where a
target reads: the same loss as one row per sample (the main job's exact-feedback targets in
about a quarter of the tokens, ``benchmarks/bench_main_job.py``).

Multi-process: `accelerate launch` with the configs in ``recipes/accelerate/`` (DDP,
DeepSpeed ZeRO-2/3; :mod:`lmselfplay.rl.distributed`). On CPU the process group uses gloo.
The configs are in :mod:`lmselfplay.rl.trainer_config`.
"""

from __future__ import annotations

import contextlib
import copy
import random
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lmselfplay.lm.batching import logprobs_from_logits, over_positions
from lmselfplay.lm.engines.weight_sync_check import engine_report, mean_abs_logprob_diff
from lmselfplay.lm.trajectory import Sample, merge_identical
from lmselfplay.rl.distributed import (
    fill_deepspeed_config,
    gathered,
    is_partitioned,
    most_across_ranks,
    read_full,
    swapped_weights,
    write_full,
)
from lmselfplay.rl.importance import TruncatedImportance
from lmselfplay.rl.kl import beta_factor
from lmselfplay.rl.losses import kl_term, policy_gradient, target_term
from lmselfplay.rl.micro_batches import by_length, collate, micro_batches, split_by_tokens
from lmselfplay.rl.precision import autocast_forward, master_weights
from lmselfplay.rl.targets import pack_targets, target_entries
from lmselfplay.rl.trainer_config import (
    PPO_SURROGATE,
    SurrogateConfig,
    TargetLossConfig,
    TrainerConfig,
)
from lmselfplay.utils.checkpoint import commit_dir, prune_checkpoints, writing
from lmselfplay.utils.config import config_dict
from lmselfplay.utils.run import make_accelerator

# TRL 1.16's unwrap_model_for_generation reads the alias transformers 5.25 deprecated
# (is_gradient_checkpointing); the warning is about TRL's code, not the user's, and printed on every run
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


class PolicyTrainer:
    def __init__(self, model: Any, tokenizer: Any, config: TrainerConfig, accelerator: Any = None,
                 ref_model: Any = None, total_steps: int = 200, target_loss: TargetLossConfig | None = None,
                 surrogate: SurrogateConfig | None = PPO_SURROGATE, temperature: float = 1.0, seed: int = 0):
        """``total_steps``: the ``step()`` calls the learning-rate schedule and the beta schedule
        span, given by the recipe (its loop's length, a count it derives). ``target_loss``: the
        supervised-target term's config; None: the trainer takes no target samples (``step``
        raises on one). ``surrogate``: the policy-gradient term's config; None: no such term,
        every sample's advantage must be 0 (search self-play's distillation). ``temperature``: the
        sampling's (:class:`~lmselfplay.lm.sampling.SamplingConfig`), the one the log-probs are taken at.
        ``seed``: the run's (:class:`~lmselfplay.utils.run.RunConfig`), the seed of the micro-batch
        shuffling (each step's draw also depends on the step and the rank)."""
        from transformers import get_scheduler

        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"total_steps must be an integer >= 1, got {total_steps!r}")
        self.cfg, self.temperature, self.seed = config, float(temperature), seed
        self.target_loss, self.surrogate = target_loss, surrogate
        self.total_steps = total_steps
        self.tokenizer = tokenizer
        self.accelerator = accelerator or make_accelerator(config.gradient_accumulation_steps)
        self.is_peft = hasattr(model, "disable_adapter")
        self.kl_on = config.beta.enabled
        self._tis = TruncatedImportance(surrogate.tis_cap if surrogate is not None else 0.0)
        # a boolean 4D mask with position ids is what transformers' SDPA attention takes as it is
        # (eager adds the mask, flash attention takes none): target rows branch only there
        self.tree_attention = getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa"
        if self.kl_on and ref_model is None and not self.is_peft:
            if is_partitioned(model):
                raise ValueError("the model was loaded partitioned (DeepSpeed ZeRO-3 init): a deep copy of it "
                                 "is not a reference model; load a second copy and pass ref_model=")
            ref_model = copy.deepcopy(model)  # the initial policy, frozen
        fill_deepspeed_config(self.accelerator, config.max_grad_norm)
        compute_dtype = master_weights(model, self.accelerator)
        autocast_forward(model, compute_dtype)
        if ref_model is not None:
            autocast_forward(ref_model, compute_dtype)  # the reference computes as the policy does
        params = [p for p in model.parameters() if p.requires_grad]
        # foreach: one multi-tensor kernel per update op instead of a Python loop over the tensors (the
        # CPU default); the same arithmetic, bit for bit (benchmarks/bench_main_job.py)
        opt = torch.optim.AdamW(params, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                                weight_decay=config.weight_decay, foreach=True)
        # total_steps / warmup_steps count trainer.step() calls; each makes num_iterations
        # optimizer steps, and the schedule advances once per optimizer step
        per_call = max(1, config.num_iterations)
        sched = get_scheduler(config.lr_scheduler_type, opt, num_warmup_steps=config.warmup_steps * per_call,
                              num_training_steps=total_steps * per_call)
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
        self.magnet: list[torch.Tensor] | None = None  # LoRA: adapter weights of a moved reference
        self.magnet_step = 0  # the step whose policy is the reference (0: the initial one)
        self._ref_rows: dict[int, torch.Tensor] = {}  # the exact KL's reference rows of the step

    # --- helpers --------------------------------------------------------------------
    @property
    def deepspeed_stage(self) -> int:
        """The ZeRO stage when running under DeepSpeed, else -1."""
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        return int(plugin.zero_stage) if plugin is not None else -1

    @property
    def unwrapped(self) -> Any:
        return self.accelerator.unwrap_model(self.model)

    def _adapter_params(self) -> list[torch.Tensor]:
        return [p for p in self.unwrapped.parameters() if p.requires_grad]

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
        one with its own copy (vLLM) gets a bucketed push when it is behind the trainer. The
        samples it generates go to :meth:`step` with it (``engine=``)."""
        if getattr(engine, "shares_module", False):
            with self.generation_model() as m:
                engine.update_weights(m, version=self.step_count)
                yield engine
            return
        if engine.version != self.step_count:  # every rank calls this: ZeRO-3 gathers per bucket
            engine.update_weights(self.model, version=self.step_count)
        yield engine

    @torch.no_grad()
    def _ref_logprobs(self, samples: list[Sample]) -> dict[int, list[float]]:
        """Reference log-probs of every sample's completion, computed once per step in forwards
        of at most ``max_tokens_per_micro_batch`` tokens (64 samples without a cap). With the
        exact KL also every completion token's reference log-probs over the vocabulary
        (``self._ref_rows``: (tokens, V) per sample, on the CPU)."""
        out: dict[int, list[float]] = {}
        self._ref_rows = {}
        exact = self.cfg.kl_estimator == "exact"
        cap = self.cfg.max_tokens_per_micro_batch
        ordered = by_length(samples)  # less padding; the results are keyed by sample
        parts = split_by_tokens(ordered, cap) if cap else [ordered[i : i + 64] for i in range(0, len(ordered), 64)]
        for part in parts:
            b = collate(part, self.pad_id, self.accelerator.device)
            logits = self._ref_logits(b["input_ids"], b["attention_mask"])
            lp, _ = logprobs_from_logits(logits, b["input_ids"], self.temperature, where=b["mask"])
            if exact:
                where = F.pad(b["mask"].bool(), (0, 1))
                _, _, (rows,) = over_positions(logits, where, self._log_softmax_cpu)
                rows = rows.split([len(s.completion_ids) for s in part])
            for r, s in enumerate(part):
                a = len(s.prompt_ids) - 1
                out[id(s)] = lp[r, a : a + len(s.completion_ids)].float().cpu().tolist()
                if exact:
                    self._ref_rows[id(s)] = rows[r]
        self._join_other_ranks_ref_forwards(len(parts))
        return out

    def _join_other_ranks_ref_forwards(self, made: int) -> None:
        """Under ZeRO-3 each reference forward gathers the sharded parameters on every rank at
        once, so a rank with fewer reference batches than another (fewer or no sampled
        completions) makes empty forwards up to the largest count; else the others wait forever."""
        if self.deepspeed_stage != 3:
            return
        ids = self._filler_ids()
        for _ in range(most_across_ranks(self.accelerator, made) - made):
            self._ref_logits(ids, torch.ones_like(ids))

    def _filler_ids(self) -> torch.Tensor:
        """The input of a forward made only to keep the ranks' collectives in step."""
        return torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.accelerator.device)

    def _log_softmax_cpu(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.log_softmax(x / self.temperature, dim=-1).cpu(),)

    def _ref_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The reference policy's logits: the ref model, or under LoRA the moved magnet's
        adapter swapped in, or the adapter-disabled base model."""
        if self.ref_model is not None:
            return self.ref_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        if self.magnet is not None:
            with swapped_weights(self._adapter_params(), self.magnet, self.deepspeed_stage == 3):
                return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        with self.unwrapped.disable_adapter():
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    def reference_weights(self) -> list[torch.Tensor]:
        """The moved reference as full tensors: the ref model's parameters, or under LoRA
        the magnet's adapter weights (empty while the reference is the adapter-disabled model)."""
        if self.ref_model is not None:
            return read_full(list(self.ref_model.parameters()), self.deepspeed_stage == 3)
        return [t.clone() for t in self.magnet] if self.magnet is not None else []

    @torch.no_grad()
    def update_reference(self) -> None:
        """Move the magnet to the current policy (every rank, in step: ZeRO-3 gathers)."""
        zero3 = self.deepspeed_stage == 3
        if self.ref_model is not None:
            for q, p in zip(self.ref_model.parameters(), self.unwrapped.parameters(), strict=True):
                with gathered([p], zero3), gathered([q], zero3, modify=True):
                    q.data.copy_(p.data)
        elif self.is_peft:
            self.magnet = read_full(self._adapter_params(), zero3)
        self.magnet_step = self.step_count

    def kl_coef(self, sample: Sample, step: int | None = None) -> float:
        """beta_i(t): the sample's game/role coefficient times the schedule at ``step``."""
        step = self.step_count if step is None else step
        return self.cfg.beta.of(sample.role, sample.task) * beta_factor(self.cfg, step, self.total_steps)

    def _micro_batches(self, samples: list[Sample], rng: random.Random) -> list[list[Sample]]:
        """:func:`~lmselfplay.rl.micro_batches.micro_batches` of one optimizer step, padded with empty
        micro-batches to the largest count of any rank, so every rank makes the same forwards and
        backwards (DDP / ZeRO collectives)."""
        cfg = self.cfg
        out = micro_batches(samples, rng, cfg.gradient_accumulation_steps, cfg.max_tokens_per_micro_batch)
        return out + [[] for _ in range(most_across_ranks(self.accelerator, len(out)) - len(out))]

    # --- the step -------------------------------------------------------------------
    def step(self, samples: list[Sample], engine: Any = None) -> dict[str, float]:
        """One optimizer step per pass (``num_iterations`` passes) on this rank's samples.
        Metrics include ``logprob_diff``: mean |current - behaviour| log-prob of the sampled
        tokens in the first pass, before any update (the weight-sync check's measure).
        ``engine``: the learner's engine (the one :meth:`serving` serves), if any: it sleeps
        while the step trains (vLLM sleep mode: its memory to training) and its checks are
        reported (:func:`~lmselfplay.lm.engines.weight_sync_check.engine_report`)."""
        cfg, acc = self.cfg, self.accelerator
        self._check_terms(samples)
        getattr(engine, "sleep", lambda: None)()
        self._tis.begin_step()
        if cfg.merge_identical:
            samples = merge_identical(samples)
        n_samples = len(samples)
        samples = pack_targets(samples, branching=self.tree_attention)
        rng = random.Random(self.seed * 1_000_003 + self.step_count * 7919 + acc.process_index)
        total_tokens = sum(len(s.completion_ids) * s.weight for s in samples)
        stats: dict[str, list[float]] = {k: [] for k in ("loss", "pg_loss", "kl", "entropy", "clip_frac",
                                                         "ratio", "grad_norm", "logprob_diff", "target_ce",
                                                         "tis/weight", "tis/capped")}
        scored = [s for s in samples if s.completion_ids]  # pure-target samples have no tokens to score
        ref = self._ref_logprobs(scored) if self.kl_on else None
        self._target_total = sum(e[3] for s in samples for e in target_entries(s))
        self.model.train()
        for it in range(cfg.num_iterations):
            self._pass(self._micro_batches(samples, rng), total_tokens, ref, stats, first_pass=it == 0)
        # the recipes give every rank the same targets (all ranks make these passes or none, in step);
        # a batch without any makes none (an empty pass would still move the weights: Adam's momentum)
        targets = [s for s in samples if s.target is not None and not s.completion_ids]
        for _ in range(self.target_loss.target_passes if targets else 0):
            self._pass(self._micro_batches(targets, rng), total_tokens, None, stats, schedule=False)
        self.step_count += 1
        if cfg.ref_update_every and self.kl_on and self.step_count % cfg.ref_update_every == 0:
            self.update_reference()
        out = {k: sum(v) / len(v) for k, v in stats.items() if v}
        out.update(samples=float(n_samples), tokens=float(total_tokens),
                   lr=float(self.scheduler.get_last_lr()[0]))
        out.update(engine_report(engine, out.get("logprob_diff"), self.step_count))
        return out

    def _check_terms(self, samples: list[Sample]) -> None:
        """ValueError when a sample needs a term the trainer lacks: a supervised target without
        a :class:`TargetLossConfig` (its recipe makes no target samples), a non-zero advantage
        without a :class:`SurrogateConfig` (its recipe's samples are distillation targets)."""
        if self.target_loss is None and any(s.target is not None for s in samples):
            raise ValueError("a sample carries a supervised target but this trainer has no target loss: "
                             "give PolicyTrainer target_loss=TargetLossConfig(...)")
        if self.surrogate is None and any(s.advantage != 0 for s in samples):
            raise ValueError("a sample has a non-zero advantage but this trainer has no policy-gradient "
                             "surrogate: give PolicyTrainer surrogate=SurrogateConfig(...)")

    def _pass(self, micro_batches: list[list[Sample]], total_tokens: float, ref: dict[int, list[float]] | None,
              stats: dict[str, list[float]], first_pass: bool = False, schedule: bool = True) -> None:
        """One pass = one optimizer step over ``micro_batches`` (however many the token cap made):
        gradients accumulate over them and are reduced across ranks only at the last one. The
        boundary is accelerate's ``sync_gradients`` flag: it drives DDP's ``no_sync``, DeepSpeed's
        accumulation boundary and the prepared optimizer's step (a no-op while it is False), so
        the number of micro-batches may differ from ``gradient_accumulation_steps``. The
        learning-rate schedule advances with the step when ``schedule``."""
        cfg, acc = self.cfg, self.accelerator
        try:
            for i, mb in enumerate(micro_batches):
                acc.sync_gradients = boundary = i == len(micro_batches) - 1
                with contextlib.nullcontext() if boundary else acc.no_sync(self.model):
                    loss, parts = self._micro_loss(mb, total_tokens, ref, first_pass=first_pass)
                    acc.backward(loss)
                for k, v in parts.items():
                    stats[k].append(v)
            if cfg.max_grad_norm > 0:
                gn = acc.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                if gn is not None:
                    stats["grad_norm"].append(float(gn))
            self.optimizer.step()
            if schedule:  # once per optimizer step: accelerate's wrapper would step num_processes times
                self.scheduler.scheduler.step()
            self.optimizer.zero_grad()
        finally:
            acc.sync_gradients = True

    def _micro_loss(self, mb: list[Sample], total_tokens: float, ref: dict[int, list[float]] | None,
                    first_pass: bool = False):
        cfg, acc = self.cfg, self.accelerator
        if not mb:  # keep collectives aligned across ranks: a forward with zero loss
            ids = self._filler_ids()
            logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
            return logits.sum() * 0.0, {}
        if self.deepspeed_stage != 3 and not any(s.completion_ids for s in mb) and any(s.target for s in mb):
            # only supervised targets (distillation): one forward for the targets, no log-probs,
            # reference or policy-gradient terms. Under ZeRO-3 every rank must make the same
            # forwards whatever its samples, so there the general path below runs instead
            # and the vocabulary projection only at the positions a target reads (every row's)
            b = collate(mb, self.pad_id, acc.device, None)
            keep = sorted({e[0] for s in mb for e in target_entries(s)})
            logits = self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                position_ids=b.get("position_ids"), use_cache=False,
                                logits_to_keep=torch.tensor(keep, device=acc.device)).logits
            target, target_ce = target_term(mb, logits, self.temperature, self._target_total, keep)
            loss = self.target_loss.target_coef * target * acc.gradient_accumulation_steps
            return loss, ({"target_ce": target_ce} if target_ce is not None else {})
        b = collate(mb, self.pad_id, acc.device, ref)
        need_entropy = cfg.entropy_coef > 0
        logits = self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                            position_ids=b.get("position_ids"), use_cache=False).logits
        lp, ent = logprobs_from_logits(logits, b["input_ids"], self.temperature, True, where=b["mask"])
        if not need_entropy:
            ent = ent.detach()  # logged (collapse shows as entropy -> 0), not optimized
        mask = b["mask"]
        w = b["weight"].unsqueeze(1) * mask
        pg, pg_parts = policy_gradient(self.surrogate, self._tis, mb, lp, b, w, first_pass)
        tok = pg
        kl = torch.zeros_like(tok)
        if self.kl_on:
            kl = kl_term(cfg.kl_estimator, self.temperature, mb, logits, lp, b, self._ref_rows)
            coef = torch.tensor([self.kl_coef(s) for s in mb], dtype=kl.dtype, device=kl.device)
            tok = tok + coef.unsqueeze(1) * kl
        if need_entropy:
            tok = tok - cfg.entropy_coef * ent
        # token-mean over this rank's whole batch, so the micro-batches' gradients sum to the
        # batch's; accelerate / DeepSpeed divide every loss by their configured number of
        # accumulation steps (whatever the number of micro-batches), so multiply it back
        denom = max(total_tokens, 1.0)
        loss = (tok * w).sum() / denom * acc.gradient_accumulation_steps
        target_ce = None
        if self.target_loss is not None:  # without, step has checked that no sample carries a target
            target, target_ce = target_term(mb, logits, self.temperature, self._target_total)
            loss = loss + self.target_loss.target_coef * target * acc.gradient_accumulation_steps
        with torch.no_grad():
            wsum = w.sum().clamp_min(1e-8)
            parts = {"loss": float((tok * w).sum() / wsum), "pg_loss": float((pg * w).sum() / wsum),
                     "kl": float((kl * w).sum() / wsum), **pg_parts}
            if ent is not None:
                parts["entropy"] = float((ent * w).sum() / wsum)
            if first_pass:  # the weights the engine should have sampled with (weight-sync check)
                parts["logprob_diff"] = mean_abs_logprob_diff(lp, b["old"], w)
            if target_ce is not None:
                parts["target_ce"] = target_ce
        return loss, parts

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
        # disk full, permission: one line, no temp dir, the previous checkpoint as it was
        with writing(final, tmp, remove_tmp=acc.is_main_process):
            if acc.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            acc.wait_for_everyone()
            acc.save_state(str(tmp))
            state = acc.get_state_dict(self.model)  # every rank: ZeRO-3 gathers shards
            # a moved magnet is not the initial policy: saved, every rank gathering in step
            reference = self.reference_weights() if self.magnet_step else []
            acc.wait_for_everyone()  # every rank's files are in tmp before the marker
            if acc.is_main_process:
                torch.save({"extra": extra or {}, "step_count": self.step_count,
                            "trainer_config": config_dict(self.cfg), "magnet_step": self.magnet_step,
                            "reference": [t.cpu() for t in reference]}, tmp / "lmselfplay_state.pt")
                self.unwrapped.save_pretrained(str(tmp / "model"), state_dict=state, safe_serialization=True)
                self.tokenizer.save_pretrained(str(tmp / "model"))
                commit_dir(tmp, final)
                prune_checkpoints(out, keep)
        acc.wait_for_everyone()
        return final

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        self.accelerator.load_state(str(path))
        blob = torch.load(Path(path) / "lmselfplay_state.pt", weights_only=False)
        self.step_count = int(blob["step_count"])
        self.magnet_step = int(blob.get("magnet_step", 0))
        if self.magnet_step:
            if self.ref_model is not None:
                write_full(list(self.ref_model.parameters()), blob["reference"], self.deepspeed_stage == 3)
            else:
                self.magnet = list(blob["reference"])
        return blob["extra"]

