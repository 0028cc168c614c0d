"""A Go engine speaking GTP (the Go Text Protocol) as a bot seat, e.g. GnuGo.

``GTPEngine`` owns one engine process: it sends a command and reads the reply
(``= ...`` or ``? ...`` followed by a blank line) with a timeout, kills the process on a
hang, restarts it when it has died, and always kills it on ``close`` (context manager,
and a finalizer that also runs at interpreter exit). An engine is untrusted: a reply that
is not GTP, a timeout or a dead process is a :class:`GTPError`, never a hang.

``GTPPlayer`` is a bot (``(game, state, rng) -> action``, like ``BotPlayer.act``): before
each ``genmove`` it replays the game's moves into the engine (only the new ones when the
engine already holds the beginning of the game), so one player can serve many games and
both colours. A crashed or hung engine is restarted and the game replayed, once per move.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from lmselfplay.games.go import Go, GoState

GNUGO_PATHS = ("gnugo", "/usr/games/gnugo")


class GTPError(RuntimeError):
    """The engine failed: an error reply, garbage, a timeout, or a dead process."""


def find_gnugo() -> str | None:
    """Path of the gnugo binary, or None (Debian installs it in /usr/games)."""
    for name in GNUGO_PATHS:
        path = shutil.which(name)
        if path:
            return path
    return None


def plays_gtp(game: Any) -> bool:
    """Whether a GTP engine can sit at this game: Go on any board GnuGo accepts."""
    return isinstance(game, Go)


def game_gnugo_player(game: Go, level: int = 1, move_timeout: float = 60.0) -> GTPPlayer:
    """:func:`gnugo_player` set to ``game``'s board size and komi."""
    return gnugo_player(level=level, size=game.size, komi=game.komi, move_timeout=move_timeout)


def gnugo_command(level: int = 1, size: int = 9, komi: float = 7.5) -> list[str]:
    """GnuGo in GTP mode with this project's rules: area scoring, positional superko. Our
    score counts stones as they stand (no dead-stone removal), so GnuGo must capture every
    dead stone before it passes (``--capture-all-dead``)."""
    path = find_gnugo()
    if path is None:
        raise GTPError("gnugo is not installed (apt-get install gnugo)")
    return [path, "--mode", "gtp", "--level", str(int(level)), "--chinese-rules",
            "--positional-superko", "--capture-all-dead", "--never-resign", "--komi", str(komi),
            "--boardsize", str(int(size))]


def _kill(proc: subprocess.Popen) -> None:
    """Kill the engine's process group (it was started in its own session) and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    for f in (proc.stdin, proc.stdout):
        try:
            f.close()
        except OSError:
            pass


def _pump(stream: Any, lines: queue.Queue) -> None:
    """Reader thread: every line of the engine's stdout, then None at end of file."""
    try:
        for line in iter(stream.readline, ""):
            lines.put(line)
    except (OSError, ValueError):
        pass
    lines.put(None)


class GTPEngine:
    """One GTP engine process (see the module docstring)."""

    def __init__(self, command: Sequence[str], timeout: float = 30.0,
                 setup: Sequence[str] = ()):
        self.command = list(command)
        self.timeout = float(timeout)
        self.setup = list(setup)  # commands re-sent after every (re)start
        self.starts = 0
        self.proc: subprocess.Popen | None = None
        self._lines: queue.Queue = queue.Queue()
        self._finalizer: weakref.finalize | None = None

    def start(self) -> None:
        self.close()
        try:
            proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                    start_new_session=True)
        except OSError as e:
            raise GTPError(f"cannot start {self.command[0]!r}: {e}") from None
        self.proc, self._lines = proc, queue.Queue()
        self.starts += 1
        # Runs on close(), on garbage collection and at interpreter exit, whichever is first.
        self._finalizer = weakref.finalize(self, _kill, proc)
        threading.Thread(target=_pump, args=(proc.stdout, self._lines), daemon=True).start()
        for cmd in self.setup:
            self.send(cmd)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # kills and reaps once
        self.proc, self._finalizer = None, None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, command: str, timeout: float | None = None) -> str:
        """Send one command; return the reply text after '= '. Any failure kills the engine
        (the next ``send`` on a dead engine raises until ``restart``)."""
        if not self.alive:
            raise GTPError(f"GTP engine is not running (command {command!r})")
        try:
            self.proc.stdin.write(command.strip() + "\n")
            self.proc.stdin.flush()
            return self._reply(command, self.timeout if timeout is None else timeout)
        except (OSError, ValueError) as e:
            self.close()
            raise GTPError(f"GTP engine died during {command!r}: {e}") from None
        except _ErrorReply:
            raise  # a refusal is an answer: the engine stays up
        except GTPError:
            self.close()
            raise

    def _reply(self, command: str, timeout: float) -> str:
        lines: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise GTPError(f"GTP engine did not answer {command!r} within {timeout:g}s") from None
            if line is None:
                raise GTPError(f"GTP engine exited during {command!r}")
            line = line.rstrip("\r\n")
            if not lines and not line.strip():
                continue  # blank lines before a reply
            if not line.strip():
                break
            lines.append(line)
            if len(lines) > 10_000:
                raise GTPError(f"GTP engine flooded the reply to {command!r}")
        head = lines[0]
        if head.startswith("?"):
            raise _ErrorReply(f"GTP engine refused {command!r}: {head[1:].strip()}")
        if not head.startswith("="):
            raise GTPError(f"GTP engine answered {command!r} with garbage: {head[:80]!r}")
        return "\n".join([head[1:].strip(), *lines[1:]]).strip()

    def __enter__(self) -> GTPEngine:
        if not self.alive:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ErrorReply(GTPError):
    """A well-formed '?' reply: the engine is fine, the command was refused."""


def _vertex(game: Go, a: int) -> str:
    return "pass" if a == game.pass_action else game.action_text(a)


class GTPPlayer:
    """A GTP engine as a bot seat for :class:`~lmselfplay.games.go.Go` (see module doc)."""

    def __init__(self, command: Sequence[str], name: str = "gtp", timeout: float = 30.0,
                 move_timeout: float = 60.0):
        self.command, self.name = list(command), name
        self.timeout, self.move_timeout = float(timeout), float(move_timeout)
        self.engine: GTPEngine | None = None
        self._synced: tuple[int, float, bytes, list[int]] | None = None
        self.replaced = 0  # engine moves that our rules refused (played as pass instead)

    def _engine(self, game: Go) -> GTPEngine:
        if self.engine is None:
            self.engine = GTPEngine(self.command, self.timeout)
        if not self.engine.alive:
            self.engine.start()  # first start, or a restart after a failure
            self._synced = None
        return self.engine

    def sync(self, game: Go, state: GoState) -> GTPEngine:
        """Make the engine's game equal to ``state``'s: send only the new moves when the
        engine holds a prefix of this game, else clear the board and replay all of it."""
        engine = self._engine(game)
        root, moves = game.move_history(state)
        done = self._synced
        if (done is None or done[:3] != (game.size, game.komi, root)
                or done[3] != moves[: len(done[3])]):
            engine.send(f"boardsize {game.size}")
            engine.send(f"komi {game.komi:g}")
            engine.send("clear_board")
            for p, v in enumerate(root):
                if v:
                    engine.send(f"play {'BW'[v - 1]} {game.action_text(p)}")
            done = (game.size, game.komi, root, [])
        first = self._first_color(game, state, len(moves))
        for i in range(len(done[3]), len(moves)):
            color = "BW"[(first + i) % 2]
            engine.send(f"play {color} {_vertex(game, moves[i])}")
        self._synced = (game.size, game.komi, root, list(moves))
        return engine

    @staticmethod
    def _first_color(game: Go, state: GoState, n_moves: int) -> int:
        """Colour of the first move after the root (players alternate, passes included)."""
        return (state.to_play - n_moves) % 2

    def genmove(self, game: Go, state: GoState) -> int:
        color = "BW"[state.to_play]
        reply = self.sync(game, state).send(f"genmove {color}", timeout=self.move_timeout)
        word = reply.split()[0].casefold() if reply.split() else ""
        if word in ("pass", "resign"):
            return game.pass_action
        a = game.by_name.get(word)
        if a is None:
            self.engine.close()
            raise GTPError(f"GTP engine answered genmove with {reply[:40]!r}, not a move")
        return a

    def __call__(self, game: Go, state: GoState, rng: Any = None) -> int:
        """The engine's move in ``state``; one restart (and replay) on a crash, hang or
        garbage. A move our rules refuse becomes a pass and is counted in ``replaced``."""
        try:
            a = self.genmove(game, state)
        except _ErrorReply:
            raise
        except GTPError:
            self._synced = None
            a = self.genmove(game, state)  # a second failure propagates
        self._synced = None if self._synced is None else (*self._synced[:3], [*self._synced[3], a])
        if game.illegal_reason(state, a) is not None:
            self.replaced += 1
            self._synced = None  # the engine's board now differs from the game's
            return game.pass_action
        return a

    def final_score(self, game: Go, state: GoState) -> float:
        """The engine's score of ``state`` (Black's lead: "B+7.5" -> 7.5, "W+0.5" -> -0.5)."""
        reply = self.sync(game, state).send("final_score")
        text = reply.split()[0] if reply.split() else ""
        try:
            if text == "0":
                return 0.0
            if text[:2] in ("B+", "W+"):
                return float(text[2:]) * (1 if text[0] == "B" else -1)
        except ValueError:
            pass
        raise GTPError(f"GTP engine answered final_score with {reply[:40]!r}")

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self._synced = None

    def __enter__(self) -> GTPPlayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def gnugo_player(level: int = 1, size: int = 9, komi: float = 7.5,
                 move_timeout: float = 60.0) -> GTPPlayer:
    """GnuGo at ``level`` (1 weakest .. 10 default) as a bot seat."""
    return GTPPlayer(gnugo_command(level, size, komi), name=f"gnugo-l{int(level)}",
                     move_timeout=move_timeout)
