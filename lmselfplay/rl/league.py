"""The league: a bank of frozen checkpoints to play against, and how to pick opponents.

* a ring of ``capacity`` frozen snapshots (default 12), one added every ``add_every``
  learner steps; every ``promote_every``-th snapshot is also promoted to a hall of fame
  of ``league_hall_capacity`` snapshots (its oldest member leaves when it is full, so a long
  run's bank, engines and payoff table stay bounded);
* an opponent mix per episode: mirror self-play (the learner in both seats), a recent
  frozen snapshot, a hall-of-fame snapshot, or a fixed bot (random); the loss is only on
  the learner's seats (frozen seats record no trajectory);
* meta-solvers (:func:`lmselfplay.game_theory.matrix_games.meta_strategy`) weight the bank: ``last`` (iterated best
  response), ``uniform`` (fictitious play) or ``nash`` of the payoff table between bank
  members (double oracle) — the table is filled by :meth:`League.play_in` (each new
  snapshot plays every ring member once, ``league_eval_games`` games; :class:`PlayInConfig`, a
  part only of the recipes whose league plays them).

Snapshots are the CPU weights the recipe hands in (:func:`lmselfplay.models.policy.policy_weights`:
the adapter alone under LoRA, a few MB). Engines for them come from the recipe's engine
factory ``make_engine(weights, version) -> Engine`` (HF, vLLM, LoRA alike), are built lazily
and a few are cached (``max_live_engines``), so the bank costs memory of weights, not of models.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from lmselfplay.game_theory.matrix_games import META_SOLVERS, meta_strategy
from lmselfplay.utils.config import Config, ConfigError


@dataclass
class LeagueConfig(Config):
    _argument_group_name = "league (lmselfplay.rl.league.LeagueConfig)"
    resume_fixed: ClassVar[frozenset[str]] = frozenset({"league_capacity", "league_hall_capacity"})
    league_capacity: int = field(default=12, metadata={"help": "frozen snapshots kept (a ring)"})
    league_add_every: int = field(default=10, metadata={"help": "learner steps between snapshots"})
    league_promote_every: int = field(default=4, metadata={"help": "every k-th snapshot joins the hall of fame"})
    mirror_fraction: float = field(default=0.6, metadata={"help": "games with the learner in both seats"})
    recent_fraction: float = field(default=0.25, metadata={"help": "games against the frozen ring"})
    hall_of_fame_fraction: float = field(default=0.05, metadata={"help": "games against promoted snapshots"})
    bot_fraction: float = field(default=0.1, metadata={"help": "games against a uniformly random player"})
    league_hall_capacity: int = field(default=16, metadata={
        "help": "promoted snapshots kept (the oldest leaves when full: memory stays bounded)"})

    def validate(self) -> None:
        fr = [self.mirror_fraction, self.recent_fraction, self.hall_of_fame_fraction, self.bot_fraction]
        if any(f < 0 for f in fr) or abs(sum(fr) - 1.0) > 1e-6:
            raise ConfigError("the opponent fractions mirror_fraction, recent_fraction, hall_of_fame_fraction and "
                              f"bot_fraction must be >= 0 and sum to 1, got {fr} (sum {sum(fr)})")


@dataclass
class PlayInConfig(Config):
    """How a league whose recipe plays play-in games (:meth:`League.play_in`) weights its ring;
    a league without one weights its ring uniformly and plays none."""

    _argument_group_name = "league play-in (lmselfplay.rl.league.PlayInConfig)"
    meta_solver: str = field(default="uniform", metadata={"help": "last | uniform | nash over the ring"})
    league_eval_games: int = field(default=16, metadata={
        "help": "nash meta-solver: games a new snapshot plays against each ring member to fill the payoff table"})

    def validate(self) -> None:
        if self.league_eval_games < 0:
            raise ConfigError(f"league_eval_games must be >= 0, got {self.league_eval_games}")
        if self.meta_solver not in META_SOLVERS:
            raise ConfigError(f"meta_solver must be last, uniform or nash, got {self.meta_solver!r}")


@dataclass
class Snapshot:
    step: int
    state: dict[str, torch.Tensor]
    name: str


class League:
    def __init__(self, cfg: LeagueConfig, make_engine: Callable[[dict[str, torch.Tensor], int], Any] | None = None,
                 max_live_engines: int = 4, play_in: PlayInConfig | None = None):
        """``play_in``: the meta-solver and play-in games of a recipe that plays them; None: the
        ring weighted uniformly, no play-in."""
        self.cfg, self.play_in_cfg = cfg, play_in
        self.meta_solver = play_in.meta_solver if play_in is not None else "uniform"
        self.make_engine = make_engine
        self.ring: list[Snapshot] = []
        self.hall: list[Snapshot] = []
        self.added = 0
        self.payoff: dict[tuple[str, str], list[float]] = {}  # (a, b) -> [sum of a's score, n]
        self._engines: OrderedDict[str, Any] = OrderedDict()
        self.max_live_engines = max_live_engines

    # --- the bank -------------------------------------------------------------------
    def due(self, step: int) -> bool:
        return self.cfg.league_add_every > 0 and step % self.cfg.league_add_every == 0

    def add(self, step: int, weights: dict[str, torch.Tensor]) -> Snapshot:
        """Freeze ``weights`` (CPU copies the caller no longer changes) as snapshot ``step``."""
        snap = Snapshot(step, weights, f"step{step}")
        self.ring.append(snap)
        gone = [self.ring.pop(0)] if len(self.ring) > self.cfg.league_capacity else []
        self.added += 1
        if self.cfg.league_promote_every > 0 and self.added % self.cfg.league_promote_every == 0:
            self.hall.append(snap)
            if len(self.hall) > max(self.cfg.league_hall_capacity, 0):
                gone.append(self.hall.pop(0))
        self._forget([g for g in gone if g not in self.ring and g not in self.hall])
        return snap

    def _forget(self, gone: list[Snapshot]) -> None:
        """Drop every trace (engine, payoff entries) of snapshots no longer in the bank."""
        names = {g.name for g in gone}
        for name in names:
            self._engines.pop(name, None)
        if names:
            self.payoff = {k: v for k, v in self.payoff.items() if not names & set(k)}

    def record(self, a: str, b: str, score_a: float) -> None:
        """A result between two snapshots (a's score in [-1, 1]); kept antisymmetric."""
        for key, s in (((a, b), score_a), ((b, a), -score_a)):
            acc = self.payoff.setdefault(key, [0.0, 0])
            acc[0] += s
            acc[1] += 1

    def play_in(self, snap: Snapshot, score: Any) -> None:
        """Fill the payoff table for a new ring member: ``score(snap, other)`` is snap's mean
        score in [-1, 1] against each other ring member (the recipe plays the games). Only
        the nash meta-solver reads the table, so only it pays for the games."""
        if self.meta_solver != "nash" or self.play_in_cfg.league_eval_games == 0:
            return
        for other in self.ring:
            if other.name != snap.name and (snap.name, other.name) not in self.payoff:
                self.record(snap.name, other.name, float(score(snap, other)))

    def payoff_table(self, members: list[Snapshot]) -> np.ndarray:
        n = len(members)
        U = np.zeros((n, n))
        for i, a in enumerate(members):
            for j, b in enumerate(members):
                s, k = self.payoff.get((a.name, b.name), (0.0, 0))
                U[i, j] = s / k if k else 0.0
        return U

    def ring_weights(self) -> np.ndarray:
        if not self.ring:
            return np.zeros(0)
        return meta_strategy(self.payoff_table(self.ring), self.meta_solver)

    # --- opponents ------------------------------------------------------------------
    def sample_opponent(self, rng: random.Random) -> tuple[str, Snapshot | None]:
        """("mirror" | "recent" | "hall" | "bot", snapshot or None). Falls back to mirror
        self-play while the bank is empty."""
        c = self.cfg
        kind = rng.choices(["mirror", "recent", "hall", "bot"],
                           weights=[c.mirror_fraction, c.recent_fraction, c.hall_of_fame_fraction, c.bot_fraction])[0]
        if kind == "recent" and self.ring:
            w = self.ring_weights()
            return kind, self.ring[rng.choices(range(len(self.ring)), weights=list(w))[0]]
        if kind == "hall" and self.hall:
            return kind, rng.choice(self.hall)
        if kind == "bot":
            return kind, None
        return "mirror", None

    def engine_for(self, snap: Snapshot) -> Any:
        """A frozen engine serving ``snap`` (cached; built by the recipe's engine factory)."""
        if self.make_engine is None:
            raise ValueError("this League was built without an engine factory (make_engine)")
        if snap.name in self._engines:
            self._engines.move_to_end(snap.name)
            return self._engines[snap.name]
        engine = self.make_engine(snap.state, -snap.step - 1)
        self._engines[snap.name] = engine
        while len(self._engines) > self.max_live_engines:
            self._engines.popitem(last=False)
        return engine

    # --- checkpointing --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"ring": [(s.step, s.state, s.name) for s in self.ring],
                "hall": [s.name for s in self.hall], "hall_states": {s.name: (s.step, s.state) for s in self.hall
                                                                     if s not in self.ring},
                "added": self.added, "payoff": dict(self.payoff)}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.ring = [Snapshot(step, state, name) for step, state, name in st["ring"]]
        by_name = {s.name: s for s in self.ring}
        for name, (step, state) in st["hall_states"].items():
            by_name[name] = Snapshot(step, state, name)
        self.hall = [by_name[n] for n in st["hall"]]
        self.added = int(st["added"])
        self.payoff = {tuple(k): list(v) for k, v in st["payoff"].items()}
        self._engines.clear()
