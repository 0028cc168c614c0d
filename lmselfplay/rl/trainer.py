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
in: each group is cut longest first (:func:`by_length`), so a row is padded to rows of about
its own length. Trained weights are float32 (master weights, :func:`master_weights`). The loss, on the policy's own tokens only, per token t of
sample i:

    ratio = exp(logp - behaviour_logp)          (also the importance correction for
                                                 rollouts from an engine a step behind)
    pg    = -min(ratio * A_i, clip(ratio, 1-eps, 1+eps) * A_i)
    kl    = exp(ref - logp) - (ref - logp) - 1  (k3 estimator, to the reference policy;
                                                 kl_estimator "exact": see kl_per_token)
    loss  = sum_t w_i * (pg + beta_i(t) * kl - entropy_coef * H_t) / sum_t w_i
          + target_coef * sum_{i with a target} w_i * CE(target_i, softmax(logits_i / T)) / sum w_i

``pg`` is the clipped surrogate of :class:`SurrogateConfig` (``epsilon``, ``tis_cap``); a
trainer built without one (search self-play, whose samples all have advantage 0) has no such
term. ``beta_i(t) = beta[game/role of sample i] * schedule(t)``: one KL coefficient per game and
role (:func:`parse_beta`, :meth:`PolicyTrainer.kl_coef`), scaled by a schedule over the
trainer's steps (:func:`beta_factor`). The reference is the initial policy, or with
``ref_update_every = M`` the "magnet" of magnetic mirror descent (Sokota et al. 2022): every
M steps it is replaced by the current policy, so the regularized equilibrium the last
iterate converges to walks toward the unregularized one (Nash, in a two-player zero-sum
game) instead of staying tied to the initial policy. Under LoRA the initial reference is the
adapter-disabled model; a moved magnet is a frozen copy of the adapter weights, swapped in
for the reference forward.

The last line is the supervised-target term (search distillation): a sample may carry
a target distribution over the vocabulary at one completion token (``Sample.target``);
its cross-entropy is averaged over the target samples of the batch (see ``_target_loss``).
Its fields are their own :class:`TargetLossConfig`, given only by the recipes that make target
samples (a trainer without it rejects a target sample). ``target_passes`` adds passes over the
pure-target samples alone (distillation targets that
need more optimizer steps than the policy-gradient turns of the same batch should get).
Pure-target samples that share a prefix share its tokens in one forward row
(:func:`pack_targets`), and a micro-batch of them projects onto the vocabulary only where a
target reads: the same loss as one row per sample (the main job's exact-feedback targets in
about a quarter of the tokens, ``benchmarks/bench_main_job.py``).

Multi-process: `accelerate launch` with the configs in ``recipes/accelerate/`` (DDP,
DeepSpeed ZeRO-2/3). On CPU the process group uses gloo.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import random
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F

from lmselfplay.lm.batching import logprobs_from_logits, over_positions, pad_batch
from lmselfplay.lm.engines.weight_sync_check import mean_abs_logprob_diff
from lmselfplay.lm.trajectory import Sample, merge_identical
from lmselfplay.models.policy import load_policy
from lmselfplay.rl.importance import TruncatedImportance
from lmselfplay.utils.checkpoint import commit_dir, prune_checkpoints, writing
from lmselfplay.utils.config import Config, ConfigError, non_negative, positive
from lmselfplay.utils.run import make_accelerator

# TRL 1.16's unwrap_model_for_generation reads the alias transformers 5.25 deprecated
# (is_gradient_checkpointing); the warning is about TRL's code, not the user's, and printed on every run
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)

BETA_SCHEDULES = ("constant", "linear", "cosine")
KL_ESTIMATORS = ("k3", "exact")


@dataclass
class TrainerConfig(Config):
    _argument_group_name = "trainer (lmselfplay.rl.trainer.TrainerConfig)"
    yaml_mappings = ("beta",)  # beta: {nim: 0.1, kuhn_poker: 0.2} in YAML (a mapping per game)
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate"})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1 (first-moment decay)"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2 (second-moment decay)"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping (0: off)"})
    lr_scheduler_type: str = field(default="constant_with_warmup",
                                   metadata={"help": "any transformers scheduler name"})
    warmup_steps: int = field(default=0, metadata={"help": "trainer.step() calls of LR warm-up"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per pass"})
    num_iterations: int = field(default=2, metadata={"help": "PPO passes over each batch"})
    beta: str = field(default=0.1, metadata={  # type: ignore[assignment]  # str on the command line
        "help": "KL coefficient to the reference policy: a number, or one per game / role as "
                "'nim=0.1,kuhn_poker=0.2' (a YAML mapping works too); keys match a sample's role "
                "'game/pN/start' by its longest prefix, then its task; 'default' covers the rest"})
    beta_schedule: str = field(default="constant", metadata={
        "help": "constant | linear | cosine: every beta is multiplied by a factor going from 1 to "
                "beta_final_ratio over the run's trainer steps (the recipe's step count, as the LR schedule)"})
    beta_final_ratio: float = field(default=1.0, metadata={"help": "beta at the last trainer step / beta at step 0"})
    ref_update_every: int = field(default=0, metadata={
        "help": "M > 0: replace the KL reference with the current policy every M steps (magnetic mirror "
                "descent's moving magnet); 0: the initial policy throughout"})
    kl_estimator: str = field(default="k3", metadata={
        "help": "k3: the sampled token's exp(ref - logp) - (ref - logp) - 1; exact: KL(ref || policy) over the "
                "whole vocabulary at every completion token (k3's expected gradient without its variance)"})
    entropy_coef: float = field(default=0.0, metadata={"help": "entropy bonus coefficient"})
    temperature: float = field(default=1.0, metadata={"help": "must equal the sampling temperature"})
    merge_identical: bool = field(default=True, metadata={"help": "merge equal (prompt, answer) turns"})
    seed: int = field(default=0, metadata={"help": "seed of micro-batch shuffling and sampling"})
    max_tokens_per_micro_batch: int = field(default=8192, metadata={
        "help": "cap on the padded tokens (rows x longest sequence) of one forward/backward: a step's samples are "
                "cut into as many micro-batches as the cap needs (at least gradient_accumulation_steps), the loss "
                "unchanged; a sample longer than the cap is a micro-batch of its own; 0: no cap"})

    def validate(self) -> None:
        check_micro_batch_fields(self)
        self.beta = parse_beta(self.beta)
        positive(self, "gradient_accumulation_steps", "num_iterations", "temperature")
        non_negative(self, "learning_rate", "warmup_steps", "weight_decay", "max_grad_norm")
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ConfigError(f"beta_schedule must be one of {BETA_SCHEDULES}, got {self.beta_schedule!r}")
        if not self.beta_final_ratio >= 0:
            raise ConfigError(f"beta_final_ratio must be >= 0, got {self.beta_final_ratio}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ConfigError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.ref_update_every < 0:
            raise ConfigError(f"ref_update_every must be >= 0, got {self.ref_update_every}")


@dataclass
class SurrogateConfig(Config):
    """The policy-gradient term's clipped surrogate: PPO's clip range and the truncated
    importance sampling of the engine's log-probs; only the recipes whose samples carry
    advantages and engine log-probs have it (search self-play's distillation samples have
    neither)."""

    _argument_group_name = "policy-gradient surrogate (lmselfplay.rl.trainer.SurrogateConfig)"
    epsilon: float = field(default=0.2, metadata={"help": "PPO clip range"})
    tis_cap: float = field(default=0.0, metadata={
        "help": "C > 0: truncated importance sampling of the engine's mismatch (lmselfplay/rl/importance.py): the "
                "PPO ratio against the trainer's own log-probs at the step's start, each token weighted by "
                "min(exp(trainer - engine log-prob), C); 0: off, the ratio against the engine's log-probs"})

    def validate(self) -> None:
        non_negative(self, "epsilon")
        if not self.tis_cap >= 0:
            raise ConfigError(f"tis_cap must be >= 0 (0: off), got {self.tis_cap}")


# the trainer's surrogate where its caller names none: PPO's clip range 0.2, no importance sampling
PPO_SURROGATE = SurrogateConfig()


@dataclass
class TargetLossConfig(Config):
    """The supervised-target term (``Sample.target``: search distillation, exact feedback,
    average-policy distillation); only the recipes that make target samples have it."""

    _argument_group_name = "target loss (lmselfplay.rl.trainer.TargetLossConfig)"
    target_coef: float = field(default=1.0, metadata={"help": "weight of the supervised-target cross-entropy"})
    target_passes: int = field(default=0, metadata={
        "help": "extra passes over the batch's pure supervised-target samples only (distillation targets), after "
                "the num_iterations passes over the whole batch; the learning-rate schedule does not advance on them"})

    def validate(self) -> None:
        non_negative(self, "target_coef")
        if self.target_passes < 0:
            raise ConfigError(f"target_passes must be >= 0, got {self.target_passes}")


def check_micro_batch_fields(cfg: TrainerConfig) -> None:
    """ConfigError naming the field: ``max_tokens_per_micro_batch`` must be an integer >= 0."""
    cap = cfg.max_tokens_per_micro_batch
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise ConfigError(f"max_tokens_per_micro_batch must be an integer >= 0 (0: no cap), got {cap!r}")


def parse_beta(value: Any) -> float | dict[str, float]:
    """A KL coefficient (``0.1``, ``"0.1"``) or one per key (``{"nim": 0.1}``,
    ``"nim=0.1,kuhn_poker/p1=0.3"``, the ``parse_weights`` syntax). ConfigError (a ValueError) names the bad
    entry: not a number, negative, or NAME=NUMBER without a name."""
    if isinstance(value, str) and "=" not in value:
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"beta {value!r} is neither a number nor NAME=NUMBER entries") from None
    if isinstance(value, str):
        items = [x.strip().partition("=") for x in value.split(",") if x.strip()]
        if any(not sep or not name.strip() for name, sep, _ in items):
            raise ConfigError(f"bad beta {value!r}: expected NAME=NUMBER entries separated by commas")
        value = {name.strip(): v.strip() for name, _, v in items}
    if isinstance(value, dict):
        out = {}
        for name, v in value.items():
            try:
                out[str(name)] = float(v)
            except (TypeError, ValueError):
                raise ConfigError(f"beta entry '{name}={v}' is not a number") from None
            if not out[str(name)] >= 0:
                raise ConfigError(f"beta entry '{name}={v}' must be >= 0")
        return out
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"beta must be a number >= 0 or a mapping of them, got {value!r}")
    return float(value)


def kl_enabled(beta: float | dict[str, float]) -> bool:
    """Whether any sample can get a KL term (then a reference policy is needed)."""
    return any(v > 0 for v in beta.values()) if isinstance(beta, dict) else beta > 0


def beta_for(beta: float | dict[str, float], role: str, task: str = "") -> float:
    """The coefficient of a sample: a scalar applies to all; a mapping is looked up by the
    longest '/'-prefix of ``role`` (``kuhn_poker/p0/initial`` -> ``kuhn_poker/p0`` ->
    ``kuhn_poker``), then ``task``, then ``default``; KeyError when none is there."""
    if not isinstance(beta, dict):
        return beta
    parts = role.split("/") if role else []
    for key in ["/".join(parts[:n]) for n in range(len(parts), 0, -1)] + [task, "default"]:
        if key and key in beta:
            return beta[key]
    raise KeyError(f"no KL coefficient for role {role!r} (task {task!r}) in beta {beta}: add it or 'default'")


def kl_per_token(estimator: str, lp: torch.Tensor | None, ref_lp: torch.Tensor | None,
                 logp_all: torch.Tensor | None = None, ref_all: torch.Tensor | None = None) -> torch.Tensor:
    """The KL term of each completion token, differentiable in the policy's log-probs.

    ``k3``: ``exp(d) - d - 1`` with ``d = ref_lp - lp`` the sampled tokens' log-ratio. Its
    value estimates KL(policy || ref), and as a loss its gradient, ``(1 - ref/pi) grad log pi``
    on the sampled token, is in expectation over on-policy samples the gradient of
    KL(ref || policy). That expectation hides a variance without bound: a token the policy
    now finds far less likely than the reference does, once sampled, has a weight
    ``ref/pi`` of thousands, and one such token can make a step's gradient norm hundreds.

    ``exact``: KL(ref || policy) = sum_v ref(v) (log ref(v) - log pi(v)) over the whole
    vocabulary at the token's position (``logp_all`` / ``ref_all``: (N, V) log-probs there),
    whose gradient on the logits, ``pi - ref``, is k3's expected gradient, bounded, and
    pulls back every move a visited position has collapsed away from, sampled or not."""
    if estimator == "k3":
        d = ref_lp - lp
        return torch.exp(d) - d - 1.0
    if logp_all is None or ref_all is None:
        raise ValueError("the exact KL needs the policy's and the reference's log-probs over the vocabulary")
    return (ref_all.exp() * (ref_all - logp_all)).sum(-1)


def beta_factor(cfg: TrainerConfig, step: int, total_steps: int) -> float:
    """The schedule's multiplier at trainer step ``step``: 1 at step 0, ``beta_final_ratio``
    from ``total_steps`` on; linear or half-cosine in between (constant: always 1)."""
    if cfg.beta_schedule == "constant" or total_steps <= 0:
        return 1.0
    frac = min(max(step / total_steps, 0.0), 1.0)
    shape = frac if cfg.beta_schedule == "linear" else (1 - math.cos(math.pi * frac)) / 2
    return 1.0 + (cfg.beta_final_ratio - 1.0) * shape


def is_partitioned(model: Any) -> bool:
    """True when the weights were sharded at load time (DeepSpeed ZeRO-3 init)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def reference_policy(policy: Any, beta: float | dict[str, float], model: Any, device: str) -> Any:
    """The reference model a KL run (``beta``, the trainer config's) must load itself: under
    ZeRO-3 init (weights sharded at load) without LoRA the trainer cannot copy the initial
    policy, so it is loaded a second time from ``policy`` (the PolicyConfig); None otherwise
    (the trainer copies it, or LoRA's disabled adapter is it)."""
    if not kl_enabled(beta) or policy.use_lora or not is_partitioned(model):
        return None
    return load_policy(policy, device=device, use_lora=False)[0]


def collate(samples: list[Sample], pad_id: int, device: torch.device,
            ref: dict[int, list[float]] | None = None) -> dict[str, torch.Tensor]:
    """Right-padded batch; ``mask`` marks completion tokens as positions in the shifted
    (next-token) frame, aligned with ``behaviour`` log-probs. With a branching
    :class:`TargetRow` the attention mask is 4D, with position ids (:func:`tree_inputs`)."""
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
        if ref is not None and b > a:  # pure-target samples have no completion tokens (no reference)
            ref_lp[r, a:b] = torch.tensor(ref[id(s)], dtype=torch.float)
        adv[r] = s.advantage / s.weight  # merged samples: mean advantage, counted `weight` times
        weight[r] = s.weight
    out = {k: v.to(device) for k, v in dict(input_ids=ids, attention_mask=attn, mask=mask, old=old,
                                            ref=ref_lp, adv=adv, weight=weight).items()}
    if any(isinstance(s, TargetRow) and s.branches for s in samples):
        out.update(tree_inputs(samples, width, device))
    return out


@dataclass
class TargetRow(Sample):
    """Pure supervised-target samples (a target, no completion) packed into one row by
    :func:`pack_targets`: ``prompt_ids`` are the nodes of their sequences' prefix tree in
    depth-first order, ``parents`` each node's parent (-1: a root), ``targets`` each sample's
    (node whose next-token logits it targets, token ids, probabilities, weight)."""

    parents: list[int] = field(default_factory=list)
    targets: list[tuple[int, list[int], list[float], float]] = field(default_factory=list)

    @property
    def branches(self) -> bool:
        """Whether the row is more than one sequence (a token whose parent is not the one before it)."""
        return any(p != i - 1 for i, p in enumerate(self.parents))


def target_entries(s: Sample) -> list[tuple[int, list[int], list[float], float]]:
    """A sample's supervised targets as (logit position in ``prompt + completion``, token ids,
    probabilities, weight): a :class:`TargetRow`'s all, another sample's one or none."""
    if isinstance(s, TargetRow):
        return s.targets
    if s.target is None:
        return []
    return [(len(s.prompt_ids) - 1 + s.target[0], s.target[1], s.target[2], s.weight)]


def pack_targets(samples: list[Sample], branching: bool = False) -> list[Sample]:
    """The pure-target samples (a target, no completion) packed into :class:`TargetRow` s, the
    other samples first, as they are. The logits of a causal LM at a token depend only on that
    token's prefix and positions, so sequences that share a prefix can share its tokens: with
    ``branching`` (the model takes a custom attention mask and position ids, :func:`tree_inputs`)
    a row is a prefix tree of sequences, each token attending to its ancestors at its depth;
    without, a row is a chain of sequences each a prefix of the next (the causal mask as it is).
    A row never gets longer than the batch's longest sequence, so it never widens a micro-batch.
    The loss is the same as one row per sample, summed in another floating-point order. The
    distillation targets (``distill_samples``: a target per answer token, each on the whole
    prompt) share all but their last few tokens."""
    pure = sorted((s for s in samples if s.target is not None and not s.completion_ids), key=lambda s: s.prompt_ids)
    width = max((len(s.prompt_ids) + len(s.completion_ids) for s in samples), default=0)
    rows: list[TargetRow] = []
    prev: list[int] = []
    path: list[int] = []  # the node of each token of prev, the last sequence placed
    for s in pure:
        # in lexicographic order the sequence placed last shares the longest prefix with s
        seq, n = s.prompt_ids, len(os.path.commonprefix([prev, s.prompt_ids]))
        row = rows[-1] if rows else None
        if row is None or not (branching or n == len(prev)) or len(row.prompt_ids) + len(seq) - n > width:
            row, n, path = TargetRow([], [], [], role=s.role, task=s.task, policy_version=s.policy_version,
                                     weight=s.weight, target=s.target), 0, []
            rows.append(row)
        start = len(row.prompt_ids)
        path = path[:n] + list(range(start, start + len(seq) - n))
        row.prompt_ids = row.prompt_ids + seq[n:]
        row.parents += [path[k - 1] if k else -1 for k in range(n, len(seq))]
        row.targets.append((path[len(seq) - 1 + s.target[0]], s.target[1], s.target[2], s.weight))
        prev = seq
    return [s for s in samples if s.completion_ids or s.target is None] + rows


def tree_inputs(samples: list[Sample], width: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The boolean 4D attention mask (True: attend) and position ids of a right-padded batch
    holding branching :class:`TargetRow` s: a node attends to its ancestors and itself at
    position = its depth; every other row (and the padding) keeps the causal mask and
    positions 0, 1, ..."""
    allowed = torch.ones(width, width, dtype=torch.bool).tril().repeat(len(samples), 1, 1)
    positions = torch.arange(width).repeat(len(samples), 1)
    for r, s in enumerate(samples):
        if not (isinstance(s, TargetRow) and s.branches):
            continue
        for i, p in enumerate(s.parents):
            allowed[r, i, : len(s.parents)] = allowed[r, p, : len(s.parents)] if p >= 0 else False
            allowed[r, i, i] = True
            positions[r, i] = positions[r, p] + 1 if p >= 0 else 0
    return {"attention_mask": allowed.unsqueeze(1).to(device), "position_ids": positions.to(device)}


def by_length(samples: list[Sample]) -> list[Sample]:
    """``samples`` longest ``prompt + completion`` first, equal lengths in their given order (a
    stable sort). Runs cut from it by :func:`split_by_tokens` hold sequences of about one length,
    so a row is padded only to its neighbours' width (the main job's step: 0.83 of the padded
    tokens real when cut in the shuffled order, 0.92 cut this way; ``benchmarks/bench_main_job.py
    --grouping``). The trainer keys every result of a row by its sample, never by its place."""
    return sorted(samples, key=lambda s: -(len(s.prompt_ids) + len(s.completion_ids)))


def split_by_tokens(samples: list[Sample], max_tokens: int) -> list[list[Sample]]:
    """``samples`` cut, in order, into runs whose right-padded batch (rows x longest
    ``prompt + completion``) holds at most ``max_tokens`` tokens; a sample longer than the cap is
    a run of its own (a sequence is never split). ``max_tokens`` 0: one run. No sample: no run."""
    runs: list[list[Sample]] = []
    width = 0
    for s in samples:
        n = len(s.prompt_ids) + len(s.completion_ids)
        if runs and (not max_tokens or (len(runs[-1]) + 1) * max(width, n) <= max_tokens):
            runs[-1].append(s)
            width = max(width, n)
        else:
            runs.append([s])
            width = n
    return runs


def master_weights(model: Any, accelerator: Any) -> torch.dtype | None:
    """Hold the trained parameters in float32 and return the dtype the forward should compute in
    (``None``: as the weights are).

    AdamW on bfloat16 weights loses every update smaller than half a weight's last bit: at lr
    1e-6 only ~2% of the weights move at all. So trainable bfloat16 / float16 parameters are
    upcast here, before the optimizer sees them; on a GPU the forward then runs in their old dtype
    under autocast (what accelerate's ``mixed_precision`` does: it is used instead when set), on a
    CPU in float32 (a CPU run never computes in bfloat16). LoRA adapters are float32 already (PEFT).
    Under DeepSpeed its bf16 / fp16 mode keeps float32 master weights itself. ConfigError for mixed
    precision on a CPU run, and for low-precision weights under DeepSpeed without mixed precision."""
    low = {p.dtype for p in model.parameters() if p.requires_grad} & {torch.bfloat16, torch.float16}
    mp = str(accelerator.mixed_precision)
    on_cpu = accelerator.device.type == "cpu"
    if on_cpu and mp not in ("no", "None"):
        raise ConfigError(f"mixed_precision {mp} on a CPU run: CPU training computes in float32; "
                          f"set mixed_precision 'no' in the accelerate config")
    if not low:
        return None
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        if mp not in ("bf16", "fp16"):
            raise ConfigError(f"{low.pop()} weights under DeepSpeed without mixed precision would be updated in "
                              f"place; set mixed_precision bf16 in the accelerate config or dtype float32")
        return None
    if on_cpu:
        model.float()
        return None
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    return None if mp != "no" else low.pop()


def autocast_forward(model: Any, dtype: torch.dtype | None) -> None:
    """Run ``model``'s forward (and so ``generate``'s) under CUDA autocast in ``dtype``, as
    accelerate's mixed precision does; bound as a method so a deep copy autocasts its own forward."""
    if dtype is None:
        return
    forward = torch.autocast(device_type="cuda", dtype=dtype)(model.forward.__func__)
    model.forward = MethodType(forward, model)


class PolicyTrainer:
    def __init__(self, model: Any, tokenizer: Any, config: TrainerConfig, accelerator: Any = None,
                 ref_model: Any = None, total_steps: int = 200, target_loss: TargetLossConfig | None = None,
                 surrogate: SurrogateConfig | None = PPO_SURROGATE):
        """``total_steps``: the ``step()`` calls the learning-rate schedule and the beta schedule
        span, given by the recipe (its loop's length, a count it derives). ``target_loss``: the
        supervised-target term's config; None: the trainer takes no target samples (``step``
        raises on one). ``surrogate``: the policy-gradient term's config; None: no such term,
        every sample's advantage must be 0 (search self-play's distillation)."""
        from transformers import get_scheduler

        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"total_steps must be an integer >= 1, got {total_steps!r}")
        self.cfg = config
        self.target_loss, self.surrogate = target_loss, surrogate
        self.total_steps = total_steps
        self.tokenizer = tokenizer
        self.accelerator = accelerator or make_accelerator(config.gradient_accumulation_steps)
        self.is_peft = hasattr(model, "disable_adapter")
        self.kl_on = kl_enabled(config.beta)
        self._tis = TruncatedImportance(surrogate.tis_cap if surrogate is not None else 0.0)
        # a boolean 4D mask with position ids is what transformers' SDPA attention takes as it is
        # (eager adds the mask, flash attention takes none): target rows branch only there
        self.tree_attention = getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa"
        if self.kl_on and ref_model is None and not self.is_peft:
            if is_partitioned(model):
                raise ValueError("the model was loaded partitioned (DeepSpeed ZeRO-3 init): a deep copy of it "
                                 "is not a reference model; load a second copy and pass ref_model=")
            ref_model = copy.deepcopy(model)  # the initial policy, frozen
        self._fill_deepspeed_config()
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
        self._served = engine  # its detector checks the next step; sleeps (if it can) when that step starts
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
        self._ref_rows: dict[int, torch.Tensor] = {}
        exact = self.cfg.kl_estimator == "exact"
        cap = self.cfg.max_tokens_per_micro_batch
        ordered = by_length(samples)  # less padding; the results are keyed by sample
        parts = split_by_tokens(ordered, cap) if cap else [ordered[i : i + 64] for i in range(0, len(ordered), 64)]
        for part in parts:
            b = collate(part, self.pad_id, self.accelerator.device)
            logits = self._ref_logits(b["input_ids"], b["attention_mask"])
            lp, _ = logprobs_from_logits(logits, b["input_ids"], self.cfg.temperature, where=b["mask"])
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
        for _ in range(self._most_across_ranks(made) - made):
            self._ref_logits(ids, torch.ones_like(ids))

    def _most_across_ranks(self, n: int) -> int:
        """The largest ``n`` of any rank (every rank must call it: a collective when there are several)."""
        acc = self.accelerator
        if acc.num_processes == 1:
            return n
        return int(acc.gather(torch.tensor([n], device=acc.device)).max())

    def _filler_ids(self) -> torch.Tensor:
        """The input of a forward made only to keep the ranks' collectives in step."""
        return torch.full((1, 2), self.pad_id, dtype=torch.long, device=self.accelerator.device)

    def _log_softmax_cpu(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.log_softmax(x / self.cfg.temperature, dim=-1).cpu(),)

    def _ref_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The reference policy's logits: the ref model, or under LoRA the moved magnet's
        adapter swapped in, or the adapter-disabled base model."""
        if self.ref_model is not None:
            return self.ref_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        if self.magnet is not None:
            with self._adapter_weights(self.magnet):
                return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        with self.unwrapped.disable_adapter():
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    # --- the reference (the magnet) --------------------------------------------------
    @contextmanager
    def _full(self, params: list[torch.Tensor], modify: bool = False) -> Iterator[None]:
        """Inside: ``params`` hold their full values on every rank. Under ZeRO-3 they are
        gathered; with ``modify`` rank 0's values are re-partitioned on exit (every rank
        writes the same values, so whichever rank DeepSpeed keeps is right)."""
        if self.deepspeed_stage != 3:
            yield
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=0 if modify else None):
            yield

    def _adapter_params(self) -> list[torch.Tensor]:
        return [p for p in self.unwrapped.parameters() if p.requires_grad]

    @torch.no_grad()
    def _read(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        out = []
        for p in params:  # one at a time: a ZeRO-3 gather never holds more than one tensor
            with self._full([p]):
                out.append(p.data.detach().clone())
        return out

    @torch.no_grad()
    def _write(self, params: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        for p, v in zip(params, values, strict=True):
            with self._full([p], modify=True):
                p.data.copy_(v.to(p.data.device, p.data.dtype))

    @contextmanager
    def _adapter_weights(self, values: list[torch.Tensor]) -> Iterator[None]:
        """Inside: the adapter holds ``values``; on exit its own weights are back, bit for
        bit (no optimizer step happens inside, so nothing else sees the swap)."""
        params = self._adapter_params()
        own = self._read(params)
        self._write(params, values)
        try:
            yield
        finally:
            self._write(params, own)

    def reference_weights(self) -> list[torch.Tensor]:
        """The moved reference as full tensors: the ref model's parameters, or under LoRA
        the magnet's adapter weights (empty while the reference is the adapter-disabled model)."""
        if self.ref_model is not None:
            return self._read(list(self.ref_model.parameters()))
        return [t.clone() for t in self.magnet] if self.magnet is not None else []

    @torch.no_grad()
    def update_reference(self) -> None:
        """Move the magnet to the current policy (every rank, in step: ZeRO-3 gathers)."""
        if self.ref_model is not None:
            for q, p in zip(self.ref_model.parameters(), self.unwrapped.parameters(), strict=True):
                with self._full([p]), self._full([q], modify=True):
                    q.data.copy_(p.data)
        elif self.is_peft:
            self.magnet = self._read(self._adapter_params())
        self.magnet_step = self.step_count

    def kl_coef(self, sample: Sample, step: int | None = None) -> float:
        """beta_i(t): the sample's game/role coefficient times the schedule at ``step``."""
        step = self.step_count if step is None else step
        return beta_for(self.cfg.beta, sample.role, sample.task) * beta_factor(self.cfg, step, self.total_steps)

    def _micro_batches(self, samples: list[Sample], rng: random.Random) -> list[list[Sample]]:
        """The samples of one optimizer step, shuffled, in ``gradient_accumulation_steps`` groups
        of ceil(N / groups) samples, each group sorted longest first (:func:`by_length`, ties in
        the shuffled order) and cut by :func:`split_by_tokens` under ``max_tokens_per_micro_batch``;
        then padded with empty micro-batches to the largest count of any rank, so every rank makes
        the same forwards and backwards (DDP / ZeRO collectives). A pass's loss is a token sum over
        the whole batch divided by its token count, with one optimizer step per pass, so the
        sorting does not change the gradient (only the order its float terms are summed in). The
        shuffle still decides the groups and the order of equal lengths; the logged ``loss``,
        ``kl``, ``entropy``, ``clip_frac``, ``ratio`` and ``logprob_diff`` are means of the
        micro-batches' means, so their values move with the cut."""
        order = list(samples)
        rng.shuffle(order)
        k = self.cfg.gradient_accumulation_steps
        size = math.ceil(len(order) / k) if order else 0
        groups = [by_length(order[i * size : (i + 1) * size]) for i in range(k)]
        out = [mb for g in groups for mb in (split_by_tokens(g, self.cfg.max_tokens_per_micro_batch) or [[]])]
        return out + [[] for _ in range(self._most_across_ranks(len(out)) - len(out))]

    # --- the step -------------------------------------------------------------------
    def step(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step per pass (``num_iterations`` passes) on this rank's samples.
        Metrics include ``logprob_diff``: mean |current - behaviour| log-prob of the sampled
        tokens in the first pass, before any update (the weight-sync check's measure)."""
        cfg, acc = self.cfg, self.accelerator
        self._check_terms(samples)
        getattr(getattr(self, "_served", None), "sleep", lambda: None)()  # vLLM sleep mode: memory to training
        self._tis.begin_step()
        if cfg.merge_identical:
            samples = merge_identical(samples)
        n_samples = len(samples)
        samples = pack_targets(samples, branching=self.tree_attention)
        rng = random.Random(cfg.seed * 1_000_003 + self.step_count * 7919 + acc.process_index)
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
        out.update(self._engine_metrics(out))
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

    def _engine_metrics(self, metrics: dict[str, float]) -> dict[str, Any]:
        """What the engine last served (:meth:`serving`) reports every step: the weight-sync check
        (``sync/logprob_diff``, ``sync/stale``) — its detector (:func:`~lmselfplay.lm.engines.factory.make_engine`
        gives every learner engine one) judges the first pass's ``logprob_diff``, warning or raising
        (``strict_sync``) when the engine's weights are not the trainer's; nothing is judged when no
        sampled token was trained on (pure targets) — and, where the engine has them, its dtype
        (``engine/dtype``) and the prompts it was too short for (``engine/over_long_prompts``, run total)."""
        engine = getattr(self, "_served", None)
        if engine is None:
            return {}
        out: dict[str, Any] = {"engine/over_long_prompts": float(getattr(engine, "over_long_prompts", 0))}
        if isinstance(getattr(engine, "dtype", None), str):
            out["engine/dtype"] = engine.dtype
        detector = getattr(engine, "detector", None)
        if detector is not None and "logprob_diff" in metrics:
            out.update(detector.check(metrics["logprob_diff"], self.step_count, type(engine).__name__))
        return out

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
            target_loss, target_ce = self._target_loss(mb, logits, keep)
            loss = self.target_loss.target_coef * target_loss * acc.gradient_accumulation_steps
            return loss, ({"target_ce": target_ce} if target_ce is not None else {})
        b = collate(mb, self.pad_id, acc.device, ref)
        need_entropy = cfg.entropy_coef > 0
        logits = self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                            position_ids=b.get("position_ids"), use_cache=False).logits
        lp, ent = logprobs_from_logits(logits, b["input_ids"], cfg.temperature, True, where=b["mask"])
        if not need_entropy:
            ent = ent.detach()  # logged (collapse shows as entropy -> 0), not optimized
        mask = b["mask"]
        w = b["weight"].unsqueeze(1) * mask
        pg, pg_parts = self._policy_gradient(mb, lp, b, w, first_pass)
        tok = pg
        kl = torch.zeros_like(tok)
        if self.kl_on:
            kl = self._kl(mb, logits, lp, b)
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
            target_loss, target_ce = self._target_loss(mb, logits)
            loss = loss + self.target_loss.target_coef * target_loss * acc.gradient_accumulation_steps
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

    def _policy_gradient(self, mb: list[Sample], lp: torch.Tensor, b: dict[str, torch.Tensor], w: torch.Tensor,
                         first_pass: bool) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped surrogate per token and its metrics (``clip_frac``, ``ratio``; with
        ``tis_cap`` the TIS weights' on the first pass). The ratio is against the engine's
        log-probs, or with ``tis_cap`` against the trainer's own at the step's start, the
        mismatch weighted. Without a :class:`SurrogateConfig` zero (every advantage is 0:
        checked in ``step``) and no metrics."""
        if self.surrogate is None:
            return torch.zeros_like(lp), {}
        eps, old, tis, parts = self.surrogate.epsilon, b["old"], None, {}
        if self.surrogate.tis_cap > 0:
            old = self._tis.old_logprobs(mb, lp, b["mask"], first_pass)
            tis, tis_parts = self._tis.weights(old, b["old"], w)
            parts.update(tis_parts if first_pass else {})
        ratio = torch.exp(torch.clamp(lp - old, -20, 20))
        adv = b["adv"].unsqueeze(1)
        pg = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
        if tis is not None:
            pg = pg * tis
        with torch.no_grad():
            wsum = w.sum().clamp_min(1e-8)
            parts.update(clip_frac=float((((ratio - 1).abs() > eps).float() * w).sum() / wsum),
                         ratio=float((ratio * w).sum() / wsum))
        return pg, parts

    def _kl(self, mb: list[Sample], logits: torch.Tensor, lp: torch.Tensor, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """:func:`kl_per_token` on the micro-batch's grid (zero off the completion tokens).
        The exact KL works on the completion positions only: the reference rows of the
        step (row-major, as ``mask`` enumerates them) against the policy's there."""
        if self.cfg.kl_estimator == "k3":
            return kl_per_token("k3", lp, b["ref"])
        if not any(s.completion_ids for s in mb):  # only targets (ZeRO-3 brings them here): no KL
            return torch.zeros_like(lp)
        ref_all = torch.cat([self._ref_rows[id(s)] for s in mb if s.completion_ids])
        rows, cols, (exact,) = over_positions(logits, F.pad(b["mask"].bool(), (0, 1)), self._exact_kl_block, ref_all)
        return torch.zeros_like(lp).index_put((rows, cols), exact)

    def _exact_kl_block(self, x: torch.Tensor, ref_all: torch.Tensor) -> tuple[torch.Tensor]:
        """KL(ref || policy) at a block of positions (x: their float32 logits, ref_all: the
        reference's log-probs there, kept on the CPU)."""
        logp_all = torch.log_softmax(x / self.cfg.temperature, dim=-1)
        return (kl_per_token("exact", None, None, logp_all, ref_all.to(x.device)),)

    def _target_loss(self, mb: list[Sample], logits: torch.Tensor,
                     columns: list[int] | None = None) -> tuple[torch.Tensor | float, float | None]:
        """Cross-entropy from each target distribution of the micro-batch (:func:`target_entries`:
        ``Sample.target``, index into the completion, token ids, probabilities, or a
        :class:`TargetRow`'s several) to the policy's next-token distribution at its position,
        weighted by its sample's weight and divided by the total target weight of this rank's
        batch (set in ``step``); 0 when the micro-batch has none. ``logits``: the micro-batch's
        forward (rows in ``mb``'s order) at every position, or at the positions ``columns`` only;
        the policy-gradient forward's is reused, so the term costs no forward of its own and
        every rank makes the same forwards whatever its samples (ZeRO-3 gathers shards per forward)."""
        entries = [(r, e) for r, s in enumerate(mb) for e in target_entries(s)]
        if not entries:
            return 0.0, None
        col = {p: i for i, p in enumerate(columns)} if columns is not None else None
        rows = torch.tensor([r for r, _ in entries], device=logits.device)
        pos = torch.tensor([e[0] if col is None else col[e[0]] for _, e in entries], device=logits.device)
        logp = torch.log_softmax(logits[rows, pos].float() / self.cfg.temperature, dim=-1)
        probs = torch.zeros_like(logp)  # a token listed twice counts twice
        for i, (_, e) in enumerate(entries):
            probs[i].index_add_(0, torch.tensor(e[1], device=probs.device),
                                torch.tensor(e[2], dtype=probs.dtype, device=probs.device))
        ce = -(logp * probs).sum(-1)
        w = torch.tensor([e[3] for _, e in entries], dtype=ce.dtype, device=ce.device)
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
                            "trainer_config": asdict(self.cfg), "magnet_step": self.magnet_step,
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
                self._write(list(self.ref_model.parameters()), blob["reference"])
            else:
                self.magnet = list(blob["reference"])
        return blob["extra"]

