"""Errors a person reads in one line, for every recipe and CLI verb.

Problems of the user's making (an invalid config value, an unknown name, a missing file or
model path, an output folder in use) are :class:`UserError` s: :func:`run_main` prints them as
one line ``error: <what>`` on stderr and exits with status 2, without a traceback.
``--debug`` on the command line or ``LMSELFPLAY_DEBUG=1`` shows the traceback too.
A full disk, a quota, a read-only file system or a refused permission (an ``OSError`` with
one of :data:`STORAGE_ERRNOS`) is the user's to fix too: one line, exit 2.
A collective (multi-process) operation that fails because another rank died or hangs
past ``collective_timeout_s`` is not a bug either: one ``error:`` line saying so, exit 1.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any


class UserError(Exception):
    """A problem the user can fix: the message says what, where, and what would be valid."""


def debug_enabled(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("LMSELFPLAY_DEBUG", "") not in ("", "0")


def run_main(main: Callable[[list[str]], Any], argv: list[str] | None = None) -> int:
    """Run a recipe's / verb's ``main(argv)``; user errors -> one line on stderr, exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = debug_enabled(argv)
    argv = [a for a in argv if a != "--debug"]
    try:
        result = main(argv)
    except (UserError, FileNotFoundError) as e:
        if debug:
            traceback.print_exc()
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            if debug:
                traceback.print_exc()
            print(f"error: {e.strerror or one_line(e)}" + (f": {e.filename}" if e.filename else ""), file=sys.stderr)
            return 2
        if not is_peer_failure(e):
            raise
        if debug:
            traceback.print_exc()
        print(f"error: a collective operation failed because another process of this run died or hangs "
              f"({one_line(e)[-200:]}); --resume continues from the last checkpoint", file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0


STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})

PEER_FAILURES = ("Timed out waiting", "Connection closed by peer", "Connection reset by peer",
                 "Watchdog caught collective operation timeout")


def is_peer_failure(e: BaseException) -> bool:
    """A torch.distributed collective that failed for a dead or hung peer (gloo / NCCL)."""
    if type(e).__name__ in ("DistBackendError", "DistNetworkError"):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in PEER_FAILURES)


def one_line(e: BaseException) -> str:
    text = str(e) if not isinstance(e, FileNotFoundError) or not e.filename else \
        f"no such file or folder: {e.filename}"
    return " ".join(text.split())
