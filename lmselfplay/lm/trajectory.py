"""What rollouts hand to the trainer: nothing it has to recompute.

A :class:`Trajectory` is one (episode, learner seat): every turn the policy played, as
the exact token ids it saw and produced. Each turn's prompt is a fresh observation (the
game state as text), so the trainer treats every turn as one :class:`Sample`
(prompt + completion, mask on the completion) that carries the episode's return.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SEAT_PART = re.compile(r"p(\d+)")  # a role's second part: the seat, p0, p1, ...


def role_parts(game: str, seat: int | None = None, start: str | None = None) -> tuple[str, ...]:
    """The '/'-parts of a game role, as many as given: the game, then ``p{seat}``, then the
    start condition (``("nim", "p0", "initial")``); a start needs a seat."""
    if start is not None and seat is None:
        raise ValueError(f"a role's start ({start!r}) needs its seat")
    return (game, *([] if seat is None else [f"p{seat}"]), *([] if start is None else [start]))


def role_key(game: str, seat: int, start: str = "initial") -> str:
    """A learner's role: game x seat x start condition (``"nim/p0/initial"``), the key of the
    role-conditioned baselines and of a per-role KL coefficient (its '/'-prefixes: game, game/pN)."""
    return "/".join(role_parts(game, seat, start))


def seat_of(part: str) -> int | None:
    """The seat a role's second part names (``"p1"`` -> 1); None when it names none."""
    m = SEAT_PART.fullmatch(part)
    return int(m.group(1)) if m else None


@dataclass
class Turn:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # behaviour log-probs of completion_ids
    text: str = ""
    invalid: bool = False  # the answer did not parse to a legal move
    action: int | None = None


@dataclass
class Sample:
    """One training sequence: ``input_ids = prompt + completion``; loss on the mask."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]
    advantage: float = 0.0
    reward: float = 0.0
    role: str = ""
    task: str = ""
    policy_version: int = 0
    weight: float = 1.0  # multiplicity after merging identical (prompt, answer) pairs
    # A supervised target distribution at one completion token (search distillation):
    # (index into completion_ids, token ids, probabilities); see PolicyTrainer._target_loss.
    target: tuple[int, list[int], list[float]] | None = None

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    @property
    def action_mask(self) -> list[int]:
        return [0] * len(self.prompt_ids) + [1] * len(self.completion_ids)


@dataclass
class Trajectory:
    game: str
    seat: int
    turns: list[Turn]
    reward: float  # the seat's return (an illegal move: its author loses max_utility, zero-sum)
    invalid: bool = False  # this seat lost by an illegal move
    truncated: bool = False  # hit max_turns: scored as a draw
    policy_version: int = 0
    opponent: str = "self"
    start: str = "initial"  # "initial" or "reset" (random legal reset): baselines keep them apart
    episode_id: int = 0

    @property
    def role(self) -> str:
        """Key for role-conditioned baselines: game x seat (x start condition)."""
        return role_key(self.game, self.seat, self.start)

    def samples(self, advantage: float | list[float]) -> list[Sample]:
        """One sample per turn: one advantage for all turns, or one per turn (shaped)."""
        per_turn = advantage if isinstance(advantage, list) else [advantage] * len(self.turns)
        if len(per_turn) != len(self.turns):
            raise ValueError(f"{len(per_turn)} advantages for {len(self.turns)} turns")
        return [Sample(t.prompt_ids, t.completion_ids, t.logprobs, float(a), self.reward, self.role,
                       self.game, self.policy_version) for t, a in zip(self.turns, per_turn)]


def merge_identical(samples: list[Sample]) -> list[Sample]:
    """Merge samples with the same (prompt, completion, version): advantages summed.

    The policy-gradient loss is linear in the advantage, so the merged batch gives the
    same gradient at a fraction of the cost (on Nim most turns repeat). With PPO
    clipping this is exact while the ratio is inside the clip range (always on the first
    pass over fresh on-policy data, where the ratio is 1); outside it the merged sample
    clips on the sign of the summed advantage. ``weight`` keeps the count so per-token
    normalization is unchanged.
    """
    merged: dict[tuple, Sample] = {}
    for s in samples:
        key = (tuple(s.prompt_ids), tuple(s.completion_ids), s.policy_version)
        if s.target is not None:  # its own target: never merged
            key = (id(s),)
        if key in merged:
            m = merged[key]
            m.advantage += s.advantage
            m.weight += s.weight
        else:
            merged[key] = Sample(s.prompt_ids, s.completion_ids, s.behaviour_logprobs, s.advantage,
                                 s.reward, s.role, s.task, s.policy_version, s.weight, s.target)
    return list(merged.values())
