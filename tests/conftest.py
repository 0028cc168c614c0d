import os

# Nothing in the test suite may touch a model hub (set before anything imports transformers).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from lmselfplay.games import make  # noqa: E402


@pytest.fixture(scope="module")
def kuhn():
    """The Kuhn poker game (immutable: one per module)."""
    return make("kuhn_poker")
