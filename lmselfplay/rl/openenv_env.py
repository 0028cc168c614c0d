"""This project's games as an OpenEnv environment (``pip install 'lmselfplay[openenv]'``:
``openenv-core``): :class:`GameEnv` serves :class:`~lmselfplay.rl.environments.GameEnvironment`
behind OpenEnv's ``Environment`` interface (``openenv/core/env_server/interfaces.py``, openenv-core
0.3: ``reset(seed=None, episode_id=None, **kw) -> Observation``, ``step(action) -> Observation`` with
``done`` and ``reward``, a ``state`` property), :func:`app` its HTTP / WebSocket server
(``create_app``), :class:`GameClient` the client (``EnvClient``).

    python -m lmselfplay.rl.openenv_env --game kuhn_poker --opponent random --port 8000
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from lmselfplay.rl.environments import GameEnvironment


class GameAction(Action):
    answer: str = Field(..., description="the player's answer: text holding <move>NAME</move>")


class GameObservation(Observation):
    text: str = Field(default="", description="what the learner sees at its turn ('' once the game is over)")
    seat: int = Field(default=0, description="the learner's seat (0 moves first)")
    invalid: str | None = Field(default=None, description="why the learner's last answer was no legal move")


class GameState(State):
    game: str = ""
    seat: int = 0
    moves: list[str] = Field(default_factory=list)
    done: bool = False
    returns: list[float] = Field(default_factory=list)


class GameEnv(Environment[GameAction, GameObservation, GameState]):
    """One learner seat of a game of this project against a fixed opponent."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session holds its own game

    def __init__(self, game: str = "kuhn_poker", opponent: str = "random", seat: int | None = None):
        super().__init__()
        self.env = GameEnvironment(game, opponent, seat)
        self.episode_id = str(uuid.uuid4())
        self.steps = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GameObservation:
        self.episode_id, self.steps = episode_id or str(uuid.uuid4()), 0
        text = self.env.reset(seed)
        return self._observation(text, reward=0.0)

    def step(self, action: GameAction, timeout_s: float | None = None, **kwargs: Any) -> GameObservation:
        self.steps += 1
        if self.env.done:
            return self._observation("", reward=0.0)
        out = self.env.step(action.answer)
        return self._observation(out.observation, out.reward)

    def _observation(self, text: str, reward: float) -> GameObservation:
        return GameObservation(text=text, seat=self.env.seat, invalid=self.env.invalid, done=self.env.done,
                               reward=reward, metadata={"moves": list(self.env.moves)})

    @property
    def state(self) -> GameState:
        e = self.env
        return GameState(episode_id=self.episode_id, step_count=self.steps, game=e.game.name, seat=e.seat,
                         moves=list(e.moves), done=e.done, returns=list(e.returns))


class GameClient(EnvClient[GameAction, GameObservation, GameState]):
    """The client of :func:`app`'s server (``GameClient(base_url=...).sync()`` for blocking calls)."""

    def _step_payload(self, action: GameAction) -> dict[str, Any]:
        return {"answer": action.answer}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[GameObservation]:
        obs = payload.get("observation", {})
        observation = GameObservation(text=obs.get("text", ""), seat=obs.get("seat", 0), invalid=obs.get("invalid"),
                                      done=payload.get("done", False), reward=payload.get("reward"),
                                      metadata=obs.get("metadata", {}))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> GameState:
        return GameState(**payload)


def app(game: str = "kuhn_poker", opponent: str = "random", seat: int | None = None, max_concurrent_envs: int = 8):
    """OpenEnv's FastAPI server of ``game`` against ``opponent`` (each session its own game)."""
    from openenv.core.env_server.http_server import create_app

    GameEnvironment(game, opponent, seat)  # a bad name fails here, not in the first session
    return create_app(lambda: GameEnv(game, opponent, seat), GameAction, GameObservation,
                      env_name=f"lmselfplay-{game}", max_concurrent_envs=max_concurrent_envs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lmselfplay.rl.openenv_env", description=__doc__.splitlines()[0])
    ap.add_argument("--game", default="kuhn_poker")
    ap.add_argument("--opponent", default="random", help="a reference bot of the game, or a model folder")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    import uvicorn

    try:
        server = app(args.game, args.opponent)
    except (KeyError, ValueError) as e:
        ap.exit(2, f"error: {e.args[0] if e.args else e}\n")
    uvicorn.run(server, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
