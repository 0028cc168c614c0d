"""The torch thread policy of the main job (``--torch_threads``, lmselfplay/utils/threads.py)."""

from __future__ import annotations

import os

import pytest

from lmselfplay.selfplay_games.config import SelfPlayConfigs
from lmselfplay.utils import threads
from lmselfplay.utils.config import ConfigError


def test_auto_is_one_thread_for_the_embedded_model_and_the_free_cores_otherwise(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    for name in (None, "", "tiny", "embedded"):
        assert threads.torch_threads(0, name) == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (1.4, 0.0, 0.0))
    assert threads.torch_threads(0, "org/model") == 3
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 0.0, 0.0))
    assert threads.torch_threads(0, "org/model") == 1  # at least one
    assert threads.torch_threads(5, None) == 5  # a given count is used as given


def test_the_main_job_takes_the_flag():
    assert SelfPlayConfigs.parse([]).selfplay.torch_threads == 0
    assert SelfPlayConfigs.parse(["--torch_threads", "2"]).selfplay.torch_threads == 2
    with pytest.raises(ConfigError, match="torch_threads"):
        SelfPlayConfigs.parse(["--torch_threads", "-1"])
