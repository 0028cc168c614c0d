"""The average policy of a self-play run, and its distillation into the language model.

In a two-player zero-sum game the last iterate of policy-gradient self-play may cycle around
a mixed equilibrium; what no-regret dynamics drive to Nash is the time-average of the
iterates' strategies (fictitious play, NFSP: Heinrich & Silver 2016). In an extensive-form
game that average is not the mean of the action probabilities: the mixture "play iterate t
with probability w_t / sum w" is, by Kuhn's theorem, the behaviour policy

    avg(I) = sum_t w_t * r_t(I) * pi_t(I) / sum_t w_t * r_t(I)

at an information set I of player p, where r_t(I) is p's OWN reach probability of I under
iterate t (the product of p's action probabilities on the path to I; perfect recall makes it
the same for every history in I). An information set that no iterate reaches has the plain
w-weighted mean of the probabilities (it is never played, any policy there is equivalent).

Only small imperfect-information games can be averaged this way (``exact_metric ==
"exploitability"``: the policy is read off every information set, see
:func:`lmselfplay.lm.readout.tabular_policy`: exactly from bare answers, or for a
policy that thinks by sampling its answers, the recipe's ``readout``). :func:`distill_samples` turns the
average into supervised targets for :class:`~lmselfplay.rl.trainer.PolicyTrainer`'s
target cross-entropy: one sample per information set, the target a distribution over the
legal moves' tokens where their answers first differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmselfplay.games.base import CHANCE, EXPLOITABILITY
from lmselfplay.games.exploitability import action_probs
from lmselfplay.lm.readout import decision_states
from lmselfplay.lm.trajectory import Sample, role_key
from lmselfplay.utils.config import Config, ConfigError

WEIGHTINGS = ("uniform", "linear")


@dataclass
class AverageConfig(Config):
    _argument_group_name = "average policy (lmselfplay.rl.average_policy.AverageConfig)"
    average_policy: bool = field(default=False, metadata={
        "help": "games with exact_metric 'exploitability': keep the reach-weighted average of the policy "
                "(read off every information set every average_every steps), report its exploitability, and "
                "distil it into the final model (distill_steps)"})
    average_every: int = field(default=5, metadata={"help": "steps between policies folded into the average"})
    average_start: int = field(default=0, metadata={"help": "first step whose policy enters the average"})
    average_weighting: str = field(default="uniform", metadata={
        "help": "uniform: every averaged iterate counts the same; linear: iterate t weighs t - average_start + 1 "
                "(later iterates count more, as in linear-averaged CFR)"})
    distill_steps: int = field(default=100, metadata={
        "help": "supervised trainer steps at the end distilling the average into the model (0: none); they use "
                "the trainer's optimizer and its learning rate past max_steps, so the schedule must be constant"})

    def validate(self) -> None:
        if self.average_every < 1:
            raise ConfigError(f"average_every must be >= 1, got {self.average_every}")
        if self.average_start < 0 or self.distill_steps < 0:
            raise ConfigError("average_start and distill_steps must be >= 0")
        if self.average_weighting not in WEIGHTINGS:
            raise ConfigError(f"average_weighting must be one of {WEIGHTINGS}, got {self.average_weighting!r}")

    def averaged_at(self, step: int) -> bool:
        return step >= self.average_start and (step - self.average_start) % self.average_every == 0

    def weight_at(self, step: int) -> float:
        return 1.0 if self.average_weighting == "uniform" else float(step - self.average_start + 1)


def averageable(game: Any) -> bool:
    """Games whose policy is read off every information set (the exploitability games)."""
    return getattr(game, "exact_metric", None) == EXPLOITABILITY


def own_reach(game: Any, policy: Any) -> dict[str, float]:
    """Each information set's own reach probability for the player acting there: the
    product of that player's action probabilities on the way (chance and the opponent
    count 1). ValueError when two histories of one set disagree (no perfect recall)."""
    out: dict[str, float] = {}

    def walk(state: Any, reach: tuple[float, float]) -> None:
        if game.is_terminal(state):
            return
        p = game.current_player(state)
        if p == CHANCE:
            for a, _ in game.chance_outcomes(state):
                walk(game.apply(state, a), reach)
            return
        key = game.information_state(state, p)
        if key in out and not np.isclose(out[key], reach[p], rtol=1e-9, atol=1e-12):
            raise ValueError(f"information set {key!r} is reached with own probabilities {out[key]} and "
                             f"{reach[p]}: the game lacks perfect recall")
        out[key] = reach[p]
        for a, prob in action_probs(game, policy, state, p).items():
            nxt = (reach[0] * prob, reach[1]) if p == 0 else (reach[0], reach[1] * prob)
            walk(game.apply(state, a), nxt)

    walk(game.new_initial_state(), (1.0, 1.0))
    return out


class AveragePolicy:
    """The running reach-weighted average of tabular policies (``{infoset: probs over
    game.n_actions}``) of one game; ``add`` folds in one iterate with weight ``w``."""

    def __init__(self, game: Any):
        self.game = game
        self.num: dict[str, np.ndarray] = {}  # sum_t w_t r_t(I) pi_t(I)
        self.den: dict[str, float] = {}  # sum_t w_t r_t(I)
        self.plain: dict[str, np.ndarray] = {}  # sum_t w_t pi_t(I): sets no iterate reaches
        self.total = 0.0
        self.count = 0

    def add(self, policy: dict[str, Any], weight: float = 1.0) -> None:
        if not weight > 0:
            raise ValueError(f"an iterate's weight must be > 0, got {weight}")
        reach = own_reach(self.game, policy)
        for key, r in reach.items():
            pi = self._probs(policy, key)
            self.num[key] = self.num.get(key, 0.0) + weight * r * pi
            self.den[key] = self.den.get(key, 0.0) + weight * r
            self.plain[key] = self.plain.get(key, 0.0) + weight * pi
        self.total += weight
        self.count += 1

    def _probs(self, policy: dict[str, Any], key: str) -> np.ndarray:
        p = np.asarray(policy[key], dtype=float)
        if p.shape != (self.game.n_actions,) or not np.all(np.isfinite(p)) or (p < 0).any() or p.sum() <= 0:
            raise ValueError(f"policy at {key!r} must be {self.game.n_actions} finite probabilities >= 0, got {p}")
        return p / p.sum()

    def policy(self) -> dict[str, list[float]]:
        """The average as a tabular policy; ValueError before the first ``add``."""
        if not self.count:
            raise ValueError("no policy has been averaged yet")
        return {k: (self.num[k] / self.den[k] if self.den[k] > 0 else self.plain[k] / self.total).tolist()
                for k in sorted(self.num)}

    def state_dict(self) -> dict[str, Any]:
        return {"num": {k: v.tolist() for k, v in self.num.items()}, "den": dict(self.den),
                "plain": {k: v.tolist() for k, v in self.plain.items()}, "total": self.total, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.num = {k: np.asarray(v, dtype=float) for k, v in state["num"].items()}
        self.den = {k: float(v) for k, v in state["den"].items()}
        self.plain = {k: np.asarray(v, dtype=float) for k, v in state["plain"].items()}
        self.total, self.count = float(state["total"]), int(state["count"])


def infoset_states(game: Any) -> dict[str, Any]:
    """One representative decision state per information set (the first one found)."""
    reps: dict[str, Any] = {}
    for s in decision_states(game):
        reps.setdefault(game.information_state(s, game.current_player(s)), s)
    return reps


def distill_samples(game: Any, tokenizer: Any, policy: dict[str, Any], start: str = "average") -> list[Sample]:
    """Supervised samples that teach ``policy`` (a tabular policy) as the LM's answer
    probabilities normalized over the legal answers (what the exact metrics read), and keep
    every answer in the protocol's format: per information set, the prompt plus the answers'
    common prefix (``<move>``) with the policy's probabilities on the token where the legal
    answers first differ as target (moves sharing that token pool their probability); a
    one-hot target on every token of that common prefix and on every later token of every
    legal answer (the rest of the answer with probability 1, so the sequence probabilities
    keep the ratios of the first). A forced move (one legal answer) gets one-hot targets on
    all its tokens. The format targets matter when no game is played: the exact metrics
    renormalize over the legal answers and would not show a model that stops writing
    ``<move>``. No completion tokens: no policy-gradient or KL term, only the target
    cross-entropy. ValueError when one legal answer is a prefix of another (no token tells
    them apart). Roles are ``GAME/pN/START``."""
    from lmselfplay.games.base import move_text
    from lmselfplay.games.text import format_answer
    from lmselfplay.lm.prompt import encode_completion, encode_prompt

    out = []
    for key, s in sorted(infoset_states(game).items()):
        player, legal = game.current_player(s), game.legal_actions(s)
        answers = [encode_completion(tokenizer, format_answer(move_text(game, s, a)), eos=False) for a in legal]
        prompt = encode_prompt(tokenizer, game.observation_text(s, player))
        role = role_key(game.name, player, start)

        def one_hot(ids: list[int], positions: range, prompt=prompt, role=role) -> list[Sample]:
            """Each position's next answer token as a target with probability 1."""
            return [Sample(prompt + ids[:j], [], [], role=role, task=game.name, target=(0, [ids[j]], [1.0]))
                    for j in positions]

        if len(legal) == 1:  # a forced move: only its format to keep
            out += one_hot(answers[0], range(len(answers[0])))
            continue
        k = 0
        while all(len(x) > k for x in answers) and len({x[k] for x in answers}) == 1:
            k += 1
        if any(len(x) <= k for x in answers):
            raise ValueError(f"at {key!r} one legal answer is a prefix of another: no token tells them apart")
        probs = action_probs(game, policy, s, player)
        target: dict[int, float] = {}
        for a, ids in zip(legal, answers):
            target[ids[k]] = target.get(ids[k], 0.0) + probs[a]
        out += one_hot(answers[0], range(k))
        out.append(Sample(prompt + answers[0][:k], [], [], role=role, task=game.name,
                          target=(0, list(target), list(target.values()))))
        for ids in answers:
            out += one_hot(ids, range(k + 1, len(ids)))
    return out
