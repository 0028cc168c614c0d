"""A scripted GTP engine for tests: ``python fake_gtp.py MODE [MARKER]``.

It answers the usual commands and plays the first free point (A1, B1, ...) on genmove,
except as MODE says: ``hang`` never answers genmove, ``crash`` exits on genmove,
``garbage`` answers genmove with noise, ``badmove`` answers an occupied point; the
``-once`` variants (``crash-once``, ``hang-once``) misbehave only while the file MARKER
does not exist (they create it), so a restarted engine works. Hostile modes:
``drip`` answers genmove with one more line every 0.5 s, never ending the reply;
``nonewline`` answers genmove with bytes and never a newline; ``setsid`` starts a
detached grandchild first (double fork + ``setsid``, still holding our stdout) and
writes "ENGINE_PID GRANDCHILD_PID" to MARKER. ``final_score`` answers the contents of the
environment variable FAKE_SCORE (default "B+1.5").
"""

import os
import sys
import time

COLUMNS = "ABCDEFGHJKLMNOPQRST"


def detach(marker: str) -> None:
    """A grandchild in its own session whose parent has exited (re-parented away from us)."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write, str(os.getpid()).encode())
            time.sleep(3600)
        os._exit(0)
    os.wait()
    os.close(write)
    grandchild = os.read(read, 32).decode()
    with open(marker, "w") as f:
        f.write(f"{os.getpid()} {grandchild}\n")


def drip() -> None:
    print("= A1", flush=True)
    while True:
        time.sleep(0.5)
        print("still thinking", flush=True)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    marker = sys.argv[2] if len(sys.argv) > 2 else None
    if mode.endswith("-once"):
        if marker and os.path.exists(marker):
            mode = "ok"
        else:
            open(marker, "w").close()
            mode = mode[: -len("-once")]
    if mode == "setsid":
        detach(marker)
    size, stones = 19, set()
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd, args = words[0], words[1:]
        reply = ""
        if cmd == "quit":
            print("=\n", flush=True)
            return
        if cmd == "boardsize":
            size = int(args[0])
        elif cmd == "clear_board":
            stones = set()
        elif cmd == "play":
            if args[1].lower() != "pass":
                stones.add(args[1].upper())
        elif cmd == "genmove":
            if mode == "hang":
                time.sleep(3600)
            if mode == "crash":
                sys.exit(3)
            if mode == "drip":
                drip()
            if mode == "nonewline":
                while True:
                    sys.stdout.write("x" * 65536)
                    sys.stdout.flush()
            if mode == "garbage":
                print("I like turtles\n", flush=True)
                continue
            free = [f"{c}{r}" for r in range(1, size + 1) for c in COLUMNS[:size]
                    if f"{c}{r}" not in stones]
            reply = (sorted(stones) or ["pass"])[0] if mode == "badmove" else (free or ["pass"])[0]
            stones.add(reply)
        elif cmd == "final_score":
            reply = os.environ.get("FAKE_SCORE", "B+1.5")
        elif cmd not in ("komi", "name", "version", "protocol_version"):
            print("? unknown command\n", flush=True)
            continue
        print(f"= {reply}\n", flush=True)


if __name__ == "__main__":
    main()
