"""Ratings across checkpoints: a round robin of models and bots, Bradley-Terry on the Elo scale.

``lmselfplay arena GAME --models DIR... [--bots random,exact]``: every pair plays
``games`` games, half with each in the first seat; all games of all pairs go through ONE
stream of batched rollouts (:func:`lmselfplay.lm.rollout.play`). A draw counts half a win.

Ratings are the maximum-likelihood Bradley-Terry strengths ``P(i beats j) = 1 / (1 +
10^((R_j - R_i) / 400))`` with one virtual draw per pair that played (so a perfect record
gives a finite rating; its weight vanishes as games grow), shifted to mean ``1500``. The
95% intervals are percentile bootstrap: each pair's games are resampled and the ratings
refitted, with the outcome probabilities smoothed by the same virtual draw (half a win each
way), so a perfect record resamples an occasional loss and gets an interval, not a point.
A player who won (or lost) every game it played has no maximum-likelihood rating at all: its
rating is held by the prior alone, and ``rate`` marks it ``perfect_record``. Self-play can cycle, so "A beats B" (score share > 1/2) is
checked for non-transitivity and any cycle ``A > B > C > A`` is warned about by name.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmselfplay.utils import curves

ELO = 400.0 / math.log(10.0)
MEAN_RATING = 1500.0


@dataclass
class Results:
    """Pairwise outcomes: ``wins[i, j]`` games i won against j; ``draws`` is symmetric."""

    names: list[str]
    wins: np.ndarray
    draws: np.ndarray

    @property
    def games(self) -> np.ndarray:
        return self.wins + self.wins.T + self.draws

    def score_share(self) -> np.ndarray:
        """Points share of i against j (win 1, draw 1/2); NaN where they never met."""
        g = self.games
        with np.errstate(invalid="ignore", divide="ignore"):
            s = (self.wins + 0.5 * self.draws) / g
        s[g == 0] = np.nan
        return s


def fit_bradley_terry(wins: np.ndarray, draws: np.ndarray, prior_draws: float = 1.0) -> np.ndarray:
    """Elo-scale ML ratings (mean ``MEAN_RATING``) from pairwise wins and draws."""
    n = len(wins)
    played = (wins + wins.T + draws) > 0
    s = wins + 0.5 * draws + 0.5 * prior_draws * played  # points of i against j
    tot = s + s.T
    r = np.zeros(n)
    # Newton on the concave log-likelihood; the direction (1, ..., 1) is free (only
    # differences matter), so solve in the least-squares sense and recentre each step.
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(r[:, None] - r[None, :])))
        grad = (s - tot * p).sum(axis=1)
        w = tot * p * (1.0 - p)
        hess = np.diag(w.sum(axis=1)) - w
        step = np.linalg.lstsq(hess, grad, rcond=None)[0]
        step = np.clip(step, -4.0, 4.0)  # damped far from the optimum
        r = r + step
        r -= r.mean()
        if np.abs(step).max() < 1e-10:
            break
    return r * ELO + MEAN_RATING


def bootstrap_intervals(res: Results, n_boot: int = 200, seed: int = 0,
                        prior_draws: float = 1.0) -> np.ndarray:
    """``(n, 2)`` percentile 95% intervals of the ratings, resampling each pair's games."""
    rng = np.random.default_rng(seed)
    n = len(res.names)
    g = res.games
    samples = np.empty((n_boot, n))
    for b in range(n_boot):
        w = np.zeros((n, n))
        d = np.zeros((n, n))
        for i in range(n):
            for j in range(i + 1, n):
                m = int(g[i, j])
                if m == 0:
                    continue
                half = 0.5 * prior_draws
                p = np.array([res.wins[i, j] + half, res.draws[i, j], res.wins[j, i] + half])
                wi, dr, wj = rng.multinomial(m, p / p.sum())
                w[i, j], w[j, i], d[i, j], d[j, i] = wi, wj, dr, dr
        samples[b] = fit_bradley_terry(w, d, prior_draws)
    return np.percentile(samples, [2.5, 97.5], axis=0).T


def find_cycles(names: Sequence[str], share: np.ndarray) -> list[list[str]]:
    """Shortest cycles of "beats" (share > 1/2), one per set of members, as name lists
    starting at their first member in ``names`` order: ``[A, B, C]`` means A > B > C > A."""
    n = len(names)
    beats = [[j for j in range(n) if j != i and share[i, j] > 0.5] for i in range(n)]
    found: dict[frozenset[int], list[int]] = {}
    for start in range(n):
        cyc = _shortest_cycle(beats, start)
        if cyc is not None:
            found.setdefault(frozenset(cyc), cyc)
    out = []
    for cyc in found.values():
        k = cyc.index(min(cyc))
        out.append([names[i] for i in cyc[k:] + cyc[:k]])
    return sorted(out, key=lambda c: (len(c), c))


def _shortest_cycle(beats: list[list[int]], start: int) -> list[int] | None:
    """Breadth-first: the shortest path start -> ... -> start, as [start, ...]."""
    prev: dict[int, int | None] = {start: None}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for v in beats[u]:
            if v == start:
                path = [u]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1]
            if v not in prev:
                prev[v] = u
                queue.append(v)
    return None


def warn_cycles(names: Sequence[str], share: np.ndarray) -> list[list[str]]:
    cycles = find_cycles(names, share)
    for c in cycles:
        warnings.warn("non-transitive results: " + " > ".join([*c, c[0]]), stacklevel=2)
    return cycles


def perfect_record(res: Results, i: int) -> bool:
    """Player ``i`` won every game it played, or lost every one (no draws either way)."""
    g = res.games[i].sum()
    return bool(g > 0 and (res.wins[i].sum() == g or res.wins[:, i].sum() == g))


def rate(res: Results, n_boot: int = 200, seed: int = 0) -> dict[str, Any]:
    """Ratings, intervals, the score-share matrix and the cycles of a round robin."""
    ratings = fit_bradley_terry(res.wins, res.draws)
    ci = bootstrap_intervals(res, n_boot, seed)
    share = res.score_share()
    cycles = warn_cycles(res.names, share)
    order = np.argsort(-ratings)
    return {"names": res.names,
            "ratings": {res.names[i]: {"elo": float(ratings[i]), "ci": [float(ci[i, 0]), float(ci[i, 1])],
                                       "games": int(res.games[i].sum()),
                                       "perfect_record": perfect_record(res, i)} for i in order},
            "score_share": [[None if math.isnan(x) else float(x) for x in row] for row in share],
            "wins": res.wins.astype(int).tolist(), "draws": res.draws.astype(int).tolist(),
            "cycles": cycles}


def heatmap(names: Sequence[str], share: np.ndarray, path: str | Path, title: str = "") -> Path:
    """PNG of the row-vs-column score share (:func:`lmselfplay.utils.curves.heatmap`)."""
    return curves.heatmap(share, names, names, path, title)


# --- playing ------------------------------------------------------------------------------
def make_bot(game: Any, name: str) -> Any:
    """One of the game's reference bots (``random``, ``exact``, ``scripted``: what it supports)."""
    from lmselfplay.games.bots import reference_bots

    opp = reference_bots(game)
    if name in opp:
        return opp[name]
    raise ValueError(f"no bot {name!r} for game {game.name}; available: {', '.join(opp)}")


def round_robin(game: Any, players: dict[str, Any], games: int = 100, sampling: Any = None,
                seed: int = 0, concurrency: int = 256, progress: bool = True) -> Results:
    """Every pair plays ``games`` games (half per seating) in one batched rollout stream.
    ``players``: name -> ``LLMPlayer`` / ``BotPlayer``."""
    from tqdm.auto import tqdm

    from lmselfplay.games.text import MOVE_STOP
    from lmselfplay.lm.engines.base import SamplingParams
    from lmselfplay.lm.rollout import Episode, play_episodes

    names = list(players)
    idx = {id(p): i for i, p in enumerate(players.values())}
    if len(idx) != len(names):
        raise ValueError("each player must be a distinct object")
    sampling = sampling or SamplingParams(max_new_tokens=16, temperature=1.0, stop=MOVE_STOP, seed=seed)
    pairs = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))]
    eps = []
    for a, b in pairs:
        pa, pb = players[names[a]], players[names[b]]
        for g in range(games):
            seats = (pa, pb) if g % 2 == 0 else (pb, pa)
            eps.append(Episode(game, seats, seed=seed * 1_000_003 + len(eps)))
    n = len(names)
    wins, draws = np.zeros((n, n)), np.zeros((n, n))
    with tqdm(total=len(eps), desc=f"arena {game.name}", unit="game", disable=not progress) as bar:
        for f in play_episodes(eps, sampling, concurrency=concurrency, progress=bar):
            i, j = idx[id(f.episode.players[0])], idx[id(f.episode.players[1])]
            r0, r1 = f.returns
            if r0 > r1:
                wins[i, j] += 1
            elif r1 > r0:
                wins[j, i] += 1
            else:
                draws[i, j] += 1
                draws[j, i] += 1
    return Results(names, wins, draws)


def model_dir(path: str) -> str:
    """A model directory: ``path`` itself, or a training checkpoint's ``path/model``."""
    p = Path(path)
    if not (p / "config.json").exists() and (p / "model" / "config.json").exists():
        return str(p / "model")
    return str(path)


def game_for_models(name: str, models: Sequence[str]) -> Any:
    """Game ``name`` in the text every model in ``models`` was built to read
    (:func:`~lmselfplay.games.model_texts.make_game_for`; the registry's text with bots alone). One
    game is shared by every seat, so models built to read different texts are refused."""
    from lmselfplay.games import make
    from lmselfplay.games.model_texts import game_params_of, make_game_for

    if not models:
        return make(name)
    texts = {m: game_params_of(model_dir(m)).get(name, {}) for m in models}
    if len({json.dumps(t, sort_keys=True) for t in texts.values()}) > 1:
        raise ValueError(f"these models read {name} in different texts, so they cannot share a board: "
                         + "; ".join(f"{m}: {t or 'the default text'}" for m, t in texts.items()))
    return make_game_for(name, model_dir(models[0]))


def load_players(game: Any, models: Sequence[str], bots: Sequence[str],
                 device: str = "auto") -> dict[str, Any]:
    """Name -> player: each model (a model dir or a ``checkpoint-N`` dir of a run) as an
    ``LLMPlayer`` over its own engine, then the bots."""
    from lmselfplay.lm.engines.hf import HFEngine
    from lmselfplay.lm.rollout import LLMPlayer
    from lmselfplay.models.policy import load_policy

    players: dict[str, Any] = {}
    for m in models:
        name = Path(m).name or str(m)
        if name in players:
            name = f"{Path(m).parent.name}/{name}"
        if name in players:
            raise ValueError(f"model {m!r} given twice")
        model, tok = load_policy(model_name_or_path=model_dir(m), device=device)
        players[name] = LLMPlayer(HFEngine(model, tok), tok, learner=False, name=name)
    for b in bots:
        if b in players:
            raise ValueError(f"bot {b!r} given twice")
        players[b] = make_bot(game, b)
    if len(players) < 2:
        raise ValueError("an arena needs at least two players (models and/or bots)")
    return players
