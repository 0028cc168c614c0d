"""A completions file from anywhere is read without crashing: every bad line is skipped and
named, a missing problem counts as failed samples, an over-long completion as a failed one."""

import pytest

from lmselfplay.eval.completions import read_completions


def test_good_bad_and_missing_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"task_id": "p1", "completion": "x"}\n'
                     b'{"task_id": "p1", "completion": "y"}\n'
                     b"not json\n"
                     b'{"task_id": "p2"}\n'
                     b'{"task_id": "zz", "completion": "x"}\n'
                     b'{"task_id": "p2", "completion": "' + b"z" * 20 + b'"}\n'
                     b"\xff\xfe\n\n")
    got = read_completions(path, ["p1", "p2", "p3"], max_chars=10)
    assert got.samples == {"p1": ["x", "y"], "p2": [None], "p3": [None, None]}
    assert got.counts == {"not-json": 1, "bad-row": 1, "unknown-id": 1, "too-long": 1, "not-utf8": 1,
                          "missing": 1}
    summary = got.summary()
    assert "line 3: not JSON" in summary and "unknown task_id 'zz'" in summary
    assert "1 of 3 problems have no completion" in summary
    assert "pass@k is reported only for k <= 1" in summary  # p2 has one sample, p1 two


def test_a_folder_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read completions file"):
        read_completions(tmp_path, ["p1"])
