"""How many CPU threads torch uses in a run: ``--torch_threads`` (0: the automatic choice).

The rule of :func:`torch_threads` for 0 (auto):

* the embedded model (about a million parameters): one thread. Its matrices are too small
  for a second thread to pay, and torch's OpenMP pool spins while it waits: beside other work
  on the same cores the spinning threads and the other processes take turns, and a step took
  ~5x its time alone (``benchmarks/bench_threads_under_load.py``);
* any other model: the cores other processes leave free (the cores this process may run on,
  less the one-minute load average, rounded; at least one), read once when the run starts.

A positive value is used as given.
"""

from __future__ import annotations

import os

EMBEDDED_NAMES = (None, "", "tiny", "embedded")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; ``os.cpu_count`` elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def free_cores() -> int:
    """Usable cores less the one-minute load average (rounded), at least 1."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return max(1, usable_cores() - round(load))


def torch_threads(requested: int, model_name_or_path: str | None) -> int:
    """The thread count for ``--torch_threads requested`` (see the module doc)."""
    if requested > 0:
        return requested
    return 1 if model_name_or_path in EMBEDDED_NAMES else free_cores()
