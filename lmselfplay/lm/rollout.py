"""Play many episodes at once: every pending LLM turn of every live game goes into ONE
engine call per engine per step; finished games free their slot for new ones.

Seats are :class:`LLMPlayer` (an engine; ``learner=True`` records a Trajectory) or
:class:`~lmselfplay.games.bots.BotPlayer` (a function of the state: random, exact solver, ...). Self-play is
the same engine in both seats. Illegal answers follow the zero-sum rule: after
``retries`` extra tries the offender loses the game's largest stake (``max_utility``:
1 in Nim / tic-tac-toe, 2 chips in Kuhn poker) and the other side wins it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lmselfplay.games.base import CHANCE, Invalid, forfeit_returns, resolve_chance
from lmselfplay.lm.engines.base import PROMPT_TOO_LONG, Engine, SamplingParams, generate_fitting
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.lm.trajectory import Trajectory, Turn


@dataclass
class LLMPlayer:
    engine: Engine
    tokenizer: Any
    learner: bool = True
    name: str = "policy"


@dataclass
class Episode:
    game: Any
    players: tuple[Any, Any]
    state: Any = None  # start state (None: the game's root); chance is resolved here
    start: str = "initial"
    seed: int = 0
    sampling: SamplingParams | None = None  # this game's own sampling (e.g. longer free-text answers)


@dataclass
class _Live:
    ep: Episode
    state: Any
    rng: random.Random
    episode_id: int
    turns: dict[int, list[Turn]] = field(default_factory=lambda: {0: [], 1: []})
    tries: int = 0
    n_moves: int = 0
    invalid_by: int | None = None
    truncated: bool = False
    versions: dict[int, int] = field(default_factory=dict)  # per seat: the oldest weights a turn was sampled with


@dataclass
class RolloutStats:
    episodes: int = 0
    llm_turns: int = 0
    invalid_answers: int = 0
    forfeits: int = 0
    engine_calls: int = 0
    generated_tokens: int = 0
    first_seat_wins: int = 0
    draws: int = 0
    over_long_prompts: int = 0  # answered empty without an engine call: an illegal answer (forfeit)

    def as_dict(self) -> dict[str, float]:
        d = dict(vars(self))
        d["invalid_rate"] = self.invalid_answers / max(1, self.llm_turns)
        d["first_seat_win_rate"] = self.first_seat_wins / max(1, self.episodes)
        return d


@dataclass
class Finished:
    """One ended episode: returns for both seats and the learner trajectories."""

    episode: Episode
    returns: list[float]
    trajectories: list[Trajectory]
    final_state: Any


def play_episodes(episodes: Iterable[Episode], sampling: SamplingParams, concurrency: int = 64,
         retries: int = 0, max_turns: int = 200, stats: RolloutStats | None = None,
         progress: Any = None) -> Iterator[Finished]:
    """Yield each episode as it ends. ``concurrency`` games are live at once."""
    stats = stats if stats is not None else RolloutStats()
    source = iter(episodes)
    live: list[_Live] = []
    next_id = 0
    exhausted = False
    step = 0
    while True:
        while not exhausted and len(live) < concurrency:
            ep = next(source, None)
            if ep is None:
                exhausted = True
                break
            rng = random.Random(ep.seed)
            state = ep.game.new_initial_state() if ep.state is None else ep.state
            live.append(_Live(ep, resolve_chance(ep.game, state, rng), rng, next_id))
            next_id += 1
        if not live:
            return
        # advance bots (and chance) until every live game waits on an LLM or has ended
        for g in live:
            _advance_bots(g, max_turns)
        done = [g for g in live if _ended(g)]
        for g in done:
            live.remove(g)
            yield _finish(g, stats)
            if progress is not None:
                progress.update(1)
        waiting = [g for g in live if not _ended(g)]
        if not waiting:
            continue
        # one engine call per (engine, sampling) pair: games that bring their own sampling
        # (free-text answers) are batched among themselves
        by_engine: dict[tuple[int, int], list[_Live]] = {}
        for g in waiting:
            player = g.ep.players[g.ep.game.current_player(g.state)]
            by_engine.setdefault((id(player.engine), _sampling_key(g.ep.sampling)), []).append(g)
        for group in by_engine.values():
            first = group[0].ep.players[group[0].ep.game.current_player(group[0].state)]
            prompts = []
            for g in group:
                p = g.ep.game.current_player(g.state)
                prompts.append(encode_prompt(first.tokenizer, g.ep.game.observation_text(g.state, p)))
            sp = group[0].ep.sampling or sampling
            if sampling.seed is not None:
                sp = SamplingParams(**{**vars(sp), "seed": sampling.seed * 100003 + step})
            outs = generate_fitting(first.engine, prompts, sp)
            stats.engine_calls += 1
            for g, out in zip(group, outs):
                stats.llm_turns += 1
                stats.generated_tokens += len(out.token_ids)
                stats.over_long_prompts += out.finish_reason == PROMPT_TOO_LONG
                _apply_answer(g, out, retries, stats)
        step += 1


def _sampling_key(sp: SamplingParams | None) -> tuple | None:
    return None if sp is None else (sp.max_new_tokens, sp.temperature, sp.top_p, tuple(sp.stop), sp.seed)


def _ended(g: _Live) -> bool:
    return g.invalid_by is not None or g.truncated or g.ep.game.is_terminal(g.state)


def _advance_bots(g: _Live, max_turns: int) -> None:
    game = g.ep.game
    while not _ended(g):
        if g.n_moves >= max_turns:
            g.truncated = True
            return
        p = game.current_player(g.state)
        if p == CHANCE:
            g.state = resolve_chance(game, g.state, g.rng)
            continue
        player = g.ep.players[p]
        if isinstance(player, LLMPlayer):
            return
        g.state = game.apply(g.state, player.act(game, g.state, g.rng))
        g.n_moves += 1


def _apply_answer(g: _Live, out: Any, retries: int, stats: RolloutStats) -> None:
    game = g.ep.game
    p = game.current_player(g.state)
    action = game.parse_action(g.state, out.text)
    bad = isinstance(action, Invalid)
    if out.version is not None:  # servers: weights may be pushed mid-episode
        g.versions[p] = min(g.versions.get(p, out.version), out.version)
    g.turns[p].append(Turn(out.prompt_ids, out.token_ids, out.logprobs, out.text, bad,
                           None if bad else action))
    if bad:
        stats.invalid_answers += 1
        g.tries += 1
        if g.tries > retries:
            g.invalid_by = p
        return
    g.tries = 0
    g.state = game.apply(g.state, action)
    g.n_moves += 1


def _finish(g: _Live, stats: RolloutStats) -> Finished:
    game = g.ep.game
    if g.invalid_by is not None:
        returns = forfeit_returns(g.invalid_by, getattr(game, "max_utility", 1.0))
        stats.forfeits += 1
    elif g.truncated:
        returns = [0.0, 0.0]
    else:
        returns = list(game.returns(g.state))
    stats.episodes += 1
    stats.first_seat_wins += returns[0] > returns[1]
    stats.draws += returns[0] == returns[1]
    trajectories = []
    for seat, player in enumerate(g.ep.players):
        if isinstance(player, LLMPlayer) and player.learner and g.turns[seat]:
            other = g.ep.players[1 - seat]
            opp = "self" if getattr(other, "engine", None) is player.engine else other.name
            trajectories.append(Trajectory(
                game=game.name, seat=seat, turns=g.turns[seat], reward=returns[seat],
                invalid=g.invalid_by == seat, truncated=g.truncated,
                policy_version=g.versions.get(seat, getattr(player.engine, "version", 0)), opponent=opp,
                start=g.ep.start, episode_id=g.episode_id))
    return Finished(g.ep, returns, trajectories, g.state)


def collect_episodes(episodes: Iterable[Episode], sampling: SamplingParams, **kw: Any) -> list[Finished]:
    """All episodes played to the end, in the order they finished."""
    return list(play_episodes(episodes, sampling, **kw))
