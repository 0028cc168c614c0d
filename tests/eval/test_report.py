"""The pass@k tables: per-task and overall rows from known outcomes, k above the samples left out,
and the JSON and CSV written beside the printed table."""

import csv
import json

import pytest

from lmselfplay.eval.report import render, summarize

RECORDS = [{"id": "a", "task": "sums", "n": 4, "correct": 4, "mean_score": 1.0},
           {"id": "b", "task": "sums", "n": 4, "correct": 0, "mean_score": 0.0},
           {"id": "c", "task": "words", "n": 4, "correct": 1, "mean_score": 0.5}]


def test_pass_at_k_per_task_and_overall():
    s = summarize(RECORDS, ks=(1, 2, 8))
    sums, words, overall = s["tasks"]["sums"], s["tasks"]["words"], s["overall"]
    assert sums["pass@1"] == 0.5 and sums["pass@2"] == 0.5 and sums["mean_score"] == 0.5
    assert words["pass@1"] == 0.25 and words["pass@2"] == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert overall["problems"] == 3 and overall["pass@1"] == pytest.approx((1 + 0 + 0.25) / 3)
    assert "pass@8" not in overall  # 4 samples a problem: pass@8 is not defined
    lo, hi = overall["pass@1_ci"]
    assert lo <= overall["pass@1"] <= hi


def test_render_prints_and_writes_json_and_csv(tmp_path):
    result = {"suite": "tiny", "greedy": summarize(RECORDS)}
    text = render(result, tmp_path, "tiny")
    assert "== tiny / greedy ==" in text and "OVERALL" in text and f"wrote {tmp_path / 'tiny.json'}" in text
    assert json.loads((tmp_path / "tiny.json").read_text())["suite"] == "tiny"
    rows = list(csv.DictReader((tmp_path / "tiny.csv").open()))
    assert [r["task"] for r in rows] == ["sums", "words", "OVERALL"] and rows[0]["pass@1"] == "0.5"
    assert render(result, None, "tiny") == text.split("\nwrote")[0]  # no folder: nothing written
