"""reasoning-gym suites: scripted outputs of known correctness, one batched stream, the
recipe callback, and completions files with bad input."""

import json
import math

import pytest
from fake_engine import ScriptedEngine
from lm_fixtures import tiny_tokenizer

from lmselfplay.cli import main as cli_main
from lmselfplay.eval.reasoning import (
    MAX_ANSWER_CHARS,
    Problem,
    build_problems,
    eval_callback,
    evaluate_suite,
    load_suite,
    prompt_text,
    score_completions_file,
)
from lmselfplay.lm.prompt import encode_prompt
from lmselfplay.utils.metrics_logger import MetricsLogger, read_jsonl

SUITE = """
name: scripted
answer_format: {fmt}
max_new_tokens: 16
tasks:
  - {{name: basic_arithmetic, size: 12, seed: 5, config: {{min_terms: 2, max_terms: 3}}}}
  - {{name: chain_sum, size: 10, seed: 6}}
  - {{name: mini_sudoku, size: 6, seed: 7}}
  - {{name: gsm_symbolic, size: 4, seed: 8}}
"""


@pytest.fixture
def suite_path(tmp_path):
    p = tmp_path / "scripted.yaml"
    p.write_text(SUITE.format(fmt="answer"))
    return p


def scripted(problems, wrap):
    """An answer function right exactly on problems whose question hashes even, and
    the expected pass@1 per task (questions repeat: the answer depends on the question)."""
    good = {p.question: len(p.question) % 2 == 0 for p in problems}
    by_q = {p.question: p.entry["answer"] for p in problems}

    def answer(prompt):
        q = next(q for q in by_q if q in prompt)
        return wrap(by_q[q] if good[q] else "wrong " + by_q[q][::-1] + "9")

    expected = {}
    for p in problems:
        expected.setdefault(p.task, []).append(good[p.question])
    return answer, {t: sum(v) / len(v) for t, v in expected.items()}


def test_default_suite_is_fixed():
    suite = load_suite("default")
    assert [t.name for t in suite.tasks] == ["basic_arithmetic", "chain_sum", "gsm_symbolic",
                                             "propositional_logic", "mini_sudoku"]
    a, b = build_problems(suite), build_problems(load_suite("default"))
    assert len(a) == 200 and [p.question for p in a] == [p.question for p in b]


def test_scripted_outputs_score_as_known(suite_path):
    tok = tiny_tokenizer()
    suite = load_suite(suite_path)
    problems = build_problems(suite)
    answer, expected = scripted(problems, lambda a: f"I think... <answer>{a}</answer>")
    eng = ScriptedEngine(tok, answer)
    res = evaluate_suite(eng, tok, suite, chunk_size=8)
    for task, want in expected.items():
        assert res["greedy"]["tasks"][task]["pass@1"] == pytest.approx(want)
    assert 0 < res["greedy"]["overall"]["pass@1"] < 1
    # ONE stream of batched calls: ceil(32 / 8) calls, every prompt exactly once, built by
    # the project's formatter with the rule's instruction
    assert len(eng.calls) == math.ceil(len(problems) / 8)
    sent = sorted(tuple(p) for call in eng.calls for p in call)
    want = sorted(tuple(encode_prompt(tok, prompt_text(p, "answer"))) for p in problems)
    assert sent == want


def test_other_answer_formats_use_their_rule(tmp_path):
    tok = tiny_tokenizer()
    p = tmp_path / "boxed.yaml"
    p.write_text(SUITE.format(fmt="boxed"))
    suite = load_suite(p)
    answer, expected = scripted(build_problems(suite), lambda a: f"so \\boxed{{{a}}}")
    res = evaluate_suite(ScriptedEngine(tok, answer), tok, suite)
    assert res["greedy"]["tasks"]["chain_sum"]["pass@1"] == pytest.approx(expected["chain_sum"])
    # the same outputs without the box the prompt asked for score nothing
    answer2, _ = scripted(build_problems(suite), lambda a: f"<answer>{a}</answer>")
    res2 = evaluate_suite(ScriptedEngine(tok, answer2), tok, suite)
    assert res2["greedy"]["overall"]["pass@1"] == 0.0


def test_scorer_failures_and_huge_answers_score_zero():
    calls = []

    class Dataset:
        def score_answer(self, answer, entry):
            calls.append(answer)
            if answer == "boom":
                raise RuntimeError("scorer bug")
            return 7.0 if answer == "seven" else 1.0

    p = Problem("t/0", "t", "q", {"answer": "a"}, Dataset())
    assert p.score("ok") == 1.0
    assert p.score("boom") == 0.0 and p.score("seven") == 0.0  # out of [0, 1]: not trusted
    assert p.score("(" * (MAX_ANSWER_CHARS + 1)) == 0.0
    assert calls == ["ok", "boom", "seven"]  # the huge answer never reached the scorer


def test_sampled_pass_at_k(suite_path):
    tok = tiny_tokenizer()
    suite = load_suite(suite_path)
    answer, _ = scripted(build_problems(suite), lambda a: f"<answer>{a}</answer>")
    eng = ScriptedEngine(tok, answer)
    res = evaluate_suite(eng, tok, suite, samples=3, ks=(1, 2, 3), chunk_size=40)
    s = res["sampled"]["overall"]
    # a deterministic scripted engine: every sample agrees, so pass@k == pass@1
    assert s["pass@1"] == s["pass@3"] == res["greedy"]["overall"]["pass@1"]
    assert len(eng.calls) == 1 + math.ceil(32 * 3 / 40)


@pytest.mark.parametrize("text, match", [
    ("tasks: []", "non-empty list"),
    ("tasks: [{name: chain_sum, size: 0, seed: 1}]", "positive"),
    ("tasks: [{name: chain_sum, size: 2, seed: 1, colour: red}]", "unknown keys"),
    ("tasks: [{name: no_such_task, size: 2, seed: 1}]", "no_such_task"),
    ("answer_format: smoke\ntasks: [{name: chain_sum, size: 2, seed: 1}]", "unknown answer format"),
    ("tasks: [{name: chain_sum, size: 2, seed: 1, config: {min_terms: -5}}]", "chain_sum"),
    ("{{{", "YAML"),
])
def test_bad_suites_are_clear_errors(tmp_path, text, match):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=match):
        build_problems(load_suite(p))


def test_unknown_suite_name():
    with pytest.raises(FileNotFoundError, match="default"):
        load_suite("no-such-suite")


def test_callback_appends_rows(suite_path, tmp_path):
    tok = tiny_tokenizer()
    suite = load_suite(suite_path)
    answer, expected = scripted(build_problems(suite), lambda a: f"<answer>{a}</answer>")
    eng = ScriptedEngine(tok, answer)
    logger = MetricsLogger(tmp_path / "run", tensorboard=False)
    logger.log(1, {"loss": 1.0})
    for step in range(1, 7):
        eval_callback(step, eng, tok, suite, eval_every=3, metrics=logger)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    evals = [r for r in rows if "eval/scripted/pass@1" in r]
    assert [r["step"] for r in evals] == [3, 6]
    assert evals[0]["eval/scripted/chain_sum/pass@1"] == pytest.approx(expected["chain_sum"])
    assert rows[0] == {"step": 1, "loss": 1.0}
    # a plain path works too, and eval_every <= 0 never evaluates
    path = tmp_path / "other" / "metrics.jsonl"
    assert eval_callback(4, eng, tok, suite, eval_every=2, metrics=path) is not None
    assert eval_callback(4, eng, tok, suite, eval_every=0, metrics=path) is None
    assert eval_callback(4, eng, tok, "", eval_every=2, metrics=path) is None
    assert [r["step"] for r in read_jsonl(path)] == [4]


def _write(path, rows):
    path.write_bytes(b"".join(r if isinstance(r, bytes) else (json.dumps(r) + "\n").encode() for r in rows))


def test_completions_file_scores_and_survives_bad_input(suite_path, tmp_path):
    problems = build_problems(load_suite(suite_path))
    right = [p for p in problems if p.task == "chain_sum"]
    rows = [{"id": p.id, "completion": f"<answer>{p.entry['answer']}</answer>"} for p in right]
    rows += [
        {"id": problems[0].id, "completion": "x" * 10_000_000 + "<answer>1</answer>"},  # 10 MB
        b"\xff\xfe not utf-8 \x80\n",
        b"{not json\n",
        {"id": "chain_sum/999", "completion": "<answer>1</answer>"},  # unknown id
        {"id": problems[1].id},  # no completion field
        ["a", "list"],
    ]
    f = tmp_path / "c.jsonl"
    _write(f, rows)
    res = score_completions_file(suite_path, f)
    tasks = res["completions"]["tasks"]
    assert tasks["chain_sum"]["pass@1"] == 1.0
    assert tasks["basic_arithmetic"]["pass@1"] == 0.0 and tasks["mini_sudoku"]["pass@1"] == 0.0
    c = res["issue_counts"]
    assert c["too-long"] == 1 and c["not-utf8"] == 1 and c["not-json"] == 1
    assert c["unknown-id"] == 1 and c["bad-row"] == 2
    assert c["missing"] == len(problems) - len(right) - 1
    assert any("no completion" in i for i in res["issues"])


def test_completions_duplicates_are_samples(suite_path, tmp_path):
    problems = build_problems(load_suite(suite_path))
    rows = []
    for p in problems:  # 2 samples each: one right, one wrong
        rows.append({"id": p.id, "completion": f"<answer>{p.entry['answer']}</answer>"})
        rows.append({"id": p.id, "completion": "<answer>nonsense</answer>"})
    f = tmp_path / "c.jsonl"
    _write(f, rows)
    res = score_completions_file(suite_path, f, ks=(1, 2))
    cs = res["completions"]["tasks"]["chain_sum"]
    assert cs["samples"] == 2 and cs["pass@1"] == 0.5 and cs["pass@2"] == 1.0


def test_cli_scores_a_completions_file(suite_path, tmp_path, capsys):
    problems = build_problems(load_suite(suite_path))
    f = tmp_path / "c.jsonl"
    _write(f, [{"id": p.id, "completion": f"<answer>{p.entry['answer']}</answer>"} for p in problems])
    out = tmp_path / "out"
    assert cli_main(["eval", "reasoning", "--suite", str(suite_path), "--completions", str(f),
                     "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "OVERALL" in text and "chain_sum" in text
    data = json.loads((out / "reasoning_scripted.json").read_text())
    assert data["completions"]["overall"]["pass@1"] == 1.0
    csv = (out / "reasoning_scripted.csv").read_text().splitlines()
    assert csv[0].startswith("mode,task,problems") and len(csv) == 1 + 4 + 1
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left
    # a missing file is a clear error, not a traceback
    assert cli_main(["eval", "reasoning", "--suite", str(suite_path), "--completions",
                     str(tmp_path / "nope.jsonl")]) == 2
