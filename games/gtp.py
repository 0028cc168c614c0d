"""A Go engine speaking GTP (the Go Text Protocol) as a bot seat, e.g. GnuGo.

``GTPEngine`` owns one engine process. An engine is untrusted; its rules:

* Every command has one deadline for its whole reply (``= ...`` or ``? ...`` up to a blank
  line): an engine that drips a line every half second fails like one that never answers.
* At most :data:`MAX_REPLY_BYTES` are buffered per reply: an engine that never sends a
  newline fails at that size, it never grows our memory.
* A reply that is not GTP, a timeout or a dead process is a :class:`GTPError`, never a hang;
  the engine is killed and the next ``start`` restarts it.
* The engine runs under a keeper (:mod:`lmselfplay.utils.process_tree`): ``close`` (the
  context manager, a finalizer at garbage collection and at interpreter exit) kills its
  whole tree, ``setsid`` and double-forked grandchildren included; when the host dies
  without closing it (SIGTERM, SIGKILL) the keeper kills the tree by itself.

``GTPPlayer`` is a bot (``(game, state, rng) -> action``, like ``BotPlayer.act``): before
each ``genmove`` it replays the game's moves into the engine (only the new ones when the
engine already holds the beginning of the game), so one player can serve many games and
both colours. A crashed or hung engine is restarted and the game replayed, once per move.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import time
import weakref
from collections.abc import Sequence
from typing import Any

from lmselfplay.games.go import Go, GoState
from lmselfplay.utils.process_tree import kept_command

GNUGO_PATHS = ("gnugo", "/usr/games/gnugo")
MAX_REPLY_BYTES = 1 << 20  # GnuGo's longest replies (showboard, list_commands) are a few KB
READ_CHUNK = 1 << 16
KEEPER_GRACE_S = 5.0  # how long close() waits for the keeper to kill the tree


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
    """End the engine's whole tree and reap it: SIGTERM to its keeper (which kills every
    descendant, see :mod:`lmselfplay.utils.process_tree`), then SIGKILL to the process group
    as the last resort (and the only means where there is no keeper)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=KEEPER_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the session it leads, keeper or engine
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    for f in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError):
            f.close()


class GTPEngine:
    """One GTP engine process (see the module docstring)."""

    def __init__(self, command: Sequence[str], timeout: float = 30.0,
                 setup: Sequence[str] = ()):
        self.command = list(command)
        self.timeout = float(timeout)
        self.setup = list(setup)  # commands re-sent after every (re)start
        self.starts = 0
        self.proc: subprocess.Popen | None = None
        self._buffer = bytearray()  # what the engine sent that no reply has consumed yet
        self._finalizer: weakref.finalize | None = None

    def start(self) -> None:
        self.close()
        if shutil.which(self.command[0]) is None:  # the keeper would only report it as an exit
            raise GTPError(f"cannot start {self.command[0]!r}: not found or not executable")
        try:
            proc = subprocess.Popen(kept_command(self.command), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
                                    start_new_session=True)  # a Ctrl-C reaches the host only
        except OSError as e:
            raise GTPError(f"cannot start {self.command[0]!r}: {e}") from None
        self.proc, self._buffer = proc, bytearray()
        self.starts += 1
        # Runs on close(), on garbage collection and at interpreter exit, whichever is first;
        # when the host dies without running it, the keeper's PDEATHSIG does the same.
        self._finalizer = weakref.finalize(self, _kill, proc)
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
        """Send one command; return the reply text after '= '. The whole reply must arrive
        within ``timeout`` seconds (default ``self.timeout``) and within
        :data:`MAX_REPLY_BYTES`. Any failure kills the engine (the next ``send`` on a dead
        engine raises until ``start``)."""
        if not self.alive:
            raise GTPError(f"GTP engine is not running (command {command!r})")
        try:
            self.proc.stdin.write((command.strip() + "\n").encode())
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
        """Read until one whole reply is buffered, by one deadline for the whole command."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while (lines := _take_reply(self._buffer)) is None:
            if len(self._buffer) > MAX_REPLY_BYTES:
                raise GTPError(f"GTP engine sent more than {MAX_REPLY_BYTES} bytes without ending "
                               f"its reply to {command!r}")
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise GTPError(f"GTP engine did not answer {command!r} within {timeout:g}s")
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                raise GTPError(f"GTP engine exited during {command!r}")
            self._buffer += chunk
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


def _take_reply(buffer: bytearray) -> list[str] | None:
    """Remove one complete reply from the front of ``buffer`` and return its lines (blank
    lines before it are skipped; a blank line ends it); None while it is incomplete."""
    text = buffer.replace(b"\r", b"")
    start = 0
    while start < len(text) and text[start:start + 1].isspace():
        start += 1
    end = text.find(b"\n\n", start)
    if end < 0 or start == len(text):
        return None
    lines = text[start:end].decode(errors="replace").split("\n")
    del buffer[:]
    buffer += text[end + 2:]
    return lines


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
