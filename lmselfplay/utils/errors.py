"""Errors a person reads in one line, for every recipe and CLI verb.

Problems of the user's making (an invalid config value, an unknown name, a missing file or
model path, an output folder in use) are :class:`UserError` s: :func:`run_main` prints them as
one line ``error: <what>`` on stderr and exits with status 2, without a traceback.
``--debug`` on the command line or ``LMSELFPLAY_DEBUG=1`` shows the traceback too.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

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
    return result if isinstance(result, int) else 0


def one_line(e: BaseException) -> str:
    text = str(e) if not isinstance(e, FileNotFoundError) or not e.filename else \
        f"no such file or folder: {e.filename}"
    return " ".join(text.split())
