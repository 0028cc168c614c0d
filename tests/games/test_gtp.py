"""GTP seat: a scripted fake engine (hang, crash, garbage, drip, no newline, a detached
grandchild) and the real GnuGo."""

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmselfplay.games.go import Go
from lmselfplay.games.gtp import GTPEngine, GTPError, GTPPlayer, find_gnugo, gnugo_player

FAKE = str(Path(__file__).resolve().parents[1] / "fake_gtp.py")


def fake(mode="ok", *extra):
    return [sys.executable, FAKE, mode, *extra]


def gone(pid):
    """True when no process has this id any more, or only its zombie (it was killed)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def all_gone(pids, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def fails_after(seconds):
    """The test fails (instead of hanging) when the body runs longer than ``seconds``."""
    def expired(signum, frame):
        raise AssertionError(f"still running after {seconds}s: a hang")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def detached_pids(marker, within=10.0):
    """(engine pid, grandchild pid) that a ``setsid`` fake engine wrote to ``marker``."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        words = marker.read_text().split() if marker.exists() else []
        if len(words) == 2:
            return tuple(int(w) for w in words)
        time.sleep(0.05)
    raise AssertionError("the fake engine never wrote its pids")


def play_game(game, black, white, seed=0, max_plies=None):
    rng = random.Random(seed)
    s = game.new_initial_state()
    while not game.is_terminal(s) and (max_plies is None or s.ply < max_plies):
        seat = black if s.to_play == 0 else white
        s = game.apply(s, seat(game, s, rng))
    return s


def random_seat(game, s, rng):
    return rng.choice(game.legal_actions(s))


def test_fake_engine_game_syncs_incrementally():
    g = Go(9)
    with GTPPlayer(fake("ok"), timeout=5) as p:
        s = play_game(g, random_seat, p, seed=1, max_plies=40)
        assert s.ply == 40 and p.engine.starts == 1 and p.replaced == 0
        pid = p.engine.proc.pid
        # A new game (not a continuation) is replayed from a cleared board.
        s2 = play_game(g, p, random_seat, seed=2, max_plies=10)
        assert s2.ply == 10 and p.engine.starts == 1
    assert gone(pid)


@pytest.mark.parametrize("mode", ["hang", "crash", "garbage"])
def test_broken_engine_is_a_clear_error_not_a_hang(mode):
    g = Go(9)
    s = g.new_initial_state()
    p = GTPPlayer(fake(mode), timeout=5, move_timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(GTPError) as err, p:
        p(g, s, random.Random(0))
    assert time.monotonic() - t0 < 15
    assert p.engine.starts == 2  # one restart, then the error
    assert {"hang": "did not answer", "crash": "exited", "garbage": "garbage"}[mode] in str(err.value)
    assert p.engine.proc is None


@pytest.mark.parametrize("mode", ["hang-once", "crash-once"])
def test_engine_that_fails_once_is_restarted_and_the_game_replayed(mode, tmp_path):
    g = Go(9)
    s = play_game(g, random_seat, random_seat, seed=3, max_plies=7)
    with GTPPlayer(fake(mode, str(tmp_path / "marker")), timeout=5, move_timeout=1.0) as p:
        a = p(g, s, random.Random(0))
        assert p.engine.starts == 2
        assert g.illegal_reason(s, a) is None


def test_refused_move_becomes_a_counted_pass():
    g = Go(9)
    s = play_game(g, random_seat, random_seat, seed=4, max_plies=5)
    with GTPPlayer(fake("badmove"), timeout=5) as p:
        assert p(g, s, random.Random(0)) == g.pass_action and p.replaced == 1


def test_error_reply_keeps_the_engine_and_context_manager_kills_it():
    with pytest.raises(RuntimeError, match="boom"), GTPEngine(fake("ok"), timeout=5) as e:
        pid = e.proc.pid
        with pytest.raises(GTPError, match="refused"):
            e.send("nonsense")
        assert e.alive and e.send("name") == ""
        raise RuntimeError("boom")
    assert gone(pid) and e.proc is None


def test_dripping_engine_fails_by_one_deadline_per_command():
    """One line every 0.5 s, never the blank line that ends a reply: 2 s for the command."""
    with GTPEngine(fake("drip"), timeout=5) as e, fails_after(20):
        t0 = time.monotonic()
        with pytest.raises(GTPError, match=r"did not answer 'genmove B' within 2s"):
            e.send("genmove B", timeout=2)
        assert time.monotonic() - t0 < 4
        assert e.proc is None


NO_NEWLINE = """
import sys
from lmselfplay.games.gtp import GTPEngine, GTPError
e = GTPEngine([sys.executable, sys.argv[1], "nonewline"])
e.start()
try:
    e.send("genmove B", timeout=3)
except GTPError as err:
    print(err)
# VmHWM: this process's peak RSS (ru_maxrss would carry the forking parent's across exec)
print(next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")) // 1024)
"""


def test_engine_without_newline_is_one_error_at_bounded_memory():
    r = subprocess.run([sys.executable, "-c", NO_NEWLINE, FAKE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    message, peak_mb = r.stdout.strip().splitlines()
    assert int(peak_mb) < 150  # the interpreter and this module: ~30 MB; unbounded: hundreds
    assert message == "GTP engine sent more than 1048576 bytes without ending its reply to 'genmove B'"


CLOSE = """
import sys
from lmselfplay.games.gtp import GTPEngine
e = GTPEngine([sys.executable, sys.argv[1], "setsid", sys.argv[2]], timeout=5)
e.start()
assert e.send("name") == ""
e.close()
print("closed", flush=True)
"""


def test_close_kills_a_detached_grandchild(tmp_path):
    """In a subprocess: a close() that blocks on the grandchild's open pipe is a failure."""
    marker = tmp_path / "pids"
    try:
        r = subprocess.run([sys.executable, "-c", CLOSE, FAKE, str(marker)], capture_output=True, text=True,
                           timeout=30)
    finally:
        engine, grandchild = detached_pids(marker)
    assert r.returncode == 0 and r.stdout.strip() == "closed", r.stderr[-2000:]
    assert all_gone([engine, grandchild], within=2)


HOST = """
import signal, sys, time
from lmselfplay.games.gtp import GTPEngine
# Python's own SIGINT handler even when the test runner was started with SIGINT ignored (a
# shell's background job), whose children would inherit that and never see the signal
signal.signal(signal.SIGINT, signal.default_int_handler)
e = GTPEngine([sys.executable, sys.argv[1], "setsid", sys.argv[2]])
e.start()
print(e.proc.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_engine_tree_dies_with_its_host(tmp_path, how):
    """The host never closes the engine: it is killed (its finalizer cannot run, or, for
    SIGINT, runs at exit). Nothing it started is left: keeper, engine, grandchild."""
    marker = tmp_path / "pids"
    host = subprocess.Popen([sys.executable, "-c", HOST, FAKE, str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        keeper = int(host.stdout.readline())
        engine, grandchild = detached_pids(marker)
        host.send_signal(getattr(signal, how))
        host.wait(timeout=30)
        assert all_gone([keeper, engine, grandchild]), how
    finally:
        host.kill()
        host.wait()


def test_missing_binary_is_a_gtp_error():
    with pytest.raises(GTPError, match="cannot start"):
        GTPEngine(["/nonexistent/gtp-engine"]).start()


@pytest.mark.parametrize("text,score", [("B+7.5", 7.5), ("W+0.5", -0.5), ("0", 0.0)])
def test_final_score_parsing(text, score, monkeypatch):
    monkeypatch.setenv("FAKE_SCORE", text)
    g = Go(9)
    with GTPPlayer(fake("ok"), timeout=5) as p:
        assert p.final_score(g, g.new_initial_state()) == score


def test_final_score_garbage(monkeypatch):
    monkeypatch.setenv("FAKE_SCORE", "lots")
    g = Go(9)
    with GTPPlayer(fake("ok"), timeout=5) as p, pytest.raises(GTPError, match="final_score"):
        p.final_score(g, g.new_initial_state())


needs_gnugo = pytest.mark.skipif(find_gnugo() is None,
                                 reason="gnugo is not installed (apt-get install gnugo)")


@needs_gnugo
def test_gnugo_beats_random_with_legal_moves():
    g = Go(9)
    with gnugo_player(level=1) as gnugo:
        s = play_game(g, gnugo, random_seat, seed=0)
        assert g.is_terminal(s) and gnugo.replaced == 0
        assert g.returns(s)[0] == 1.0
        pid = gnugo.engine.proc.pid
    assert gone(pid)


@needs_gnugo
def test_gnugo_is_a_bot_seat_in_rollouts():
    from lmselfplay.games.bots import BotPlayer, random_bot
    from lmselfplay.lm.engines.base import SamplingParams
    from lmselfplay.lm.rollout import Episode, play_episodes

    g = Go(9)
    with gnugo_player(level=1) as gnugo:
        seat = BotPlayer(gnugo, gnugo.name)
        episodes = [Episode(g, (seat, random_bot()), seed=1), Episode(g, (random_bot(), seat), seed=2)]
        done = list(play_episodes(episodes, SamplingParams(), max_turns=g.max_plies))
    assert [f.returns for f in sorted(done, key=lambda f: f.episode.seed)] == [[1.0, -1.0],
                                                                               [-1.0, 1.0]]


def random_game_to_the_end(game, seed):
    """Random play that never fills its own single-point eyes, until both sides pass."""
    rng = random.Random(seed)
    s = game.new_initial_state()
    while not game.is_terminal(s):
        c = s.to_play + 1
        moves = [a for a in game.legal_actions(s)[:-1]
                 if not all(s.board[n] == c for n in game.nbrs[a])]
        s = game.apply(s, rng.choice(moves) if moves else game.pass_action)
    return s


def settled(state):
    """No group in atari. GnuGo's final_score removes the stones it judges dead, area
    scoring counts stones as they stand; on such positions both must agree. (Random games
    can end with a group in atari, e.g. when superko forbids the capture: there GnuGo
    scores the group dead and the two differ, by design.)"""
    return all(len(lib) >= 2 for _, lib, _ in state.groups.values())


def gnugo_scores_agree(n_games, seed):
    g = Go(9, max_plies=1000)  # the game ends by two passes, never by the cap
    compared = 0
    with gnugo_player(level=1) as gnugo:
        for i in range(n_games):
            s = random_game_to_the_end(g, seed + i)
            assert s.passes == 2
            if settled(s):
                compared += 1
                assert gnugo.final_score(g, s) == g.area_score(s), f"game {seed + i}"
    assert compared >= n_games // 3


@needs_gnugo
def test_gnugo_area_score_matches_ours():
    gnugo_scores_agree(6, seed=0)


@needs_gnugo
@pytest.mark.slow
def test_gnugo_area_score_matches_ours_on_200_games():
    gnugo_scores_agree(200, seed=1000)


def test_no_engine_process_is_left_behind():
    """Runs last in this file: no child of this process is a GTP engine any more."""
    proc = Path("/proc")
    if not proc.is_dir():
        pytest.skip("needs /proc")
    me, left = os.getpid(), []
    for d in proc.iterdir():
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and ("fake_gtp" in cmd or "gnugo" in cmd):
            left.append(cmd)
    assert not left
