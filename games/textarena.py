"""TextArena's two-player games as games of this project: ``textarena:<env id>``
(``textarena:TicTacToe-v0``, ``textarena:KuhnPoker-v0``), behind the optional extra
``pip install 'lmselfplay[textarena]'`` (TextArena 0.7.4).

TextArena's own rules are the referee, and only win rates are measured (``exact_metric`` is
``win_rates``): TextArena games are text in, text out, so their moves are free text
(``action_space = "text"``, as Taboo's): a player's move is the content of its last
``<move>...</move>`` (TextArena's own action text, e.g. ``[4]``), passed to TextArena's ``step``.
A move TextArena calls invalid is an :class:`~lmselfplay.games.base.Invalid` here and forfeits the
game (zero-sum, -1 / +1), where TextArena would allow a retry.

* A state is the seed and the moves so far (immutable); its TextArena environment is rebuilt by
  replaying them, and cached. TextArena seeds Python's global ``random`` in ``reset``: the global
  state is restored around every call.
* A player reads its own TextArena observations (the prompt TextArena wrote for it and every
  message sent to it), nothing else.
* :func:`registry_rows` runs every registered environment offline with two players and says
  which play here and why the others do not (one player, more players, word lists NLTK
  downloads at run time, a missing data file, an API key).
"""

from __future__ import annotations

import contextlib
import copy
import io
import random
from dataclasses import dataclass
from typing import Any

from lmselfplay.games.base import TERMINAL, WIN_RATES, Invalid
from lmselfplay.games.text import extract_move, prompt

PREFIX = "textarena:"
MAX_MOVE_CHARS = 200  # TextArena's moves are free text ("[4]", "[Bid 3]", a sentence)
CACHE_LIMIT = 20_000


def textarena_module() -> Any:
    try:
        import textarena
    except ImportError:
        raise ValueError("textarena: games need TextArena: pip install 'lmselfplay[textarena]'") from None
    return textarena


@contextlib.contextmanager
def _quiet_global_random():
    """TextArena prints and reseeds Python's global ``random``: keep both to itself."""
    saved = random.getstate()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        random.setstate(saved)


@dataclass(frozen=True)
class TextArenaState:
    seed: int
    moves: tuple[str, ...] = ()


class TextArenaGame:
    """A two-player TextArena environment behind the project's Game protocol (see the module docstring)."""

    action_space = "text"
    n_actions = 0
    perfect_information = False
    max_utility = 1.0
    exact_metric = WIN_RATES

    def __init__(self, env_id: str):
        self.env_id = env_id.strip()
        self.name = PREFIX + self.env_id
        self.title = self.env_id
        why = refusal(self.env_id)
        if why:
            raise ValueError(f"{self.name} cannot be played: {why}")
        self._envs: dict[TextArenaState, Any] = {}

    # --- the TextArena environment behind a state ---------------------------------------
    def env(self, s: TextArenaState) -> Any:
        """TextArena's environment at ``s`` (cached; copy it before stepping)."""
        env = self._envs.get(s)
        if env is None:
            if len(self._envs) > CACHE_LIMIT:
                self._envs.clear()
            if s.moves:
                env = copy.deepcopy(self.env(TextArenaState(s.seed, s.moves[:-1])))
                with _quiet_global_random():
                    env.step(s.moves[-1])
            else:
                env = _fresh(self.env_id, s.seed)
            self._envs[s] = env
        return env

    # --- the Game protocol --------------------------------------------------------------
    def new_initial_state(self, seed: int | None = None) -> TextArenaState:
        return TextArenaState(0 if seed is None else int(seed))

    def is_terminal(self, s: TextArenaState) -> bool:
        return bool(self.env(s).state.done)

    def current_player(self, s: TextArenaState) -> int:
        return TERMINAL if self.is_terminal(s) else int(self.env(s).state.current_player_id)

    def chance_outcomes(self, s: TextArenaState) -> list[tuple[int, float]]:
        return []  # TextArena's randomness comes from the seed

    def legal_actions(self, s: TextArenaState) -> list[Any]:
        raise TypeError(f"{self.name}: moves are free text (TextArena's rules judge each one); use parse_action")

    def parse_action(self, s: TextArenaState, text: Any) -> str | Invalid:
        """The move in ``text`` when TextArena accepts it at ``s``, else an Invalid with its reason."""
        if self.current_player(s) < 0:
            return Invalid("no player is to move")
        move = extract_move(text, MAX_MOVE_CHARS)
        if isinstance(move, Invalid):
            return move
        why = _rejection(self.env(s), move)
        return Invalid(f"TextArena: {why}") if why else move

    def apply(self, s: TextArenaState, move: str) -> TextArenaState:
        why = _rejection(self.env(s), move) if not self.is_terminal(s) else "the game is over"
        if why:
            raise ValueError(f"illegal move {move!r} in {self.name}: {why}")
        return TextArenaState(s.seed, s.moves + (move,))

    def returns(self, s: TextArenaState) -> list[float]:
        rewards = self.env(s).state.rewards if self.is_terminal(s) else None
        if not rewards:
            return [0.0, 0.0]
        r0, r1 = float(rewards.get(0, 0.0)), float(rewards.get(1, 0.0))
        return [(r0 - r1) / 2, (r1 - r0) / 2]  # zero-sum (TextArena's two-player rewards already are)

    def action_text(self, move: str) -> str:
        return move

    def observation_text(self, s: TextArenaState, player: int) -> str:
        env = self.env(s)
        lines = [f"[{_sender(env, f)}] {m}" for f, m, _ in env.state.observations[player]]
        return prompt(self.name, "TextArena's rules; your move is TextArena's action text.", lines, None)

    def render(self, s: TextArenaState) -> str:
        env = self.env(s)
        return "\n".join(f"[{_sender(env, f)}] {m}" for f, m in env.state.logs)


def _sender(env: Any, from_id: int) -> str:
    return env.state.role_mapping.get(from_id, f"Player {from_id}")


def _fresh(env_id: str, seed: int) -> Any:
    ta = textarena_module()
    with _quiet_global_random():
        env = ta.make(env_id)
        env.reset(num_players=2, seed=seed)
    return env


def _rejection(env: Any, move: str) -> str | None:
    """Why TextArena rejects ``move`` in ``env`` (stepped on a copy); None when it accepts it."""
    trial = copy.deepcopy(env)
    player = trial.state.current_player_id
    errors = getattr(trial.state, "error_count", 0)
    with _quiet_global_random():
        trial.step(move)
    st = trial.state
    if getattr(st, "error_count", 0) > errors or st.game_info.get(player, {}).get("invalid_move"):
        return st.game_info.get(player, {}).get("reason") or _last_admin(trial, player) or "an invalid move"
    return None


def _last_admin(env: Any, player: int) -> str:
    """The last message the game sent ``player`` that says its move was invalid."""
    messages = [m for _, m, _ in env.state.observations.get(player, []) if "invalid" in m.lower()]
    return messages[-1][:200] if messages else ""


def refusal(env_id: str) -> str | None:
    """Why ``env_id`` cannot be played here, in one line; None when it loads offline with two players."""
    textarena_module()
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        return "no such TextArena environment"
    try:
        _fresh(env_id, 0)
    except AssertionError as e:
        return f"not a two-player game ({str(e).strip()[:80]})"
    except LookupError:
        return "needs NLTK data downloaded at run time (offline: missing)"
    except FileNotFoundError:
        return "a data file it reads is missing from the TextArena wheel"
    except ValueError as e:
        if "API key" in str(e):
            return "needs an API key (an online model)"
        return f"does not reset offline ({str(e).strip().splitlines()[0][:80]})"
    except (ImportError, SyntaxError) as e:
        return f"does not import ({type(e).__name__}: {str(e).strip()[:60]})"
    except Exception as e:  # a third-party environment's own failure: reported, never raised
        return f"does not reset offline ({type(e).__name__}: {str(e).strip()[:60]})"
    return None


def registry_rows() -> list[tuple[str, str]]:
    """``(env id, "loads" | "refused: why")`` for every TextArena environment (wrapper variants
    ``-train`` / ``-raw`` left out): what the docs table lists."""
    textarena_module()
    from textarena.envs.registration import ENV_REGISTRY

    ids = sorted(i for i in ENV_REGISTRY if not i.endswith(("-train", "-raw")))
    return [(i, f"refused: {why}" if (why := refusal(i)) else "loads") for i in ids]


def registry_table() -> str:
    from importlib.metadata import version

    lines = [f"| TextArena {version('textarena')} environment | `textarena:<id>` |", "|---|---|"]
    lines += [f"| `{name}` | {status} |" for name, status in registry_rows()]
    return "\n".join(lines)


def make(env_id: str, **params: Any) -> TextArenaGame:
    """The registry's factory for ``textarena:<env id>``."""
    if params:
        raise ValueError(f"textarena:{env_id} takes no parameters (got {sorted(params)})")
    return TextArenaGame(env_id)
