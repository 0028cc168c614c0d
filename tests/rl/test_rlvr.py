"""RLVR, the positive control: task sets and their held-out split, the referee of task items,
the recipe end to end (metrics, intervals, resume, user files, reasoning-gym), bad inputs."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lm_fixtures import saved_weights

from lmselfplay.rlvr.metrics import accuracy_row
from lmselfplay.rlvr.steps import group_stats
from lmselfplay.tasks.task_sets import TaskItem, TaskSet, is_heldout, parse_spec, read_jsonl
from lmselfplay.utils.recipe_loader import run_recipe
from lmselfplay.verifiers.task_referee import TaskReferee

ROOT = Path(__file__).resolve().parents[2]


# --- task sets ------------------------------------------------------------------------------

def test_generated_training_streams_never_draw_a_heldout_item():
    for kind in ("arithmetic", "program"):
        ts = TaskSet(kind, 200, seed=3)
        assert all(is_heldout(t.question) for t in ts.heldout)
        train = [t for step in range(30) for t in ts.training_batch(step, 16)]
        assert not any(is_heldout(t.question) for t in train)
        assert not {t.question for t in train} & ts.heldout_questions


def test_the_heldout_bucket_is_a_tenth_of_questions_and_fixed_across_seeds():
    ts0, ts1 = TaskSet("arithmetic", 50, seed=0), TaskSet("arithmetic", 50, seed=1)
    assert [t.question for t in ts0.heldout] == [t.question for t in ts1.heldout]
    from lmselfplay.tasks.arithmetic import arithmetic_problem

    rng = random.Random(7)
    share = np.mean([is_heldout(arithmetic_problem(rng)["prompt"]) for _ in range(4000)])
    assert 0.08 < share < 0.12


def test_the_training_stream_is_seeded_by_step():
    ts = TaskSet("arithmetic", 10, seed=0)
    assert [t.question for t in ts.training_batch(5, 8)] == [t.question for t in ts.training_batch(5, 8)]
    assert [t.question for t in ts.training_batch(5, 8)] != [t.question for t in ts.training_batch(6, 8)]


def test_arithmetic_items_carry_their_family_and_worked_answer():
    ts = TaskSet("arithmetic", 300, seed=0)
    fams = {t.family for t in ts.heldout}
    assert fams == {"addition", "subtraction", "multiplication", "division", "add-then-subtract", "multiply-then-add"}
    t = ts.heldout[0]
    assert t.worked.endswith(f"#### {t.answer}")


def test_bad_specs_are_named():
    for spec, words in [("nope", "unknown task set"), ("arithmetic:x", "takes no argument"),
                        ("reasoning_gym:", "name the task"), ("jsonl:", "name the file")]:
        with pytest.raises(ValueError, match=words):
            parse_spec(spec)
    with pytest.raises(ValueError, match="not registered"):
        TaskSet("reasoning_gym:no_such_task", 4)


def test_jsonl_items_split_and_errors_name_the_line(tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text("\n".join(json.dumps({"question": f"What is {i} + {i}?", "answer": 2 * i}) for i in range(10)))
    ts = TaskSet(f"jsonl:{f}", 3)
    assert [t.answer for t in ts.heldout] == ["14", "16", "18"]
    assert not {t.question for t in ts.training_batch(0, 20)} & ts.heldout_questions
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(bad)
    with pytest.raises(ValueError, match="leaves none"):
        TaskSet(f"jsonl:{f}", 10)


def test_reasoning_gym_training_items_avoid_the_heldout_questions():
    ts = TaskSet("reasoning_gym:chain_sum", 20, seed=0, task_config={"min_terms": 2, "max_terms": 2, "max_digits": 1})
    train = ts.training_batch(0, 50)
    assert not {t.question for t in train} & ts.heldout_questions
    assert all(t.answer_format == "answer" for t in train)


# --- the referee ------------------------------------------------------------------------------

def test_a_heldout_set_that_holds_most_questions_is_warned_about(capsys):
    pytest.importorskip("reasoning_gym")
    small = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # ~200 questions in all
    TaskSet("reasoning_gym:chain_sum", 300, task_config=small)
    assert "training draws are held-out questions" in capsys.readouterr().err
    TaskSet("reasoning_gym:chain_sum", 300, task_config=small | {"max_terms": 4, "max_digits": 2})
    assert capsys.readouterr().err == ""


def test_the_referee_rewards_only_the_items_own_answer():
    ref = TaskReferee()
    try:
        arith = TaskItem("a", "arithmetic", "q", "q", "7")
        prog = TaskItem("p", "program", "q", "q", "[1, 2]")
        rg = TaskSet("reasoning_gym:chain_sum", 1, task_config={"min_terms": 2, "max_terms": 2}).heldout[0]
        texts = ["3 + 4 = 7\n#### 7", "#### 8", "I think 7", "[1,2]", f"<answer>{rg.answer}</answer>",
                 "<answer>-99999</answer>", "the answer is 7 but #### 6"]
        items = [arith, arith, arith, prog, rg, rg, arith]
        assert [v.reward for v in ref.score(items, texts)] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
        assert all(v.provenance == "rules" for v in ref.score(items, texts))
        assert rg.prompt.endswith("</answer>.")
    finally:
        ref.close()


def test_a_raising_scorer_gives_no_reward():
    def boom(_):
        raise RuntimeError("hostile")

    ref = TaskReferee()
    try:
        item = TaskItem("x", "reasoning_gym", "q", "q", "1", answer_format="answer", score=boom)
        assert ref.score([item], ["<answer>1</answer>"])[0].reward == 0.0
    finally:
        ref.close()


def test_group_stats_and_accuracy_rows():
    s = group_stats(np.array([[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=float))
    assert s["train/informative_groups"] == pytest.approx(1 / 3)
    row = accuracy_row("eval/heldout", [True, False, True, True])
    assert row["eval/heldout/accuracy"] == 0.75 and row["eval/heldout/ci_low"] < 0.75 < row["eval/heldout/ci_high"]


def test_the_old_module_path_is_one_line_naming_the_package():
    import importlib

    sys.modules.pop("lmselfplay.rl.rlvr", None)
    with pytest.raises(ImportError, match="lmselfplay.rlvr "):
        importlib.import_module("lmselfplay.rl.rlvr")


# --- the recipe ---------------------------------------------------------------------------------

def _args(model_dir, out, steps, **kw):
    base = {"model_name_or_path": str(model_dir), "output_dir": str(out), "max_steps": steps,
            "prompts_per_step": 2, "num_generations": 2, "heldout_size": 6, "eval_every": 1,
            "max_new_tokens": 6, "checkpoint_every": 1, "learning_rate": 1e-3}
    base.update(kw)
    return [x for k, v in base.items() for x in (f"--{k}", str(v))]


def test_the_recipe_logs_heldout_accuracy_with_intervals_at_step_0_and_every_eval(model_dir, tmp_path):
    run_recipe("rlvr", ["--config", str(ROOT / "recipes/configs/rlvr.yaml"), *_args(model_dir, tmp_path, 2)])
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/heldout/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    for r in evals:
        assert r["eval/heldout/ci_low"] <= r["eval/heldout/accuracy"] <= r["eval/heldout/ci_high"]
        assert r["eval/heldout/n"] == 6
    train = [r for r in rows if "train/reward" in r]
    assert [r["step"] for r in train] == [1, 2] and all(np.isfinite(r["loss"]) for r in train)
    assert (tmp_path / "final_model" / "config.json").is_file() and (tmp_path / "curves.png").is_file()


def test_resume_ends_with_the_weights_of_an_uninterrupted_run(model_dir, tmp_path):
    run_recipe("rlvr", _args(model_dir, tmp_path / "full", 2))
    run_recipe("rlvr", _args(model_dir, tmp_path / "cut", 1))
    run_recipe("rlvr", _args(model_dir, tmp_path / "cut", 2) + ["--resume", "true"])
    a, b = saved_weights(tmp_path / "full" / "final_model"), saved_weights(tmp_path / "cut" / "final_model")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_users_jsonl_trains_and_is_evaluated(model_dir, tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text("\n".join(json.dumps({"question": f"What is {i} + 1?", "answer": i + 1}) for i in range(12)))
    run_recipe("rlvr", _args(model_dir, tmp_path / "run", 1, task=f"jsonl:{f}", heldout_size=4))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/heldout/n"] for r in rows if "eval/heldout/n" in r] == [4, 4]


@pytest.mark.parametrize("flags,words", [
    (["--task", "reasoning_gym:no_such_task"], "not registered"),
    (["--task", "jsonl:/no/such/file.jsonl"], "No such file"),
    (["--task_config", "[1]"], "task_config must be a JSON object"),
    (["--task", "arithmetic", "--task_config", '{"a": 1}'], "task_config applies"),
    (["--num_generations", "1"], "num_generations must be >= 2"),
])
def test_bad_tasks_are_one_line_before_the_model_loads(tmp_path, flags, words):
    p = subprocess.run([sys.executable, str(ROOT / "recipes/rlvr.py"), "--output_dir", str(tmp_path / "o"), *flags],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], p.stderr
    assert not (tmp_path / "o").exists()
