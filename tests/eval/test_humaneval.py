"""HumanEval scored in the sandbox: the canonical solutions pass, empty bodies fail, and
hostile or malformed completions are counted failures."""

import json

import pytest
from fake_engine import ScriptedEngine
from lm_fixtures import tiny_tokenizer

from lmselfplay.cli import main as cli_main
from lmselfplay.eval.humaneval import (
    check_completions,
    completion_from_output,
    evaluate_humaneval,
    load_problems,
    score_completions_file,
)
from lmselfplay.verifiers.executor import Executor, ExecutorConfig


@pytest.fixture(scope="module")
def problems():
    return load_problems()


@pytest.fixture(scope="module")
def executor():
    with Executor(ExecutorConfig(timeout_s=3, cpu_s=3)) as ex:
        yield ex


def test_all_canonical_solutions_pass_and_empty_bodies_fail(problems, executor):
    assert len(problems) == 164
    good = check_completions(problems, {t: [p["canonical_solution"]] for t, p in problems.items()},
                             executor, progress=False)
    assert [t for t, r in good.items() if not r[0]["passed"]] == []
    empty = check_completions(problems, {t: ["    pass\n"] for t in problems}, executor, progress=False)
    assert sum(r[0]["passed"] for r in empty.values()) == 0


def _write(path, rows):
    path.write_bytes(b"".join(r if isinstance(r, bytes) else (json.dumps(r) + "\n").encode() for r in rows))


HOSTILE = {
    "HumanEval/0": "    while True:\n        pass\n",
    "HumanEval/1": "    import os\n    os.fork()\n    return []\n",
    "HumanEval/2": "    return float(open('/etc/passwd').read()[:0] or number % 1.0)\n",
    "HumanEval/3": "    import subprocess\n    subprocess.run(['true'])\n    return False\n",
    "HumanEval/4": "    return [0] * 10**10\n",
    "HumanEval/5": "    print('x' * 10**7)\n    return []\n",
    "HumanEval/6": "    import socket\n    return []\n",
}


def test_completions_file_with_hostile_and_bad_rows(problems, executor, tmp_path):
    rows = [{"task_id": t, "completion": problems[t]["canonical_solution"]}
            for t in ("HumanEval/10", "HumanEval/11", "HumanEval/12")]
    rows += [{"task_id": t, "completion": c} for t, c in HOSTILE.items()]
    rows += [
        {"task_id": "HumanEval/13", "completion": "    return 0\n" + "#" * 10_000_000},  # 10 MB
        {"task_id": "HumanEval/12", "completion": "    return None\n"},  # a second, failing sample
        b"\xff\xfe\x00 bad bytes\n",
        {"task_id": "HumanEval/999", "completion": ""},
        {"completion": "no id"},
    ]
    f = tmp_path / "samples.jsonl"
    _write(f, rows)
    res = score_completions_file(f, ks=(1,), executor=executor)
    by = {r["id"]: r for r in res["problems"]}
    assert by["HumanEval/10"]["correct"] == 1 and by["HumanEval/11"]["correct"] == 1
    assert by["HumanEval/12"]["n"] == 2 and by["HumanEval/12"]["correct"] == 1
    for t in [*HOSTILE, "HumanEval/13", "HumanEval/100"]:
        assert by[t]["correct"] == 0, t
    assert by["HumanEval/0"]["statuses"] == ["timeout"]
    assert by["HumanEval/13"]["statuses"] == ["not-run"]
    c = res["issue_counts"]
    assert c["too-long"] == 1 and c["not-utf8"] == 1 and c["unknown-id"] == 1 and c["bad-row"] == 1
    assert c["missing"] == 164 - 11
    # pass@1 over problems: 10, 11 count 1, 12 counts 1/2
    assert res["completions"]["overall"]["pass@1"] == pytest.approx(2.5 / 164)


def test_pass_at_k_from_samples(problems, executor, tmp_path):
    ids = list(problems)[:4]
    rows = []
    for i, t in enumerate(ids):  # problem i gets i right samples out of 4
        for j in range(4):
            body = problems[t]["canonical_solution"] if j < i else "    raise ValueError\n"
            rows.append({"task_id": t, "completion": body})
    f = tmp_path / "samples.jsonl"
    _write(f, rows)
    res = score_completions_file(f, ks=(1, 2), executor=executor)
    assert res["completions"]["overall"]["problems"] == 164
    by = {r["id"]: r for r in res["problems"]}
    assert [by[t]["correct"] for t in ids] == [0, 1, 2, 3]
    # the 160 missing problems get 4 failed samples each, so pass@2 is defined
    want2 = (0 + 0.5 + 5 / 6 + 1) / 164  # 1 - C(4-c,2)/C(4,2) for c = 0..3
    assert res["completions"]["overall"]["pass@2"] == pytest.approx(want2)


def test_model_outputs_become_completions(problems):
    p = problems["HumanEval/0"]
    body = "    return True\n"
    assert completion_from_output(p, body) == body
    fenced = "Here:\n```python\ndef has_close_elements(numbers, threshold):\n    return 1\n```"
    full = completion_from_output(p, fenced)
    assert full.startswith("\ndef has_close_elements(")


def _scripted_solutions(problems, ids, fenced: bool):
    """The canonical solution for even problems, a wrong body otherwise (fenced for chat;
    a plain continuation goes on past the function, as a base model does)."""
    by_prompt = {problems[t]["prompt"].rstrip(): t for t in ids}

    def answer(prompt):
        t = next(t for q, t in by_prompt.items() if q in prompt)
        sol = problems[t]["canonical_solution"] if int(t.split("/")[1]) % 2 == 0 else "    return None\n"
        return f"```python\n{sol}```" if fenced else sol + "\n\ndef unrelated():\n    raise SystemExit(1)\n"

    return answer


def test_generation_path_with_scripted_engine(problems, executor):
    """A model without a chat template continues the prompt; the text after a stop sequence is cut."""
    tok = tiny_tokenizer()
    ids = list(problems)[:6]
    eng = ScriptedEngine(tok, _scripted_solutions(problems, ids, fenced=False))
    res = evaluate_humaneval(eng, tok, limit=6, executor=executor, chunk_size=4)
    assert res["prompt_format"] == "plain"
    assert res["greedy"]["overall"]["pass@1"] == pytest.approx(0.5)
    assert len(eng.calls) == 2
    assert tok.decode(eng.calls[0][0], skip_special_tokens=True) in [problems[t]["prompt"] for t in ids]


def test_chat_models_are_asked_for_the_code(problems, executor, standin):
    from lmselfplay.models.policy import load_tokenizer

    tok = load_tokenizer(str(standin("qwen2.5-instruct")))
    ids = list(problems)[:4]
    eng = ScriptedEngine(tok, _scripted_solutions(problems, ids, fenced=True))
    res = evaluate_humaneval(eng, tok, limit=4, executor=executor)
    assert res["prompt_format"] == "chat" and res["greedy"]["overall"]["pass@1"] == pytest.approx(0.5)
    assert tok.decode(eng.calls[0][0]).startswith("<|im_start|>system\nYou are Qwen")


def test_base_code_models_get_the_plain_prompt_and_its_stops(problems, executor, standin):
    """Qwen2.5-Coder base ships a ChatML template; HumanEval must not wrap it in ChatML."""
    from lmselfplay.models.policy import load_tokenizer

    tok = load_tokenizer(str(standin("qwen2.5-coder-base")))
    ids = list(problems)[:2]
    stops = []

    class Recording(ScriptedEngine):
        def generate(self, prompts_token_ids, sampling):
            stops.append(sampling.stop)
            return super().generate(prompts_token_ids, sampling)

    eng = Recording(tok, _scripted_solutions(problems, ids, fenced=False))
    res = evaluate_humaneval(eng, tok, limit=2, executor=executor)
    assert res["prompt_format"] == "plain" and res["greedy"]["overall"]["pass@1"] == pytest.approx(0.5)
    assert stops == [["\ndef", "\nclass", "\nif", "\nprint", "\n#"]]
    assert tok.decode(eng.calls[0][0]) in [problems[t]["prompt"] for t in ids]


def test_cli_humaneval_completions(problems, tmp_path, capsys):
    f = tmp_path / "samples.jsonl"
    _write(f, [{"task_id": t, "completion": p["canonical_solution"]} for t, p in list(problems.items())[:20]])
    assert cli_main(["eval", "humaneval", "--completions", str(f), "--k", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "144 of 164 problems have no completion" in out.err
    data = json.loads((tmp_path / "humaneval.json").read_text())
    assert data["completions"]["overall"]["pass@1"] == pytest.approx(20 / 164)
