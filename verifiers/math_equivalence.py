"""Are two math answers the same? ``math-verify`` decides, every check under a hard time limit.

    eq = MathEquivalence(timeout_s=2.0)
    eq.equal("0.5", "\\boxed{\\frac{1}{2}}")     # True
    eq.classes(["1/2", "0.5", "3", "", "abc"])    # [0, 0, 1, -1, -1]
    eq.close()

The rules, in order:

1. ``clean``: strip whitespace, ``$`` delimiters, one outer ``\\boxed{...}`` and trailing
   punctuation (" 1/2 ." -> "1/2"). Empty or longer than ``max_chars`` -> a non-answer.
2. Plain numbers (integers, decimals, fractions ``a/b``, at most 30 digits each, no
   exponent) are compared exactly as fractions, here, without a subprocess: the common case.
3. Everything else goes to ``math-verify`` (``parse`` of ``\\boxed{text}`` + ``verify``) in a
   worker process. Text that parses to nothing, or that contains a word of three or more
   letters that is not a LaTeX command (prose: "I do not know" parses to a product of
   symbols), is a non-answer. A non-answer never equals anything, itself included.
4. Time limit: math-verify's own limit is ``signal.alarm``, which works only in a main
   thread and cannot stop C code (``9^{9^{9^9}}`` computes a huge power). So the worker
   is a separate process; a request not answered within ``timeout_s`` kills it (a new one
   starts for the next request) and counts as "not equal" / "non-answer" and as a timeout;
   the same request is not tried again. In a vote, an answer whose check hangs is a
   non-answer.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import subprocess
import sys
import threading
from fractions import Fraction

_NUMBER = re.compile(r"[+-]?(?:\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})(?:/\d{1,30})?")
_PROSE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
_BOXED = re.compile(r"^\\boxed\s*\{(.*)\}$", re.S)


def clean(text: object, max_chars: int = 200) -> str | None:
    """Step 1: the bare answer text, or None for a non-answer."""
    if not isinstance(text, str):
        return None
    s = text.strip()
    if len(s) > 4 * max_chars:  # do not even scan a huge string
        return None
    for _ in range(3):  # peel "$...$", "\boxed{...}", trailing punctuation, in any nesting
        s = s.strip().rstrip(".,;:!").strip()
        if len(s) >= 2 and s[0] == s[-1] == "$":
            s = s.strip("$")
        m = _BOXED.match(s)
        if m:
            s = m.group(1)
    s = s.strip()
    return s if s and len(s) <= max_chars else None


def plain_number(s: str) -> Fraction | None:
    """Step 2: the exact value of a plain number / fraction, else None (x/0 is None)."""
    t = s.replace(" ", "")
    if not _NUMBER.fullmatch(t):
        return None
    num, _, den = t.partition("/")
    try:
        value = Fraction(num)
        return value / int(den) if den else value
    except (ValueError, ZeroDivisionError):
        return None


class MathEquivalence:
    """Equivalence of math answers under a hard per-request time limit. Thread-safe."""

    def __init__(self, timeout_s: float = 2.0, max_chars: int = 200):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.max_chars = max_chars
        self.timeouts = 0  # requests that hit the limit (their worker was killed)
        self._timed_out: set[str] = set()
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    # --- the public checks ------------------------------------------------------------
    def is_answer(self, text: object) -> bool:
        s = clean(text, self.max_chars)
        if s is None:
            return False
        return plain_number(s) is not None or bool(self._ask({"op": "parse", "a": s}))

    def equal(self, a: object, b: object) -> bool:
        """True when both are answers and math-verify finds them equivalent (symmetric)."""
        sa, sb = clean(a, self.max_chars), clean(b, self.max_chars)
        if sa is None or sb is None:
            return False
        na, nb = plain_number(sa), plain_number(sb)
        if na is not None and nb is not None:
            return na == nb
        return bool(self._ask({"op": "equal", "a": sa, "b": sb}))

    def classes(self, answers: list[object]) -> list[int]:
        """Equivalence-class id of each answer (0, 1, ... in order of first appearance);
        -1 for non-answers. Each distinct text is compared with one representative per
        class found so far (greedy: equivalence is assumed transitive)."""
        reps: list[str] = []
        by_text: dict[str, int] = {}
        out = []
        for a in answers:
            s = clean(a, self.max_chars)
            if s is None:
                out.append(-1)
                continue
            if s not in by_text:
                by_text[s] = self._assign(s, reps)
            out.append(by_text[s])
        return out

    def _assign(self, s: str, reps: list[str]) -> int:
        if plain_number(s) is None and not self._ask({"op": "parse", "a": s}):
            return -1
        before = self.timeouts
        for k, r in enumerate(reps):
            if self.equal(r, s):
                return k
            if self.timeouts > before:  # s makes the checker hang: it cannot be verified
                return -1
        reps.append(s)
        return len(reps) - 1

    # --- the worker ---------------------------------------------------------------------
    def _ask(self, request: dict) -> bool:
        """One request to the worker; False on timeout (the worker is killed) or error. A
        request that timed out once answers False at once when asked again."""
        key = json.dumps(request, sort_keys=True)
        with self._lock:
            if key in self._timed_out:
                return False
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            line, timed_out = self._exchange(key + "\n", self.timeout_s)
            self.timeouts += timed_out
            if timed_out and len(self._timed_out) < 100_000:
                self._timed_out.add(key)
            try:
                return bool(json.loads(line)) if line is not None else False
            except ValueError:
                return False

    def _exchange(self, text: str | None, timeout_s: float) -> tuple[bytes | None, bool]:
        """Send ``text`` (if any), read one line within ``timeout_s``: (line, False);
        (None, timed out?) and the worker killed when no line comes."""
        proc = self._proc
        if proc is None:
            return None, False
        try:
            if text is not None:
                proc.stdin.write(text.encode())
                proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
            line = proc.stdout.readline() if ready else None
        except (OSError, ValueError):
            line = b""
        if not line:
            self._kill()
            return None, line is None
        return line, False

    def _start(self) -> None:
        """A fresh worker; waits (up to a minute) until it has imported math-verify, so
        that start-up never counts against a request's limit."""
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "lmselfplay.verifiers.math_equivalence", str(math.ceil(self.timeout_s))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True)
        if self._exchange(None, 60.0)[0] is None:
            raise RuntimeError("the math-verify worker did not start (is math-verify installed?)")

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self._kill()

    def __enter__(self) -> MathEquivalence:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self._kill()
        except Exception:
            pass


# --- the worker process: JSON lines in, JSON booleans out -------------------------------

def _serve(limit_s: int) -> None:  # pragma: no cover - runs in the subprocess
    import logging
    import resource

    from math_verify import parse, verify

    logging.disable(logging.CRITICAL)  # math-verify logs timeouts; stdout is our channel
    try:  # a huge power must not take the machine's memory with it
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    except (ValueError, OSError):
        pass
    cache: dict[str, list] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()

    def parsed(s: str) -> list:
        if s not in cache:
            if _PROSE.search(s):
                cache[s] = []
            else:
                cache[s] = parse("\\boxed{" + s + "}", fallback_mode="no_fallback", parsing_timeout=limit_s)
        return cache[s]

    for line in sys.stdin:
        try:
            req = json.loads(line)
            a = parsed(req["a"])
            if req["op"] == "parse":
                out = bool(a)
            else:
                b = parsed(req["b"])
                out = bool(a and b and (verify(a, b, timeout_seconds=limit_s)
                                        or verify(b, a, timeout_seconds=limit_s)))
        except Exception:  # noqa: BLE001 - any failure of a check is "not equal"
            out = False
        sys.stdout.write("true\n" if out else "false\n")
        sys.stdout.flush()


if __name__ == "__main__":  # pragma: no cover
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
