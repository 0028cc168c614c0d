"""Full-feedback magnetic mirror descent: the referee gives exact expected returns.

Sampled self-play learns from one sampled return per hand: in Kuhn poker 128 noisy hands a
step do not teach the model to read the betting line. For a game small enough to enumerate
(Kuhn poker's dozen information sets by default; Nim's 28 positions with ``exact_games``), the referee -- the game's
rules -- can instead give the EXACT expected return of every action at every information set
against the current policy. This is what Sokota et al. (2022) call full feedback, the setting
of their tabular experiments. One step, per such game:

1. ``pi``: the LM's policy read exactly at every information set (teacher-forced answer
   probabilities normalized over the legal moves, one batched scoring call:
   :func:`lmselfplay.lm.readout.tabular_policy`, the ``bare`` readout). That is the
   policy only of a model that answers at once, and step 4 teaches bare answers: a policy
   that thinks (``enable_thinking``) is refused (ConfigError) rather than trained to stop
   thinking; sampled feedback serves it;
2. ``q(I, a)`` (:func:`action_values`): the expected return, to the player acting at ``I``,
   of playing ``a`` there and following ``pi`` afterwards, both seats following ``pi``,
   averaged over the histories in ``I`` weighted by their chance-and-opponent reach (the
   counterfactual value divided by the counterfactual reach). Computed by walking the whole
   game tree with the rules; nothing is sampled;
3. the magnetic-mirror-descent target at every information set (:func:`mmd_target`)::

       pi_new(a|I) ∝ [pi(a|I) * rho(a|I)^(eta*alpha) * exp(eta * q(I, a))]^(1 / (1 + eta*alpha))

   the closed-form maximizer of ``<p, q> - alpha KL(p || rho) - (1/eta) KL(p || pi)``,
   applied independently at each information set (MMD's behavioural form). ``rho`` is the
   magnet: the policy read at step 0, replaced by the policy read every ``mmd_magnet_every``
   steps, which walks the alpha-regularized equilibrium (where ``pi_new == pi``) toward Nash;
4. the target is distilled into the LM: the step's batch gets
   :func:`~lmselfplay.rl.average_policy.distill_samples` of ``pi_new`` (the trainer's
   target cross-entropy, no policy-gradient term). The next step reads the LM again, so a
   partial fit only shortens the step; it is logged as ``GAME/distill_gap`` (the largest
   |P(read) - P(last target)| at any set).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmselfplay.games.base import CHANCE, EXPLOITABILITY
from lmselfplay.games.exploitability import PolicyLike, action_probs
from lmselfplay.lm.readout import tabular_policy
from lmselfplay.utils.config import Config, ConfigError

FEEDBACKS = ("sampled", "exact")


@dataclass
class FeedbackConfig(Config):
    _argument_group_name = "feedback (lmselfplay.rl.exact_feedback.FeedbackConfig)"
    feedback: str = field(default="sampled", metadata={
        "help": "sampled: every game learns from the sampled returns of played games (policy gradient); "
                "exact: the exact_games are not played - each step the referee (the rules) computes the exact "
                "value of every action at every information set against the current policy, and the "
                "magnetic-mirror-descent target built from those values is distilled into the model; the other "
                "games keep sampled feedback"})
    exact_games: str = field(default="", metadata={
        "help": "feedback: exact: the games it applies to, comma-separated (each needs information states and a "
                "tree small enough to walk every step: kuhn_poker, nim); empty: the games whose exact_metric is "
                "'exploitability'"})
    mmd_eta: float = field(default=1.0, metadata={"help": "exact feedback: MMD step size eta"})
    mmd_alpha: float = field(default=0.3, metadata={
        "help": "exact feedback: MMD regularization alpha (the pull toward the magnet)"})
    mmd_magnet_every: int = field(default=10, metadata={
        "help": "exact feedback: steps between moves of the magnet to the current policy (0: the initial policy "
                "throughout, which converges to a regularized equilibrium, not Nash)"})

    def validate(self) -> None:
        if self.feedback not in FEEDBACKS:
            raise ConfigError(f"feedback must be one of {FEEDBACKS}, got {self.feedback!r}")
        if not self.mmd_eta > 0 or not self.mmd_alpha >= 0 or self.mmd_magnet_every < 0:
            raise ConfigError("mmd_eta must be > 0, mmd_alpha >= 0 and mmd_magnet_every >= 0 "
                              f"(got {self.mmd_eta}, {self.mmd_alpha}, {self.mmd_magnet_every})")


def exact_feedback_games(games: list[Any], names: str = "") -> list[Any]:
    """The played games exact feedback applies to: those of ``names`` (comma-separated) that
    are played, or by default those whose ``exact_metric`` is ``"exploitability"``. A listed
    game that is not played is skipped (the main job's list stays valid for a run on fewer
    games); ConfigError for a name that is no game at all, or a played game without
    information states (its policy cannot be read and valued per information set)."""
    from lmselfplay.games import REGISTRY, is_game_name, split_names

    wanted = split_names(names)
    if not wanted:
        return [g for g in games if getattr(g, "exact_metric", None) == EXPLOITABILITY]
    unknown = [n for n in wanted if not is_game_name(n)]
    if unknown:
        raise ConfigError(f"exact_games names {unknown}, which are not games ({sorted(REGISTRY)})")
    chosen = [g for g in games if g.name in wanted]
    for g in chosen:
        if not hasattr(g, "information_state"):
            raise ConfigError(f"exact_games names {g.name!r}, which has no information states: exact feedback "
                              "needs them")
    return chosen


def action_values(game: Any, policy: PolicyLike) -> dict[str, np.ndarray]:
    """``q(I, a)`` at every information set of a two-player game with chance: the expected
    return to the player acting at ``I`` of action ``a`` there, then ``policy`` for both
    seats, averaged over the histories in ``I`` weighted by chance's and the opponent's reach
    probability (the player's own reach is the same for all of them: perfect recall).
    Arrays of length ``game.n_actions``, 0 at illegal actions; all 0 at a set the opponent
    and chance never reach (no history to average over: any action is as good)."""
    num: dict[str, np.ndarray] = {}
    den: dict[str, float] = {}

    def walk(state: Any, reach: tuple[float, float, float]) -> np.ndarray:
        if game.is_terminal(state):
            return np.asarray(game.returns(state), dtype=float)
        p = game.current_player(state)
        if p == CHANCE:
            return sum(prob * walk(game.apply(state, a), (reach[0], reach[1], reach[2] * prob))
                       for a, prob in game.chance_outcomes(state))
        key = game.information_state(state, p)
        others = reach[2] * reach[1 - p]  # chance and the opponent
        den[key] = den.get(key, 0.0) + others
        num.setdefault(key, np.zeros(game.n_actions))
        value = np.zeros(2)
        for a, prob in action_probs(game, policy, state, p).items():
            nxt = list(reach)
            nxt[p] *= prob
            child = walk(game.apply(state, a), (nxt[0], nxt[1], nxt[2]))
            num[key][a] += others * child[p]
            value = value + prob * child
        return value

    walk(game.new_initial_state(), (1.0, 1.0, 1.0))
    return {k: num[k] / den[k] if den[k] > 0 else np.zeros(game.n_actions) for k in num}


def mmd_target(pi: np.ndarray, q: np.ndarray, magnet: np.ndarray, eta: float, alpha: float) -> np.ndarray:
    """One information set's MMD update over its legal actions (all arrays over the same
    actions, ``pi`` and ``magnet`` > 0): ``[pi * magnet^(eta alpha) * exp(eta q)]^(1/(1+eta alpha))``,
    normalized; computed in log space."""
    pi, q, magnet = (np.asarray(x, dtype=float) for x in (pi, q, magnet))
    if (pi <= 0).any() or (magnet <= 0).any():
        raise ValueError(f"MMD needs full-support policies (pi {pi}, magnet {magnet})")
    logits = (np.log(pi) + eta * alpha * np.log(magnet) + eta * q) / (1.0 + eta * alpha)
    e = np.exp(logits - logits.max())
    return e / e.sum()


def mmd_policy(game: Any, pi: dict[str, Any], q: dict[str, np.ndarray], magnet: dict[str, Any],
               eta: float, alpha: float, floor: float = 1e-6) -> dict[str, list[float]]:
    """:func:`mmd_target` at every information set of ``pi`` (tabular policies over
    ``game.n_actions``), over that set's legal actions; probabilities read off the LM are
    floored at ``floor`` first (a softmax is never exactly 0, its float can be)."""
    from lmselfplay.rl.average_policy import infoset_states

    out = {}
    for key, state in infoset_states(game).items():
        legal = game.legal_actions(state)
        row = np.zeros(game.n_actions)
        row[legal] = mmd_target(np.maximum(np.asarray(pi[key], dtype=float)[legal], floor), q[key][legal],
                                np.maximum(np.asarray(magnet[key], dtype=float)[legal], floor), eta, alpha)
        out[key] = row.tolist()
    return out


def max_gap(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest |a(x|I) - b(x|I)| over the information sets and actions of ``a``."""
    return float(max(np.abs(np.asarray(a[k], dtype=float) - np.asarray(b[k], dtype=float)).max() for k in a))


class ExactFeedback:
    """The full-feedback MMD state of one game: its magnet and the last target (for the
    distillation gap); :meth:`targets` makes one step's supervised samples."""

    def __init__(self, game: Any, eta: float, alpha: float, magnet_every: int):
        self.game, self.eta, self.alpha, self.magnet_every = game, eta, alpha, magnet_every
        self.magnet: dict[str, list[float]] | None = None
        self.target: dict[str, list[float]] | None = None

    def update(self, pi: dict[str, list[float]], step: int) -> tuple[dict[str, list[float]], dict[str, float]]:
        """The MMD target from ``pi`` (the policy read at ``step``), moving the magnet
        first when due; and the step's metrics: ``mmd_step`` (largest |target - pi|) and
        ``distill_gap`` (largest |pi - the previous target|: how far the last distillation
        fell short)."""
        if self.magnet is None or (self.magnet_every and step > 0 and step % self.magnet_every == 0):
            self.magnet = {k: list(v) for k, v in pi.items()}
        target = mmd_policy(self.game, pi, action_values(self.game, pi), self.magnet, self.eta, self.alpha)
        metrics = {"mmd_step": max_gap(target, pi)}
        if self.target is not None:
            metrics["distill_gap"] = max_gap(pi, self.target)
        self.target = target
        return target, metrics

    def targets(self, engine: Any, tokenizer: Any, step: int) -> tuple[list[Any], dict[str, float]]:
        """Read the LM's policy, build the MMD target, return its distillation samples
        (role ``GAME/pN/exact``) and the metrics of :meth:`update` plus ``exploitability``
        of the policy read."""
        from lmselfplay.games.exploitability import exploitability
        from lmselfplay.rl.average_policy import distill_samples

        pi = tabular_policy(engine, tokenizer, self.game)
        target, metrics = self.update(pi, step)
        metrics["exploitability"] = exploitability(self.game, pi)
        return distill_samples(self.game, tokenizer, target, start="exact"), metrics

    def state_dict(self) -> dict[str, Any]:
        return {"magnet": self.magnet, "target": self.target}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.magnet, self.target = state["magnet"], state["target"]
