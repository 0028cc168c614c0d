"""The SPIN recipe: 2 iterations end to end on a tiny model, the iteration data sets
hold exactly what was generated, token-level prompt identity between generation and
DPOTrainer, resume (between and inside iterations), a 2-process CPU run through accelerate."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from lm_fixtures import save_tiny, tiny_model, tiny_tokenizer

from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.lm.prompt import encode_completion, encode_prompt
from lmselfplay.spin.config import SpinConfigs, beta_at, dpo_losses
from lmselfplay.spin.data import SpinDataError, answers_match, gsm8k_final, load_supervised
from lmselfplay.spin.held_out import mean_ci_half_width, summarize
from lmselfplay.spin.pairs import tokenize_pairs
from lmselfplay.spin.trainers import IDS, pretokenized_dpo_trainer
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.metrics_logger import read_jsonl
from lmselfplay.utils.recipe_loader import run_recipe

ROOT = Path(__file__).resolve().parents[2]
N_TRAIN, N_EVAL, GEN_LEN = 12, 4, 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny_spin_model"), seed=0)


def fast_args(model_dir, out, iterations=2, *extra):
    return ["--model_name_or_path", str(model_dir), "--output_dir", str(out),
            "--spin_iterations", str(iterations), "--num_train_examples", str(N_TRAIN),
            "--num_eval_examples", str(N_EVAL), "--max_completion_length", str(GEN_LEN),
            "--per_device_train_batch_size", "4", "--num_train_epochs", "1",
            "--learning_rate", "1e-3", "--warmup_steps", "0", "--generation_batch_size", "8",
            "--logging_steps", "1", "--tensorboard", "false", "--progress", "false", *extra]


def _recording(generate, calls):
    """``generate`` that also appends each sampled (temperature > 0) call's prompts and answers."""

    def wrapped(self, prompts, sampling):
        out = generate(self, prompts, sampling)
        if sampling.temperature > 0:
            calls.append(([list(p) for p in prompts], out))
        return out

    return wrapped


@pytest.fixture
def recorder(monkeypatch):
    """Every sampled (temperature > 0) generate call: the opponent's prompts and answers."""
    calls: list[tuple[list[list[int]], list]] = []
    monkeypatch.setattr(HFEngine, "generate", _recording(HFEngine.generate, calls))
    return calls


def load_iteration(out: Path, t: int):
    return datasets.load_from_disk(str(out / f"iter-{t}" / "data" / "ds"))


def flat(calls):
    prompts = [p for ps, _ in calls for p in ps]
    comps = [c for _, cs in calls for c in cs]
    return prompts, comps


@pytest.fixture(scope="module")
def two_iterations(model_dir, tmp_path_factory):
    """One shared 2-iteration run; the generate calls are recorded without monkeypatch
    (module scope), by wrapping and restoring the class attribute by hand."""
    out = tmp_path_factory.mktemp("spin_run") / "run"
    calls: list = []
    original = HFEngine.generate
    HFEngine.generate = _recording(original, calls)
    try:
        summary = run_recipe("spin", fast_args(model_dir, out))
    finally:
        HFEngine.generate = original
    return out, summary, calls


# --- data ----------------------------------------------------------------------------------

def test_extract_final_is_gsm8k_style_and_never_raises():
    assert gsm8k_final("3 + 4 = 7\n#### 7") == "7"
    assert gsm8k_final("#### 1\nwait\n#### 1,024.") == "1024"  # the last marker counts
    assert gsm8k_final("no marker 7") is None
    assert gsm8k_final("####   ") is None
    assert gsm8k_final(None) is None  # hostile input
    assert answers_match("x\n#### 12", "12 = 12\n#### 12", "12")
    assert not answers_match("#### 13", "#### 12", "12")
    assert answers_match(" yes ", "yes", None) and not answers_match("no", "yes", None)


def test_generated_set_is_deterministic_and_held_out_is_disjoint():
    train, held = load_supervised(None, 40, 10, seed=3)
    train2, held2 = load_supervised(None, 40, 10, seed=3)
    assert (train, held) == (train2, held2) and len(train) == 40 and len(held) == 10
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    for r in train + held:
        assert gsm8k_final(r["answer"]) == r["final"]
        assert r["prompt"].startswith("Solve the problem.")


def test_local_files_in_every_layout(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": f"w{i}\n#### {i}"} for i in range(6)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    train, held = load_supervised(str(tmp_path / "a.jsonl"), 0, 2, seed=0)
    assert len(train) == 4 and len(held) == 2
    assert {r["prompt"] for r in train + held} == {r["prompt"] for r in rows}
    assert all(r["final"] == r["prompt"][1:] for r in train + held)

    chat = [{"messages": [{"role": "user", "content": r["prompt"]},
                          {"role": "assistant", "content": r["answer"]}]} for r in rows]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    train_c, held_c = load_supervised(str(tmp_path / "c.jsonl"), 0, 2, seed=0)
    assert (train_c, held_c) == (train, held)

    gsm = datasets.Dataset.from_list([{"question": r["prompt"], "answer": r["answer"]} for r in rows])
    gsm.to_parquet(str(tmp_path / "g.parquet"))
    assert load_supervised(str(tmp_path / "g.parquet"), 0, 2, seed=0) == (train, held)
    gsm.save_to_disk(str(tmp_path / "saved"))
    assert load_supervised(str(tmp_path / "saved"), 3, 2, seed=0) == (train[:3], held)


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "q", "reply": "a"}\n', "needs columns"),
    ('{"prompt": "q", "answer": ""}\n{"prompt": "r", "answer": "b"}\n', "row"),
    ('{"prompt": "q", "answer": "a"\n', "cannot read"),
    ('{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]}\n', "roles"),
])
def test_bad_files_give_clear_errors(tmp_path, content, message):
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(SpinDataError, match=message):
        load_supervised(str(tmp_path / "bad.jsonl"), 0, 1)


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(SpinDataError, match="not found"):
        load_supervised(str(tmp_path / "nope.jsonl"), 0, 1)
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(SpinDataError, match="unsupported"):
        load_supervised(str(tmp_path / "x.txt"), 0, 1)


def test_tokenize_pairs_is_the_one_formatter_and_counts_the_answers_it_cuts():
    tok = tiny_tokenizer()
    rows = [{"prompt": "take 1", "answer": "1"}, {"prompt": "take 2", "answer": "1 2 3 1 2 3 1 2 3"}]
    prompts, chosen, cut = tokenize_pairs(tok, rows, None)
    assert prompts == [encode_prompt(tok, r["prompt"]) for r in rows]
    assert chosen == [encode_completion(tok, r["answer"]) for r in rows] and cut == 0
    n = len(chosen[0])
    assert len(chosen[1]) > n
    _, short, cut = tokenize_pairs(tok, rows, n)
    assert short == [chosen[0], chosen[1][:n]] and cut == 1  # cut answers keep no EOS


# --- config ----------------------------------------------------------------------------------

def test_default_config_file_parses_and_bad_keys_are_named(tmp_path):
    cfg = SpinConfigs.parse(["--config", str(ROOT / "recipes/configs/spin.yaml")])
    assert cfg.policy.model_name_or_path is None and cfg.spin.dataset is None  # embedded model, own data
    assert cfg.spin.spin_iterations >= 2 and all(b > 0 for b in cfg.spin.beta_per_iteration)
    (tmp_path / "bad.yaml").write_text("spin_iterations: 2\nlamda: 0.1\n")
    with pytest.raises(ConfigError, match="lamda"):
        SpinConfigs.parse(["--config", str(tmp_path / "bad.yaml")])
    cfg = SpinConfigs.parse(["--beta_per_iteration", "0.1", "0.1", "5.0"])
    assert [beta_at(cfg, t) for t in range(5)] == [0.1, 0.1, 5.0, 5.0, 5.0]
    with pytest.raises(ConfigError, match="positive"):
        run_recipe("spin", ["--beta_per_iteration", "-1", "--output_dir", str(tmp_path / "o")])


def test_rpo_alpha_adds_the_nll_on_the_data_answer_to_the_dpo_loss():
    assert dpo_losses(SpinConfigs.parse([])) == {"loss_type": ["sigmoid"]}
    cfg = SpinConfigs.parse(["--rpo_alpha", "0.5"])
    assert dpo_losses(cfg) == {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]}
    from trl import DPOConfig

    DPOConfig(output_dir="unused", use_cpu=True, bf16=False, **dpo_losses(cfg))  # TRL accepts it
    with pytest.raises(ConfigError, match="rpo_alpha"):
        dpo_losses(SpinConfigs.parse(["--rpo_alpha", "-1"]))


def test_mean_ci_half_width_is_the_normal_interval():
    xs = [1.0, 2.0, 3.0, 4.0]  # sample sd 1.291: half-width 1.96 * 1.291 / 2
    assert mean_ci_half_width(xs) == pytest.approx(1.96 * math.sqrt(5 / 3) / 2)
    assert math.isnan(mean_ci_half_width([1.0]))


# --- the recipe end to end ------------------------------------------------------------------

def test_two_iterations_end_to_end(two_iterations, model_dir):
    out, summary, _ = two_iterations
    assert [it["iteration"] for it in summary["iterations"]] == [1, 2]
    for k in (1, 2):
        assert (out / f"checkpoint-{k}" / "COMPLETE").exists()
        assert json.loads((out / f"checkpoint-{k}" / "spin_state.json").read_text())["iteration"] == k
        assert not (out / f"iter-{k - 1}" / "trainer").exists()  # mid-iteration state cleaned up
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        for key in ("eval/margin", "eval/answer_loglik", "eval/accuracy"):
            assert math.isfinite(r[key])
        assert 0.0 <= r["eval/accuracy_ci_low"] <= r["eval/accuracy"] <= r["eval/accuracy_ci_high"] <= 1.0
        assert r["eval/answer_loglik_ci"] > 0
    assert rows[1]["beta"] == 0.1 and rows[1]["train/steps"] == N_TRAIN // 4
    assert (out / "spin_metrics.png").stat().st_size > 1000

    # theta_1 != theta_0: DPO moved the weights; theta_2 != theta_1.
    from transformers import AutoModelForCausalLM

    w = [dict(AutoModelForCausalLM.from_pretrained(p).named_parameters())
         for p in (model_dir, out / "checkpoint-1", out / "checkpoint-2")]
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(w[0][name], w[1][name]) and not torch.equal(w[1][name], w[2][name])
    # DPO raised the data answers' likelihood on held-out prompts relative to theta_0.
    assert rows[2]["eval/answer_loglik"] > rows[0]["eval/answer_loglik"]


def test_per_prompt_scores_are_saved_and_summarize_to_the_logged_metrics(two_iterations):
    out, _, _ = two_iterations
    data = load_iteration(out, 0)["eval"]
    for row in read_jsonl(out / "metrics.jsonl"):
        scores = read_jsonl(out / "eval" / f"step-{row['step']}.jsonl")
        assert len(scores) == N_EVAL
        for s in scores:
            assert s["loglik"] < 0 and s["loglik_rejected"] < 0 and isinstance(s["correct"], bool)
        assert [s["answer_tokens"] for s in scores] == [len(c) for c in data["chosen_ids"]]
        again = summarize(scores)
        for key, value in again.items():
            assert row[key] == pytest.approx(value), key


def test_iteration_data_sets_hold_exactly_what_was_generated(two_iterations, model_dir):
    out, _, calls = two_iterations
    tok = tiny_tokenizer()
    prompts, comps = flat(calls)
    per_iter = N_TRAIN + N_EVAL
    assert len(prompts) == 2 * per_iter  # one y' per train and held-out prompt, per iteration
    generators = [str(model_dir), str(out / "checkpoint-1")]
    for t in range(2):
        ds = load_iteration(out, t)
        saved = ds["train"].to_list() + ds["eval"].to_list()
        assert len(saved) == per_iter
        for row, p, c in zip(saved, prompts[t * per_iter:], comps[t * per_iter:]):
            assert row["prompt_ids"] == p  # the prompt generation was conditioned on
            assert row["rejected_ids"] == c.token_ids  # the sampled tokens, not re-tokenized text
            assert row["rejected"] == c.text and row["finish_reason"] == c.finish_reason
            assert row["iteration"] == t and row["generator"] == generators[t]
            assert row["chosen_ids"] == encode_completion(tok, row["chosen"])[:GEN_LEN]
            assert len(row["rejected_ids"]) <= GEN_LEN  # generation length = training length


def test_prompts_tokenize_identically_in_generation_and_dpo(two_iterations):
    """Token level: what DPOTrainer's collator feeds the model = what generation saw."""
    out, _, _ = two_iterations
    tok = tiny_tokenizer()
    ds = load_iteration(out, 1)["train"]
    for row in ds:
        assert row["prompt_ids"] == encode_prompt(tok, row["prompt"])
    from trl import DPOConfig

    model = tiny_model()
    trainer = pretokenized_dpo_trainer()(
        model=model, ref_model=tiny_model(), processing_class=tok,
        train_dataset=ds.select_columns(list(IDS)),
        args=DPOConfig(output_dir=str(out / "probe"), use_cpu=True, bf16=False, report_to="none",
                       max_length=None, gradient_checkpointing=False))
    rows = [trainer.train_dataset[i] for i in range(4)]
    batch = trainer.data_collator(rows)
    ids, cmask = batch["input_ids"], batch["completion_mask"]
    for r, row in enumerate(ds.select(range(4))):
        p = row["prompt_ids"]
        for half, completion in ((r, row["chosen_ids"]), (r + 4, row["rejected_ids"])):
            n = len(p) + len(completion)
            assert ids[half, : len(p)].tolist() == p
            assert ids[half, len(p) : n].tolist() == completion
            assert cmask[half, :n].tolist() == [0] * len(p) + [1] * len(completion)
            assert cmask[half, n:].sum() == 0


def test_resume_starts_at_the_next_iteration(model_dir, tmp_path, recorder):
    out = tmp_path / "run"
    run_recipe("spin", fast_args(model_dir, out, 1))
    first_rows = read_jsonl(out / "metrics.jsonl")
    marker = (out / "iter-0" / "data" / "COMPLETE").stat().st_mtime_ns
    with pytest.raises(ConfigError, match="--resume"):
        run_recipe("spin", fast_args(model_dir, out, 2))
    recorder.clear()
    summary = run_recipe("spin", fast_args(model_dir, out, 2, "--resume"))
    assert [it["iteration"] for it in summary["iterations"]] == [2]
    prompts, _ = flat(recorder)
    assert len(prompts) == N_TRAIN + N_EVAL  # only iteration 1 generated: iteration 0 not redone
    assert (out / "iter-0" / "data" / "COMPLETE").stat().st_mtime_ns == marker
    assert load_iteration(out, 1)["train"][0]["generator"] == str(out / "checkpoint-1")
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[:2] == first_rows
    assert run_recipe("spin", fast_args(model_dir, out, 2, "--resume"))["iterations"] == []  # all done


def test_resume_inside_an_iteration_continues_at_the_saved_step(model_dir, tmp_path, monkeypatch):
    args = ["--save_steps", "1"]
    whole = tmp_path / "whole"
    run_recipe("spin", fast_args(model_dir, whole, 1, *args))

    killed = tmp_path / "killed"
    steps = {"n": 0}
    original = pretokenized_dpo_trainer().training_step

    def dies_at_step_3(self, *a, **k):
        steps["n"] += 1
        if steps["n"] == 3:
            raise KeyboardInterrupt("killed")
        return original(self, *a, **k)

    monkeypatch.setattr(pretokenized_dpo_trainer(), "training_step", dies_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        run_recipe("spin", fast_args(model_dir, killed, 1, *args))
    assert (killed / "iter-0" / "trainer" / "checkpoint-2").is_dir()
    assert not (killed / "checkpoint-1").exists()
    monkeypatch.setattr(pretokenized_dpo_trainer(), "training_step", original)
    counted = {"n": 0}

    def counting(self, *a, **k):
        counted["n"] += 1
        return original(self, *a, **k)

    monkeypatch.setattr(pretokenized_dpo_trainer(), "training_step", counting)
    summary = run_recipe("spin", fast_args(model_dir, killed, 1, "--resume", *args))
    assert counted["n"] == N_TRAIN // 4 - 2  # only the step that was lost
    assert summary["iterations"][0]["train/steps"] == N_TRAIN // 4
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(whole / "checkpoint-1").state_dict()
    b = AutoModelForCausalLM.from_pretrained(killed / "checkpoint-1").state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)


@pytest.mark.multiprocess  # ~25 s: 2 gloo processes
@pytest.mark.slow
def test_two_processes_on_cpu_through_accelerate(model_dir, tmp_path):
    out = tmp_path / "ddp"
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", "0", str(ROOT / "recipes" / "spin.py"),
           *fast_args(model_dir, out, 2)]
    res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]  # one writer: the main process
    # 12 pairs over 2 processes x batch 4 -> 2 optimizer steps (data parallel, not 3 alone)
    assert rows[1]["train/steps"] == math.ceil(N_TRAIN / 8)
    tok = tiny_tokenizer()
    for t in range(2):
        ds = load_iteration(out, t)
        saved = ds["train"].to_list() + ds["eval"].to_list()
        assert len(saved) == N_TRAIN + N_EVAL  # both processes' shares, gathered in order
        for row in saved:
            assert row["prompt_ids"] == encode_prompt(tok, row["prompt"])
            assert 0 < len(row["rejected_ids"]) <= GEN_LEN
    assert (out / "checkpoint-2" / "COMPLETE").exists()


@pytest.mark.slow  # ~15 s of CPU: an optional path; the required ones above stay in the fast suite
def test_sft_phase_then_lora_iteration(model_dir, tmp_path, recorder):
    """No SFT model given: a short SFT phase makes theta_0 (checkpoint-0), which generates
    iteration 0; with LoRA the reference is the adapter-free theta_0 and theta_1 is merged."""
    out = tmp_path / "run"
    run_recipe("spin", fast_args(model_dir, out, 1, "--sft_epochs", "1", "--sft_learning_rate", "1e-2",
                                 "--use_lora", "--lora_r", "4"))
    assert (out / "checkpoint-0" / "COMPLETE").exists() and not (out / "sft").exists()
    ds = load_iteration(out, 0)["train"]
    assert set(ds["generator"]) == {str(out / "checkpoint-0")}
    from transformers import AutoModelForCausalLM

    w0, ws, w1 = (AutoModelForCausalLM.from_pretrained(p).state_dict()
                  for p in (model_dir, out / "checkpoint-0", out / "checkpoint-1"))
    assert not any("lora" in k for k in w1)  # a plain, merged model
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(w0[name], ws[name]) and not torch.equal(ws[name], w1[name])
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["train/steps"] == N_TRAIN // 4
