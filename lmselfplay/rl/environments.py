"""This project's games as environments for other trainers: one learner seat against a fixed
opponent, the rules as the referee.

* :class:`GameEnvironment`: the core. ``reset(seed) -> observation text`` (the learner's turn;
  the opponent's moves and chance before it are played), ``step(answer) -> StepOutcome`` with
  the next observation, the reward (the learner's zero-sum return when the game ends, else 0)
  and ``done``. The answer is parsed by the ONE text protocol; an illegal answer forfeits the
  game's largest stake (``max_utility``), as everywhere in this project. The opponent
  (:func:`make_opponent`) is a reference bot of the game (``random``, ``exact``, ``mcts16``...:
  :func:`lmselfplay.games.bots.reference_bots`) or a frozen checkpoint folder (a model that
  answers in the same text; its illegal answer forfeits to the learner).
* :func:`trl_environment`: a class for TRL's ``GRPOTrainer(environment_factory=...)``
  (``trl/trainer/grpo_trainer.py``, TRL 1.16: the factory is called with no argument, ``reset(**row)``
  returns the text appended to the prompt, public methods are the tools, ``get_reward()`` the
  reward of the finished rollout): one tool, ``move(move)``; a game left unfinished when the
  rollout ends is forfeited.
* :mod:`lmselfplay.rl.openenv_env`: the same core as an OpenEnv environment.

Any game name works: ``kuhn_poker``, ``go9``, ``openspiel:leduc_poker``, ``textarena:TicTacToe-v0``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmselfplay.games import make
from lmselfplay.games.base import CHANCE, Invalid, forfeit_returns, move_text, sample_chance
from lmselfplay.games.bots import BotPlayer, reference_bots
from lmselfplay.games.text import MOVE_STOP, format_answer


def make_opponent(game: Any, spec: str) -> BotPlayer:
    """The fixed opponent ``spec``: a reference bot's name, or a model folder (frozen checkpoint)."""
    bots = reference_bots(game)
    if spec in bots:
        return bots[spec]
    if Path(spec).expanduser().is_dir():
        return checkpoint_opponent(game, str(Path(spec).expanduser()))
    raise ValueError(f"opponent {spec!r} is neither a bot of {game.name} ({', '.join(bots)}) nor a model folder")


def checkpoint_opponent(game: Any, model_dir: str, temperature: float = 1.0, max_new_tokens: int = 16) -> BotPlayer:
    """A frozen model that answers at its turns (sampled at ``temperature``); an illegal answer is
    :class:`Invalid` (the environment scores it as the opponent's forfeit)."""
    from lmselfplay.lm.engines import HFEngine, SamplingParams
    from lmselfplay.lm.prompt import encode_prompt
    from lmselfplay.models.policy import load_policy

    model, tok = load_policy(model_name_or_path=model_dir)
    engine = HFEngine(model, tok)

    def act(g: Any, s: Any, rng: random.Random) -> Any:
        prompt = encode_prompt(tok, g.observation_text(s, g.current_player(s)))
        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                  seed=rng.randrange(2**31), stop=MOVE_STOP)
        (out,) = engine.generate([prompt], sampling)
        return g.parse_action(s, out.text)

    return BotPlayer(act, f"checkpoint:{model_dir}")


@dataclass
class StepOutcome:
    observation: str  # the learner's next observation ("" once the game is over)
    reward: float  # the learner's return when the game ends, else 0
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class GameEnvironment:
    """One game at a time: the learner in ``seat`` (None: a random seat each game) against ``opponent``."""

    def __init__(self, game: str | Any = "kuhn_poker", opponent: str = "random", seat: int | None = None,
                 seed: int = 0):
        self.game = make(game) if isinstance(game, str) else game
        self.opponent = make_opponent(self.game, opponent)
        if seat not in (None, 0, 1):
            raise ValueError(f"seat must be 0, 1 or None (random), got {seat!r}")
        self.fixed_seat = seat
        self.rng = random.Random(seed)
        self.seat = 0
        self.state: Any = None
        self.done = True
        self.returns = [0.0, 0.0]
        self.moves: list[str] = []
        self.invalid: str | None = None

    def reset(self, seed: int | None = None) -> str:
        if seed is not None:
            self.rng = random.Random(seed)
        self.seat = self.rng.randrange(2) if self.fixed_seat is None else self.fixed_seat
        self.state, self.done, self.returns, self.moves, self.invalid = \
            self.game.new_initial_state(), False, [0.0, 0.0], [], None
        self._advance()
        return self.observation()

    def observation(self) -> str:
        return "" if self.done else self.game.observation_text(self.state, self.seat)

    def step(self, answer: str) -> StepOutcome:
        """Play the learner's ``answer`` (text holding ``<move>NAME</move>``), then the opponent's
        moves and chance up to the learner's next turn or the end."""
        if self.done:
            raise RuntimeError("the game is over: call reset()")
        action = self.game.parse_action(self.state, answer)
        if isinstance(action, Invalid):
            self.invalid = action.reason
            self._end(forfeit_returns(self.seat, self.game.max_utility))
        else:
            self._play(action)
            self._advance()
        info = {"invalid": self.invalid, "moves": list(self.moves), "seat": self.seat}
        return StepOutcome(self.observation(), self.returns[self.seat] if self.done else 0.0, self.done, info)

    def forfeit(self) -> float:
        """End an unfinished game as the learner's forfeit; its reward."""
        if not self.done:
            self.invalid = "the game was left unfinished"
            self._end(forfeit_returns(self.seat, self.game.max_utility))
        return self.returns[self.seat]

    def _play(self, action: Any) -> None:
        self.moves.append(move_text(self.game, self.state, action))
        self.state = self.game.apply(self.state, action)

    def _advance(self) -> None:
        """Chance and the opponent until the learner is to move or the game ends."""
        g = self.game
        while not g.is_terminal(self.state):
            p = g.current_player(self.state)
            if p == CHANCE:
                self.state = g.apply(self.state, sample_chance(g, self.state, self.rng))
            elif p == self.seat:
                return
            else:
                action = self.opponent.act(g, self.state, self.rng)
                if isinstance(action, Invalid):
                    self._end(forfeit_returns(p, g.max_utility))
                    return
                self._play(action)
        self._end(g.returns(self.state))

    def _end(self, returns: list[float]) -> None:
        self.done, self.returns = True, [float(r) for r in returns]


class TRLGameEnvironment:
    """A game of this project for TRL's ``GRPOTrainer(environment_factory=...)``: build the class
    for a game and an opponent with :func:`trl_environment`."""

    game_name = "kuhn_poker"
    opponent = "random"
    seat: int | None = None
    _instances = 0

    def __init__(self) -> None:
        type(self)._instances += 1
        self._env = GameEnvironment(self.game_name, self.opponent, self.seat, seed=type(self)._instances)

    def reset(self, **kwargs: Any) -> str:
        seed = kwargs.get("seed")
        return self._env.reset(int(seed) if seed is not None else None)

    def move(self, move: str) -> str:
        """Play your move in the game.

        Args:
            move: The move, written as in the list of legal moves.

        Returns:
            What you see next: your next position, or the result of the game.
        """
        if self._env.done:
            return "The game is over."
        out = self._env.step(format_answer(str(move)))
        if not out.done:
            return out.observation
        if out.info["invalid"]:
            return f"Illegal move ({out.info['invalid']}): you lose. Your return: {out.reward:g}."
        return f"Game over. Your return: {out.reward:g}."

    def get_reward(self) -> float:
        return self._env.forfeit()


def trl_environment(game: str = "kuhn_poker", opponent: str = "random", seat: int | None = None) -> type:
    """The class to pass as ``environment_factory``: ``game`` against ``opponent`` (checked here,
    so a bad name fails before training starts)."""
    GameEnvironment(game, opponent, seat)
    name = "".join(part.capitalize() for part in game.replace(":", "_").replace("-", "_").split("_") if part.isalnum())
    return type(f"{name or 'Game'}Environment", (TRLGameEnvironment,),
                {"game_name": game, "opponent": opponent, "seat": seat, "_instances": 0})
