"""The test suite's own settings (tests/conftest.py): one torch thread per process, longest files first."""

from __future__ import annotations

import os
from pathlib import Path

import conftest


def test_each_process_runs_the_threads_omp_num_threads_names():
    """conftest sets OMP_NUM_THREADS before anything imports torch; were torch imported first, it
    would have taken one thread per core and the xdist workers would spin against each other."""
    import torch

    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])


def test_the_longest_files_exist_and_are_collected_first(request):
    tests = Path(__file__).resolve().parents[1]
    assert all((tests / name).is_file() for name in conftest.LONGEST_FILES), conftest.LONGEST_FILES
    first = request.session.items[0].path.as_posix()
    assert first.endswith("tests/" + conftest.LONGEST_FILES[0]) or len(request.session.items) < 50, first
