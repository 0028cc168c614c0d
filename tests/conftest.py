import os

# Nothing in the test suite may touch a model hub (set before anything imports transformers).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One torch thread per process unless the caller says otherwise: the suite's models are tiny, its
# parallelism is one xdist worker per core, and two threads per worker on a 2-core machine spin
# against each other (tests/utils/test_checkpoint.py + tests/debate/test_debate.py took 79 s with
# 2 threads, 22 s with 1, beside one other busy process). Subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from lmselfplay.games import make  # noqa: E402


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one worker per core, at most 4 — each worker imports
    torch and builds its own session fixtures, so more workers than that cost memory, not time."""
    return max(1, min(os.cpu_count() or 1, 4))


# The files that take longest start first (longest-first keeps the workers' finishing times close:
# xdist hands each worker whole files in collection order, and a long file dealt last runs alone).
LONGEST_FILES = ("project/test_documented_commands.py", "verifiers/test_sandbox.py", "verifiers/test_executor.py",
                 "rl/test_overlap.py")


def pytest_collection_modifyitems(config, items):
    """Move the tests of :data:`LONGEST_FILES` to the front, in that order; the rest keep theirs."""
    def rank(item):
        path = item.path.as_posix()
        return next((i for i, name in enumerate(LONGEST_FILES) if path.endswith("tests/" + name)), len(LONGEST_FILES))

    items.sort(key=rank)  # stable: tests within a file, and the other files, keep their order


@pytest.fixture(scope="module")
def kuhn():
    """The Kuhn poker game (immutable: one per module)."""
    return make("kuhn_poker")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A saved tiny model (seed 3) for the recipe tests to start from (one per module)."""
    from lm_fixtures import save_tiny

    return save_tiny(tmp_path_factory.mktemp("model"), seed=3)


@pytest.fixture(scope="session")
def standin():
    """``standin(name) -> Path``: the cached folder of a stand-in model (built once, seconds;
    names in ``lmselfplay.models.standins.STANDINS``; parametrize tests over that list)."""
    from lmselfplay.models.standins import ensure_standin

    return ensure_standin
