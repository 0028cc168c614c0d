"""Absolute Zero: code-task parsing, validation and checking in the executor, the rewards,
TRR++, buffers, hostile proposals through the algorithm's own step, exact resume, and the
full loop on a tiny model."""

from __future__ import annotations

import json
import os
import random
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from absolute_zero_fakes import patch_make_engine, prompt_text, proposing_engine
from fake_engine import ScriptedEngine
from lm_fixtures import saved_weights

from lmselfplay.absolute_zero.config import AbsoluteZeroConfigs
from lmselfplay.absolute_zero.metrics import heldout_tasks
from lmselfplay.absolute_zero.steps import (
    SharedReferee,
    proposer_reward,
    rollout_plan,
    seed_buffers,
    train_step,
)
from lmselfplay.rl.advantages import task_type_advantages
from lmselfplay.rl.overlap import rollouts_for
from lmselfplay.rl.rewards import proposer_rewards
from lmselfplay.utils.recipe_loader import run_recipe
from lmselfplay.verifiers.code_tasks import (
    TASK_TYPES,
    CodeReferee,
    CodeTask,
    Proposal,
    TaskBuffer,
    diversity,
    normalized_program,
    parse_answer,
    parse_proposal,
    propose_prompt,
    seed_tasks,
    solve_prompt,
    task_key,
)
from lmselfplay.verifiers.executor import ExecutorConfig

LIMITS = ExecutorConfig(timeout_s=1.0, cpu_s=1, memory_mb=512, max_output_bytes=4096, max_workers=2)


@pytest.fixture(scope="module")
def referee():
    with CodeReferee(LIMITS) as r:
        yield r


def _valid(referee, tt, program, inputs, message=""):
    v = referee.validate([(tt, Proposal(program, inputs, message))])[0]
    assert v.valid, v.reason
    return v.task


# --- parsing ----------------------------------------------------------------------------

def test_the_old_module_path_is_one_line_naming_the_package():
    import importlib
    import sys

    sys.modules.pop("lmselfplay.rl.absolute_zero", None)
    with pytest.raises(ImportError, match="lmselfplay.absolute_zero "):
        importlib.import_module("lmselfplay.rl.absolute_zero")


def test_parse_proposal_formats_and_reasons():
    fenced = "```python\ndef f(a, b):\n    return a * b\n```\n```input\n2, 5\n```"
    p = parse_proposal(fenced, 1)
    assert p.error is None and p.program == "def f(a, b):\n    return a * b\n" and p.inputs == ["2, 5"]
    p = parse_proposal("def f(x):\n    return x + 1\ninput: 3\ninput: 'a'\nmessage: adds one", 2, True)
    assert p.error is None and p.inputs == ["3", "'a'"] and p.message == "adds one"
    reasons = {
        "just words": "no program",
        "input: 3": "no program",
        "```python\ndef f(x): return x\n```\n```python\ndef f(x): return 2\n```\ninput: 1": "two programs",
        "def f(x):\n    return x\ndef f(x):\n    return 2\ninput: 1": "two programs",
        "def g(x):\n    return x\ninput: 1": "no program",
        "def f(x):\n    return x": "no input",
        "def f(x):\n    return x\ninput: 1\ninput: 2": "2 inputs, expected 1",
        "def f(x):\n    return x\ninput: os.getcwd()": "not a literal",
        "def f(x) return x\ninput: 1": "does not parse",
        "def f(x):\n    return x\x00\ninput: 1": "does not parse",
    }
    for text, reason in reasons.items():
        p = parse_proposal(text, 1)
        assert p.error is not None and reason in p.error, (text, p.error)
    assert parse_proposal("def f(x):\n    return x\ninput: 1\ninput: 2", 2, need_message=True).error == "no message"
    assert parse_proposal(None, 1).error == "not text"


def test_io_proposal_style_takes_the_reference_inputs():
    from lmselfplay.tasks.programs import program_write_prompt

    ref = CodeTask("induction", "def f(x):\n    return x\n", ["3", "4", "5", "6"], [3, 4, 5, 6])
    assert propose_prompt("induction", [ref], 4, "io") == program_write_prompt({"input": "3", "output": "3"})
    p = parse_proposal("def f(x):\n    return x * 2", 4, given_inputs=ref.inputs)
    assert p.error is None and p.inputs == ref.inputs
    assert parse_proposal("[1, 2]", 4, given_inputs=ref.inputs).error == "no program"
    with pytest.raises(ValueError, match="proposal style"):
        propose_prompt("deduction", [ref], 1, "poem")


def test_parsers_never_raise_on_garbage():
    rng = random.Random(0)
    alphabet = "def f(x):\n    return ```python input: message: [](){}'\"\\\x00é" + "".join(map(chr, range(32, 127)))
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        parse_proposal(text, rng.randint(1, 3), rng.random() < 0.5)
        for tt in TASK_TYPES:
            parse_answer(tt, text)
    parse_answer("deduction", "[" * 100_000)  # too deep for the parser: a format error
    assert parse_answer("deduction", "9" * 5000)[1] is not None


def test_parse_answer_per_type():
    assert parse_answer("deduction", "[1, 'a']") == ([1, "a"], None)
    assert parse_answer("deduction", "```output\n{'k': 2}\n```") == ({"k": 2}, None)
    assert parse_answer("deduction", "The value is <answer>'a b'</answer>.") == ("a b", None)
    task = CodeTask("abduction", "def f(x):\n    return x\n", ["1"], [1])
    assert solve_prompt(task, answer_tags=True).startswith(solve_prompt(task) + "\n")
    assert "<answer>" in solve_prompt(task, answer_tags=True) and "<answer>" not in solve_prompt(task)
    assert parse_answer("abduction", "[3, 1], 2") == (([3, 1], 2), None)
    assert parse_answer("induction", "def f(x):\n    return x")[0] == "def f(x):\n    return x\n"
    for tt, bad in (("deduction", "f(1)"), ("deduction", ""), ("abduction", "__import__('os')"),
                    ("induction", "return 1")):
        assert parse_answer(tt, bad)[1] is not None


# --- checking answers -------------------------------------------------------------------

def test_perfect_solver_gets_one_on_every_type_and_a_wrong_one_zero(referee):
    rng = random.Random(1)
    tasks = []
    for tt in TASK_TYPES:
        for t in seed_tasks(tt, rng, 6, 4 if tt == "induction" else 1):
            tasks.append(_valid(referee, tt, t.program, t.inputs))
    perfect = {"deduction": lambda t: repr(t.outputs[0]), "abduction": lambda t: t.inputs[0],
               "induction": lambda t: t.program}
    verdicts = referee.check([(t, perfect[t.task_type](t)) for t in tasks])
    assert verdicts == [(1.0, "ok")] * len(tasks)
    wrong = {"deduction": lambda t: repr([t.outputs[0]]), "abduction": lambda t: "'no such input', 1, 2",
             "induction": lambda t: "def f(x):\n    return [x]"}
    assert all(r == 0.0 for r, _ in referee.check([(t, wrong[t.task_type](t)) for t in tasks]))


def test_abduction_any_input_that_gives_the_output_is_right(referee):
    t = _valid(referee, "abduction", "def f(x):\n    return x % 3\n", ["4"])
    assert t.outputs == [1]
    assert referee.check([(t, "7"), (t, "-2"), (t, "4"), (t, "5"), (t, "1.0")]) == \
        [(1.0, "ok"), (1.0, "ok"), (1.0, "ok"), (0.0, "ok"), (0.0, "ok")]  # 1.0 % 3 == 1.0, not 1


def test_equality_cannot_be_spoofed(referee):
    t = _valid(referee, "induction", "def f(x):\n    return x + 1\n", ["1", "2", "3", "4"])
    liar = ("class Liar:\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\n"
            "def f(x):\n    return Liar()\n")
    assert referee.check([(t, liar)]) == [(0.0, "error")]  # not a plain built-in: never compared
    sub = "class I(int):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return I(0)\n"
    assert referee.check([(t, sub)])[0][0] == 0.0
    # a proposal whose output is such an object is invalid
    v = referee.validate([("deduction", parse_proposal(liar + "input: 1", 1))])[0]
    assert not v.valid and v.status == "error"


def test_validation_rules(referee):
    cases = {
        "def f(x):\n    return sorted({'a', 'b', 'c', 'd', 'e', 'f'}, key=hash)\n": "nondeterministic",
        "def f(x):\n    import random\n    return random.random()\n": "nondeterministic",
        "def f(x):\n    return (x, x)\n": "not-json",
        "def f(x):\n    return float('nan')\n": "not-json",
        "def f(x):\n    return 1 / 0\n": "error",
        "def f(x):\n    import socket\n    return 1\n": "error",  # refused by the sandbox's audit hook
    }
    vs = referee.validate([("deduction", Proposal(code, ["1"])) for code in cases])
    assert [v.status for v in vs] == list(cases.values())
    v = referee.validate([("deduction", Proposal("def f(x):\n    return {'a': [x, None, True]}\n", ["2"]))])[0]
    assert v.valid and v.task.outputs == [{"a": [2, None, True]}]


# --- rewards and advantages ---------------------------------------------------------------

def test_learnability_reward_on_a_hand_made_table():
    outcomes = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 1]])
    r = proposer_rewards(outcomes)
    np.testing.assert_allclose(r.success_rate, [1, 0, 0.25, 0.5, 0.75])
    np.testing.assert_allclose(r.absolute_zero, [0, 0, 0.75, 0.5, 0.25])  # 0 if never solved, else 1 - r


def test_recipe_proposer_reward_rules():
    cfg = AbsoluteZeroConfigs.from_values()
    task = CodeTask("deduction", "def f(x):\n    return x\n", ["1"], [1])
    valid = type("V", (), {"valid": True, "task": task})()
    invalid = type("V", (), {"valid": False, "task": None})()
    assert proposer_reward(cfg, Proposal(error="no program"), invalid, {}) == cfg.absolute_zero.format_penalty == -1.0
    assert proposer_reward(cfg, Proposal("x", ["1"]), invalid, {}) == cfg.absolute_zero.invalid_penalty == -0.5
    assert proposer_reward(cfg, Proposal("x", ["1"]), valid, {id(task): 0.25}) == 0.25


def test_trr_plus_plus_six_baselines_on_a_hand_made_table():
    keys = (["deduction/propose"] * 2 + ["deduction/solve"] * 3 + ["abduction/propose"]
            + ["abduction/solve"] * 2 + ["induction/propose"] * 2 + ["induction/solve"] * 2)
    rewards = [1, 0, 1, 1, -1, 0.5, 1, 1, -1, 0.5, 0, 0]
    adv = task_type_advantages(keys, rewards)
    s = (1 / 3) ** 0.5 * 2 ** 0.5 * 2 / 3 ** 0.5  # std of (1, 1, -1) = sqrt(8/9)
    expected = [1, -1, (2 / 3) / s, (2 / 3) / s, -(4 / 3) / s, 0, 0, 0, -1, 1, 0, 0]
    np.testing.assert_allclose(adv, expected, atol=1e-5)
    # the same reward means different things in different buckets: no bucket leaks into another
    alone = task_type_advantages(keys[2:5], rewards[2:5])
    np.testing.assert_allclose(adv[2:5], alone)


# --- buffers ------------------------------------------------------------------------------

def test_buffer_dedup_by_normalized_ast_and_roundtrip():
    a = CodeTask("deduction", "def f(x):\n    y = x + 1  # one more\n    return y\n", ["1"], [2])
    b = CodeTask("deduction", 'def f(n):\n    """doc"""\n    total = n + 1\n    return total\n', ["1"], [2])
    c = CodeTask("deduction", "def f(x):\n    y = x + 1\n    return y\n", ["2"], [3])
    d = CodeTask("deduction", "def f(x):\n    y = x - 1\n    return y\n", ["1"], [0])
    assert normalized_program(a.program) == normalized_program(b.program)
    assert normalized_program(a.program) != normalized_program(d.program)
    buf = TaskBuffer("deduction", forbidden={task_key(d)})
    assert [buf.add(t) for t in (a, b, c, d)] == [True, False, True, False]
    assert len(buf) == 2 and buf.add(CodeTask("deduction", a.program, [" 1 "], [2])) is False
    again = TaskBuffer("deduction")
    again.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert again.state_dict() == buf.state_dict()
    assert buf.sample(random.Random(0), 5, exclude=[a]) == [c]
    div = diversity([a.program, b.program, d.program])
    assert div["distinct_ast"] == pytest.approx(2 / 3) and 0 < div["edit_distance"] < 1


# --- hostile proposals through the algorithm's own step ----------------------------------------

def _descendants(root: int) -> set[int]:
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
    out, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


def _perfect_solver(buffers):
    """Answers a solve prompt with the right answer of the buffer task it shows."""
    def answer(prompt):
        for buf in buffers.values():
            for t in buf.tasks:
                if solve_prompt(t) == prompt:
                    return {"deduction": repr(t.outputs[0]) if t.outputs else "",
                            "abduction": t.inputs[0], "induction": t.program}[t.task_type]
        return "?"
    return answer


def _step_setup(model_dir, tmp_path, **kw):
    from lmselfplay.models.policy import load_policy
    from lmselfplay.rl.trainer import PolicyTrainer

    args = ["--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path / "run"),
            "--seed_programs", "3", "--references", "1", "--num_generations", "2"]
    for k, v in kw.items():
        args += [f"--{k}", str(v)]
    cfg = AbsoluteZeroConfigs.parse(args)
    model, tok = load_policy(cfg.policy, device="cpu")
    return cfg, PolicyTrainer(model, tok, cfg.trainer, total_steps=cfg.absolute_zero.max_steps), tok


def test_hostile_proposals_are_invalid_counted_and_harmless(model_dir, tmp_path):
    canary = Path("/tmp") / f"azero-canary-{uuid.uuid4().hex}"
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    hostile = [
        ("no words of code at all", "format"),
        ("```python\ndef f(x): return x\n```\n```python\ndef f(x): return 1\n```\n```input\n1\n```", "format"),
        ("def f(x):\n    print('y' * 10**7)\n    return x\ninput: 1", "output-limit"),
        ("def f(x):\n    import os\n    os.fork()\n    return x\ninput: 1", "error"),
        ("def f(x):\n    import subprocess\n    subprocess.run(['sleep', '60'])\n    return x\ninput: 1", "error"),
        ("def f(x):\n    import time\n    time.sleep(60)\n    return x\ninput: 1", "timeout"),
        (f"def f(x):\n    return open({str(secret)!r}).read()\ninput: 1", "error"),
        (f"def f(x):\n    open({str(canary)!r}, 'w').write('x')\n    return x\ninput: 1", "error"),
        (f"def f(x):\n    open({str(tmp_path / 'out.txt')!r}, 'w').write('x')\n    return x\ninput: 1", "error"),
        ("def f(x):\n    class E:\n        def __eq__(s, o):\n            return True\n    return E()\ninput: 1",
         "error"),
        ("def f(x):\n    x = [0] * 10**9\n    return 1\ninput: 1", "memory"),
        ("def f(x):\n    return x * 2\ninput: 21", "ok"),  # one honest proposal
    ]
    cfg, trainer, tok = _step_setup(model_dir, tmp_path, proposals_per_type=len(hostile),
                                    solve_tasks_per_type=2)
    procs_before = _descendants(os.getpid())
    referee = CodeReferee(cfg.executor)
    try:
        buffers = seed_buffers(cfg, referee, set())
        solver = _perfect_solver(buffers)
        n_ded = 0

        def answer(decoded):
            nonlocal n_ded
            prompt = prompt_text(decoded)
            if prompt.startswith("Propose"):
                if "predict the output" in prompt:  # deduction proposals: the hostile list
                    n_ded += 1
                    return hostile[(n_ded - 1) % len(hostile)][0]
                return "nothing"
            return solver(prompt)

        engine = ScriptedEngine(tok, answer)
        before = {tt: len(b) for tt, b in buffers.items()}
        rollouts = rollouts_for(cfg.overlap.max_staleness, trainer, engine,
                                       rollout_plan(cfg, trainer.accelerator, engine, tok, referee, buffers))
        row = train_step(cfg, trainer.accelerator, trainer, engine, rollouts.next(0), rollouts, 0, tmp_path / "run")
    finally:
        referee.close()
    # every hostile proposal ended invalid, with its status counted
    want = {}
    for _, status in hostile:
        want[status] = want.get(status, 0) + 1
    want["format"] += 2 * len(hostile)  # abduction and induction proposers said "nothing"
    for status, n in want.items():
        assert row[f"validate/{status}"] == n, (status, row)
    assert row["propose/deduction/valid_rate"] == pytest.approx(1 / len(hostile))
    assert len(buffers["deduction"]) == before["deduction"] + 1 and row["propose/new_in_buffer"] == 1
    # the step never waited on a stuck program longer than its limit (sleep 60 / subprocess)
    assert row["time/step_s"] < 30
    # nothing escaped: no file outside the sandbox, no stray process
    assert not canary.exists() and not (tmp_path / "out.txt").exists()
    assert secret.read_text() == "host secret"
    assert _descendants(os.getpid()) <= procs_before
    # the perfect solver got reward 1 on every type, the proposer datasets carry the statuses
    from datasets import load_from_disk

    answers = load_from_disk(str(tmp_path / "run" / "data" / "step-00001" / "answers"))
    assert set(answers["task_type"]) == set(TASK_TYPES) and set(answers["reward"]) == {1.0}
    assert set(answers["policy_version"]) == {0}
    props = load_from_disk(str(tmp_path / "run" / "data" / "step-00001" / "proposals"))
    assert sorted(s for s, t in zip(props["status"], props["task_type"]) if t == "deduction") == \
        sorted(s for _, s in hostile)
    # a solved-every-time task teaches the proposer nothing: learnability 0
    assert row["solve/solve_rate"] == 1.0
    ok = [r for r, s, t in zip(props["reward"], props["status"], props["task_type"]) if s == "ok"]
    assert ok == [0.0]


# --- the loop ---------------------------------------------------------------------------

def _args(model_dir, out, steps, **kw):
    base = {"model_name_or_path": str(model_dir), "output_dir": str(out), "max_steps": steps,
            "proposals_per_type": 2, "solve_tasks_per_type": 2, "num_generations": 2, "references": 1,
            "seed_programs": 4, "eval_tasks_per_type": 5, "eval_every": 1, "checkpoint_every": 1,
            "propose_max_new_tokens": 16, "solve_max_new_tokens": 12, "learning_rate": 1e-3}
    base.update(kw)
    return [x for k, v in base.items() for x in (f"--{k}", str(v))]


@pytest.mark.slow  # ~16 s; the documented absolute_zero command runs the loop by default
def test_full_loop_two_steps_on_a_tiny_model(model_dir, tmp_path):
    procs_before = _descendants(os.getpid())
    run_recipe("absolute_zero", _args(model_dir, tmp_path, 2))
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["validate/format"] + sum(r[f"validate/{s}"] for s in
                                          ("ok", "error", "timeout", "memory", "output-limit", "killed",
                                           "nondeterministic", "not-json")) == 6
        assert abs(r["time/generation_share"] + r["time/executor_share"] + r["time/train_share"] - 1) < 1e-6
        for tt in TASK_TYPES:
            assert r[f"buffer/{tt}/size"] >= 4  # identity + generated seeds, validated
    evals = [r for r in rows if "heldout/deduction/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert all(r["heldout/deduction/ci_low"] <= r["heldout/deduction/accuracy"] <= r["heldout/deduction/ci_high"]
               for r in evals)
    assert (tmp_path / "curves.png").exists() and (tmp_path / "final_model").is_dir()
    assert (tmp_path / "data" / "step-00002" / "answers").is_dir()
    assert _descendants(os.getpid()) <= procs_before  # the run's sandboxes are gone


def test_resume_is_exact_with_buffers(model_dir, tmp_path, monkeypatch):
    patch_make_engine(monkeypatch, lambda cfg, model, tok, **run: proposing_engine(tok))
    kw = dict(eval_every=0, save_datasets="false")
    run_recipe("absolute_zero", _args(model_dir, tmp_path / "full", 2, **kw))
    run_recipe("absolute_zero", _args(model_dir, tmp_path / "cut", 1, **kw))  # "killed" after step 1
    run_recipe("absolute_zero", _args(model_dir, tmp_path / "cut", 2, **kw) + ["--resume", "true"])
    a, b = saved_weights(tmp_path / "full" / "final_model"), saved_weights(tmp_path / "cut" / "final_model")
    assert all(torch.equal(a[k], b[k]) for k in a)
    full = torch.load(tmp_path / "full" / "checkpoint-2" / "lmselfplay_state.pt", weights_only=False)["extra"]
    cut = torch.load(tmp_path / "cut" / "checkpoint-2" / "lmselfplay_state.pt", weights_only=False)["extra"]
    assert full["buffers"] == cut["buffers"]
    assert len(full["buffers"]) == 1  # one buffer set per rank
    assert all(len(full["buffers"][0][tt]) > 5 for tt in TASK_TYPES)  # proposals entered the buffers
    init = saved_weights(model_dir)
    assert any(not torch.equal(init[k], a[k]) for k in a)
    rows = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]


def test_bad_config_is_rejected(model_dir, tmp_path):
    from lmselfplay.utils.config import ConfigError

    with pytest.raises(ConfigError, match="proposal_style"):
        run_recipe("absolute_zero", _args(model_dir, tmp_path, 1, proposal_style="poem"))
    with pytest.raises(ConfigError, match="num_generatons"):
        run_recipe("absolute_zero", _args(model_dir, tmp_path, 1) + ["--num_generatons", "2"])


def test_shipped_configs_parse():
    root = Path(__file__).resolve().parents[2] / "recipes" / "configs"
    tiny = AbsoluteZeroConfigs.parse(["--config", str(root / "absolute_zero.yaml")])
    assert tiny.policy.model_name_or_path is None and tiny.absolute_zero.proposal_style == "io"
    assert tiny.absolute_zero.eval_tasks_per_type == 200
    real = AbsoluteZeroConfigs.parse(["--config", str(root / "absolute_zero_qwen_coder.yaml")])
    assert real.policy.model_name_or_path.startswith("Qwen/") and real.absolute_zero.proposal_style == "paper"
    assert real.absolute_zero.answer_tags


def test_heldout_set_is_fixed_and_never_in_the_buffers(referee):
    cfg = AbsoluteZeroConfigs.from_values(eval_tasks_per_type=20, seed_programs=20)
    held = heldout_tasks(cfg, referee)
    again = heldout_tasks(cfg, referee)
    assert all(len(held[tt]) == 20 for tt in TASK_TYPES)
    assert [t.to_dict() for tt in TASK_TYPES for t in held[tt]] == [t.to_dict() for tt in TASK_TYPES for t in again[tt]]
    forbidden = {task_key(t) for ts in held.values() for t in ts}
    buffers = seed_buffers(cfg, referee, forbidden)
    assert not any(task_key(t) in forbidden for b in buffers.values() for t in b.tasks)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_recipe_under_accelerate_launch(model_dir, tmp_path):
    """Two DDP ranks: each proposes, validates and solves its own tasks with its own
    sandboxes; the checkpoint keeps one buffer set per rank."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(root / "recipes" / "accelerate" / "ddp_cpu.yaml"), str(root / "recipes" / "absolute_zero.py"),
           *_args(model_dir, tmp_path / "run", 2, eval_every=0, checkpoint_every=2)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=500)
    assert res.returncode == 0, res.stderr[-3000:]
    extra = torch.load(tmp_path / "run" / "checkpoint-2" / "lmselfplay_state.pt", weights_only=False)["extra"]
    assert len(extra["buffers"]) == 2 and all(set(b) == set(TASK_TYPES) for b in extra["buffers"])
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    assert (tmp_path / "run" / "final_model").is_dir()


def test_the_shared_referee_counts_each_threads_programs_apart():
    """With overlap the next step's rollout checks programs in its thread while an evaluation
    checks in the loop's: each must count only its own (the step's executor metrics)."""
    import threading

    class Counting:
        seconds, programs_run = 0.0, 0

        def check(self, items):
            self.seconds += 1.0
            self.programs_run += len(items)
            return items

        validate = check

    shared = SharedReferee(Counting())
    seen = {}

    def rollout():
        shared.validate([1, 2, 3])
        seen["rollout"] = (shared.seconds, shared.programs_run)

    shared.check([1])  # the evaluation, in the loop's thread
    worker = threading.Thread(target=rollout)
    worker.start()
    worker.join()
    shared.check([1, 2])
    assert seen["rollout"] == (1.0, 3) and (shared.seconds, shared.programs_run) == (2.0, 3)
