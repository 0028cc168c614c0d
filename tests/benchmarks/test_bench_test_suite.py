"""``benchmarks/bench_test_suite.py``: rounds alternate the checkouts, ratios, refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_test_suite import main, ratios  # noqa: E402


def _checkout(root: Path, name: str, status: int = 0) -> Path:
    """A stand-in checkout whose interpreter logs its call and prints pytest's summary line."""
    path = root / name
    (path / ".venv" / "bin").mkdir(parents=True)
    (path / "pyproject.toml").write_text("")
    python = path / ".venv" / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho {name} \"$@\" >> {root / 'calls'}\n"
                      f"echo '======= 3 passed, 1 skipped in 0.01s ======='\nexit {status}\n")
    python.chmod(0o755)
    return path


def test_rounds_alternate_base_then_new_and_save_the_ratios(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LMSELFPLAY_RESULTS_DIR", str(tmp_path / "results"))
    base, new = _checkout(tmp_path, "base"), _checkout(tmp_path, "new")
    assert main(["--base", str(base), "--new", str(new), "--rounds", "2"]) == 0
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["base", "new", "base", "new"]
    assert calls[0].split()[1:] == ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
    saved = json.loads((tmp_path / "results" / "bench_test_suite.json").read_text())["results"]
    assert [r["new"]["summary"] for r in saved["rounds"]] == ["3 passed, 1 skipped"] * 2
    assert len(saved["ratio_new_over_base"]["per_round"]) == 2
    assert "new/base of the means" in capsys.readouterr().out


def test_a_failing_suite_gives_no_ratio(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LMSELFPLAY_RESULTS_DIR", str(tmp_path / "results"))
    base, new = _checkout(tmp_path, "base"), _checkout(tmp_path, "new", status=1)
    assert main(["--base", str(base), "--new", str(new)]) == 1
    assert "the new checkout's suite did not pass (exit 1)" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_a_folder_that_is_not_a_set_up_checkout_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"is not a checkout set up with `bash \.ci/setup`"):
        main(["--base", str(tmp_path), "--new", str(tmp_path)])


def test_ratios_are_new_over_base_per_round_and_of_the_means():
    rounds = [{"base": {"wall_s": 400.0}, "new": {"wall_s": 200.0}},
              {"base": {"wall_s": 300.0}, "new": {"wall_s": 180.0}}]
    assert ratios(rounds) == {"per_round": [0.5, 0.6], "of_means": round(380 / 700, 3)}
