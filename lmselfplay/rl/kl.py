"""The KL term to the reference policy: its coefficient per game / role (:class:`KLCoefficient`,
keyed by :class:`BetaKey`) and schedule over the run (:func:`beta_factor`), its per-token estimators
(:func:`kl_per_token`), and the reference model a sharded run loads (:func:`reference_policy`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from lmselfplay.lm.trajectory import role_parts, seat_of
from lmselfplay.models.policy import load_policy
from lmselfplay.rl.distributed import is_partitioned
from lmselfplay.utils.config import ConfigError

BETA_SCHEDULES = ("constant", "linear", "cosine")
KL_ESTIMATORS = ("k3", "exact")
DEFAULT_KEY = "default"  # the entry of a per-key beta that covers the samples no key covers


@dataclass(frozen=True)
class BetaKey:
    """The samples one entry of a per-key beta covers, named by the '/'-parts of a role prefix:
    one part (``nim``) a game, a task or a one-part role (R-Zero's ``solver``); a game and seat
    (``kuhn_poker/p1``); a game role, game x seat x start (``kuhn_poker/p1/initial``,
    :func:`~lmselfplay.lm.trajectory.role_key`); other parts, the prefix of another recipe's roles
    (debate's ``debate/true``). :attr:`kind` says which."""

    parts: tuple[str, ...]

    @classmethod
    def parse(cls, name: str) -> BetaKey:
        """The key a config names (``"kuhn_poker/p1"``)."""
        return cls(tuple(name.split("/")))

    @classmethod
    def of(cls, game: str, seat: int | None = None, start: str | None = None) -> BetaKey:
        """The key of a game, a game's seat, or one of its roles."""
        return cls(role_parts(game, seat, start))

    @property
    def kind(self) -> str:
        """What the key names: a game or task, a game and seat, a role (game, seat, start), or a role prefix."""
        if len(self.parts) == 1:
            return "game or task"
        if len(self.parts) <= 3 and seat_of(self.parts[1]) is not None:
            return "game and seat" if len(self.parts) == 2 else "role"
        return "role prefix"

    @property
    def game(self) -> str:
        """The first part: the game of a game's key."""
        return self.parts[0]

    def __str__(self) -> str:
        return "/".join(self.parts)


@dataclass(frozen=True)
class KLCoefficient:
    """The KL coefficient of each sample (the trainer config's ``beta``): ``default`` for every
    sample, or, with ``per_key``, one per :class:`BetaKey` and ``default`` (None: none) for the
    samples no key covers (:meth:`of`). A config gives it as a number, a mapping or NAME=NUMBER
    entries (:meth:`from_config`); :meth:`as_config` is that number or mapping again."""

    default: float | None = 0.1
    per_key: tuple[tuple[BetaKey, float], ...] | None = None  # None: one number for every sample

    @classmethod
    def from_config(cls, value: Any) -> KLCoefficient:
        """A number (``0.1``, ``"0.1"``), a mapping (``{"nim": 0.1, "kuhn_poker/p1": 0.3,
        "default": 0.05}``) or NAME=NUMBER entries (``"nim=0.1,kuhn_poker/p1=0.3"``, the
        ``parse_weights`` syntax); an instance as it is. ConfigError (a ValueError) names the bad
        entry: not a number, negative, or NAME=NUMBER without a name."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            value = _beta_text(value)
        if isinstance(value, dict):
            return cls._of_mapping(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(f"beta must be a number >= 0 or a mapping of them, got {value!r}")
        return cls(float(value))

    @classmethod
    def _of_mapping(cls, value: dict) -> KLCoefficient:
        numbers = {str(name): _beta_entry(name, v) for name, v in value.items()}
        default = numbers.pop(DEFAULT_KEY, None)
        return cls(default, tuple((BetaKey.parse(name), v) for name, v in numbers.items()))

    def as_config(self) -> float | dict[str, float]:
        """The number, or the mapping by key name ('default' last): the value ``config.json`` holds."""
        if self.per_key is None:
            return self.default
        return {**{str(k): v for k, v in self.per_key}, **({} if self.default is None else {DEFAULT_KEY: self.default})}

    def __str__(self) -> str:
        """As a command line gives it: ``0.1`` or ``nim=0.1,default=0.05``."""
        value = self.as_config()
        return ",".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else str(value)

    @cached_property
    def _table(self) -> dict[BetaKey, float]:
        """Every entry by its key, 'default' too (a role or task named so gets it, as every name)."""
        default = {} if self.default is None else {BetaKey.parse(DEFAULT_KEY): self.default}
        return {**dict(self.per_key or ()), **default}

    def of(self, role: str, task: str = "") -> float:
        """The coefficient of a sample: with no keys, ``default``; else the key of the longest
        '/'-prefix of ``role`` (``kuhn_poker/p0/initial`` -> ``kuhn_poker/p0`` -> ``kuhn_poker``),
        then of ``task``, then ``default``; KeyError when none is there."""
        if self.per_key is None:
            return self.default
        parts = role.split("/") if role else []
        keys = [BetaKey(tuple(parts[:n])) for n in range(len(parts), 0, -1)] + ([BetaKey.parse(task)] if task else [])
        found = next((self._table[k] for k in keys if k in self._table), self.default)
        if found is None:
            raise KeyError(f"no KL coefficient for role {role!r} (task {task!r}) in beta {self.as_config()}: "
                           "add it or 'default'")
        return found

    @property
    def enabled(self) -> bool:
        """Whether any sample can get a KL term (then a reference policy is needed)."""
        return any(v > 0 for v in self._table.values())


def _beta_text(value: str) -> float | dict[str, str]:
    """A command line's beta: a number, or NAME=NUMBER entries as a mapping (numbers unchecked)."""
    if "=" not in value:
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"beta {value!r} is neither a number nor NAME=NUMBER entries") from None
    items = [x.strip().partition("=") for x in value.split(",") if x.strip()]
    if any(not sep or not name.strip() for name, sep, _ in items):
        raise ConfigError(f"bad beta {value!r}: expected NAME=NUMBER entries separated by commas")
    return {name.strip(): v.strip() for name, _, v in items}


def _beta_entry(name: Any, value: Any) -> float:
    """One entry's number; ConfigError naming the entry when it is none or negative."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"beta entry '{name}={value}' is not a number") from None
    if not number >= 0:
        raise ConfigError(f"beta entry '{name}={value}' must be >= 0")
    return number


def kl_enabled(beta: KLCoefficient | float | dict[str, float]) -> bool:
    """Whether any sample can get a KL term (then a reference policy is needed); ``beta`` in any
    form :meth:`KLCoefficient.from_config` takes."""
    return KLCoefficient.from_config(beta).enabled


def beta_for(beta: KLCoefficient | float | dict[str, float], role: str, task: str = "") -> float:
    """The coefficient of a sample (:meth:`KLCoefficient.of`), ``beta`` in any form
    :meth:`KLCoefficient.from_config` takes."""
    return KLCoefficient.from_config(beta).of(role, task)


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


def beta_factor(cfg: Any, step: int, total_steps: int) -> float:
    """The schedule's multiplier at trainer step ``step``: 1 at step 0, ``beta_final_ratio``
    from ``total_steps`` on; linear or half-cosine in between (constant: always 1)."""
    if cfg.beta_schedule == "constant" or total_steps <= 0:
        return 1.0
    frac = min(max(step / total_steps, 0.0), 1.0)
    shape = frac if cfg.beta_schedule == "linear" else (1 - math.cos(math.pi * frac)) / 2
    return 1.0 + (cfg.beta_final_ratio - 1.0) * shape



def reference_policy(policy: Any, beta: KLCoefficient, model: Any, device: str) -> Any:
    """The reference model a KL run (``beta``, the trainer config's) must load itself: under
    ZeRO-3 init (weights sharded at load) without LoRA the trainer cannot copy the initial
    policy, so it is loaded a second time from ``policy`` (the PolicyConfig); None otherwise
    (the trainer copies it, or LoRA's disabled adapter is it)."""
    if not kl_enabled(beta) or policy.use_lora or not is_partitioned(model):
        return None
    return load_policy(policy, device=device, use_lora=False)[0]

