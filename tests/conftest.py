import os

# Nothing in the test suite may touch a model hub (set before anything imports transformers).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from lmselfplay.games import make  # noqa: E402


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one worker per core, at most 4 — each worker imports
    torch and builds its own session fixtures, so more workers than that cost memory, not time."""
    return max(1, min(os.cpu_count() or 1, 4))


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
