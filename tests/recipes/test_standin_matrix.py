"""Every recipe, with its default config and with every real-model config, runs 1-2 steps on
every stand-in of the real families (``--model_name_or_path <stand-in>``, tiny sizes); so do
``eval reasoning``, ``eval humaneval``, ``eval-game``, ``arena`` and a LoRA run.

The whole recipe x config x stand-in matrix is ``slow``; the default run keeps one stand-in per
recipe (the families rotate across recipes) plus the eval verbs and LoRA. Each run must write
metrics rows whose losses are finite, and a saved final model must keep the stand-in's own eos
(the run never swapped the model's end of turn for another token).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lmselfplay.models.standins import STANDINS, spec
from lmselfplay.utils.recipe_loader import run_recipe

CONFIGS = Path(__file__).resolve().parents[2] / "recipes" / "configs"

# Tiny sizes per recipe: every size a shipped config sets is overridden here, so a real-model
# config runs at the same reduced size as the recipe's default one.
TINY = {
    "selfplay_games": {"max_steps": 1, "episodes_per_step": 4, "eval_every": 0, "eval_games": 1,
                       "eval_positions": 2, "checkpoint_every": 0, "max_new_tokens": 8, "text_max_new_tokens": 8,
                       "readout_samples": 2, "max_turns": 4, "league_add_every": 100, "concurrency": 8,
                       "engine": "hf", "dtype": "float32", "distill_steps": 0, "num_iterations": 1,
                       "target_passes": 0},
    "search_selfplay": {"rounds": 1, "games_per_round": 2, "n_sims": 2, "distill_steps": 1, "batch_size": 4,
                        "value_steps": 1, "eval_every": 0, "tensorboard": "false", "progress": "false",
                        "dtype": "float32", "max_new_tokens": 6},
    "spin": {"spin_iterations": 1, "num_train_examples": 4, "num_eval_examples": 2, "max_completion_length": 8,
             "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "generation_batch_size": 4,
             "num_train_epochs": 1, "sft_epochs": 0, "tensorboard": "false", "progress": "false",
             "logging_steps": 1, "save_steps": 1000, "dtype": "float32"},
    "debate": {"max_steps": 1, "eval_tasks": 2, "train_tasks": 6, "debates_per_step": 2, "max_new_tokens": 6,
               "max_prompt_tokens": 240, "max_speech_chars": 200, "num_rounds": 1, "checkpoint_every": 0,
               "eval_protocols": "debate,none", "dtype": "float32", "judge_dtype": "float32"},
    "absolute_zero": {"max_steps": 1, "proposals_per_type": 2, "solve_tasks_per_type": 2, "num_generations": 2,
                      "references": 1, "seed_programs": 4, "eval_tasks_per_type": 2, "eval_every": 1,
                      "checkpoint_every": 0, "propose_max_new_tokens": 16, "solve_max_new_tokens": 12,
                      "induction_inputs": 2, "max_workers": 1, "gradient_accumulation_steps": 1,
                      "dtype": "float32"},
    "r_zero": {"rounds": 1, "challenger_steps": 1, "num_questions": 4, "challenger_group_size": 4,
               "pool_size": 4, "num_answers": 10, "solver_steps": 1, "solver_batch": 2, "solver_group_size": 10,
               "heldout_size": 4, "challenger_max_new_tokens": 12, "solver_max_new_tokens": 8,
               "gradient_accumulation_steps": 1, "dtype": "float32"},
    "rlvr": {"max_steps": 1, "prompts_per_step": 2, "num_generations": 2, "heldout_size": 2, "eval_every": 0,
             "max_new_tokens": 6, "checkpoint_every": 0, "dtype": "float32"},
}

# recipe -> its default config and its real-model configs
RECIPE_CONFIGS = {
    "selfplay_games": ["selfplay_games.yaml", "selfplay_games_exact.yaml", "spiral_qwen3_base.yaml", "selfplay_taboo_real.yaml"],
    "search_selfplay": ["search_selfplay_nim.yaml"],
    "spin": ["spin.yaml", "spin_zephyr.yaml"],
    "debate": ["debate.yaml", "debate_real.yaml"],
    "absolute_zero": ["absolute_zero.yaml", "absolute_zero_qwen_coder.yaml"],
    "r_zero": ["r_zero.yaml", "r_zero_sum.yaml", "r_zero_qwen3.yaml"],
    "rlvr": ["rlvr.yaml", "rlvr_arithmetic.yaml", "rlvr_qwen.yaml"],
}

# The default run: one stand-in per recipe's default config, every family once.
DEFAULT_CELLS = {
    ("selfplay_games", "selfplay_games.yaml"): "qwen2.5-instruct",
    ("search_selfplay", "search_selfplay_nim.yaml"): "llama-3.1-instruct",
    ("spin", "spin.yaml"): "llama-3.1-base",
    ("debate", "debate.yaml"): "qwen3",
    ("absolute_zero", "absolute_zero.yaml"): "qwen2.5-coder-base",
    ("r_zero", "r_zero.yaml"): "qwen3-base",
    ("rlvr", "rlvr.yaml"): "llama-3.1-instruct",
}


# The default run's selfplay cell: no tic-tac-toe (enumerating its 4,520 positions for the metrics
# alone takes ~20 s); Nim and Kuhn poker are played, as in the main job.
DEFAULT_EXTRA = {("selfplay_games", "selfplay_games.yaml"): {"games": "nim,kuhn_poker"}}


def cell_params():
    out = []
    for recipe, configs in RECIPE_CONFIGS.items():
        for config in configs:
            for name in STANDINS:
                default = DEFAULT_CELLS.get((recipe, config)) == name
                out.append(pytest.param(recipe, config, name, id=f"{recipe}-{config[:-5]}-{name}",
                                        marks=() if default else pytest.mark.slow))
    return out


def test_the_default_run_covers_every_recipe_and_family():
    assert {r for r, _ in DEFAULT_CELLS} == set(RECIPE_CONFIGS)
    assert set(DEFAULT_CELLS.values()) == set(STANDINS)
    for (recipe, config) in DEFAULT_CELLS:
        assert config == RECIPE_CONFIGS[recipe][0]
    shipped = {p.name for p in CONFIGS.glob("*.yaml")}
    real = {p.name for p in CONFIGS.glob("*real*.yaml")} | {"spiral_qwen3_base.yaml", "spin_zephyr.yaml",
                                                           "absolute_zero_qwen_coder.yaml", "r_zero_qwen3.yaml",
                                                           "rlvr_qwen.yaml"}
    assert real <= shipped and real <= {c for cs in RECIPE_CONFIGS.values() for c in cs}


def tiny_dataset(folder: Path) -> Path:
    """A local ``datasets`` folder of UltraChat-style first turns (prompt + answer)."""
    from datasets import Dataset

    rows = [{"prompt": f"Say the number {i} in words.", "answer": f"The number is {i}."} for i in range(8)]
    Dataset.from_list(rows).save_to_disk(str(folder))
    return folder


def cell_args(recipe: str, config: str, name: str, model: Path, out: Path, tmp: Path) -> list[str]:
    """argv of one matrix cell: the config, the stand-in, the tiny sizes, and what this stand-in
    needs from a config written for another family (documented in each case)."""
    kw = dict(TINY[recipe])
    if DEFAULT_CELLS.get((recipe, config)) == name:
        kw.update(DEFAULT_EXTRA.get((recipe, config), {}))
    cfg_text = (CONFIGS / config).read_text()
    has_template = spec(name).chat_template is not None
    if "prompt_format: chat" in cfg_text and not has_template:
        kw["prompt_format"] = "plain"  # a chat-prompted config on a model with no template
    if name == "qwen3" and (recipe == "search_selfplay" or "feedback: exact" in cfg_text):
        kw["enable_thinking"] = "false"  # refused for a thinking policy (tests/lm/test_readout.py)
    if recipe == "debate" and "judge_model_name_or_path" in cfg_text:
        kw["judge_model_name_or_path"] = str(model)
    if config == "spin_zephyr.yaml":
        kw["dataset"] = str(tiny_dataset(tmp / "ultrachat_spin"))
    args = ["--config", str(CONFIGS / config), "--model_name_or_path", str(model), "--output_dir", str(out)]
    return args + [x for k, v in kw.items() for x in (f"--{k}", str(v))]


def metric_rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    assert path.is_file(), f"no metrics.jsonl in {out}"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_ran(out: Path, name: str) -> None:
    """Metrics rows with finite losses (policy-gradient, DPO, value or target cross-entropy); a
    saved final model keeps the stand-in's eos."""
    rows = metric_rows(out)
    losses = [v for r in rows for k, v in r.items()
              if k.split("/")[-1].endswith(("loss", "_ce")) and isinstance(v, (int, float))]
    assert losses, f"no loss in {out / 'metrics.jsonl'}"
    assert all(math.isfinite(v) for v in losses), losses
    final = out / "final_model"
    if final.is_dir():
        from transformers import AutoTokenizer

        assert AutoTokenizer.from_pretrained(final).eos_token == spec(name).eos


@pytest.mark.parametrize("recipe,config,name", cell_params())
def test_recipe_runs_on_the_standin(recipe, config, name, standin, tmp_path):
    out = tmp_path / "run"
    run_recipe(recipe, cell_args(recipe, config, name, standin(name), out, tmp_path))
    assert_ran(out, name)


def test_lora_run_on_a_standin(standin, tmp_path):
    """Self-play with LoRA adapters (PEFT) on the Qwen3-Base stand-in: trains, saves, reports."""
    out = tmp_path / "lora"
    args = cell_args("selfplay_games", "selfplay_games.yaml", "qwen3-base", standin("qwen3-base"), out, tmp_path)
    run_recipe("selfplay_games", args + ["--use_lora", "true", "--lora_r", "4", "--games", "nim", "--feedback", "sampled"])
    assert_ran(out, "qwen3-base")


def run_cli(argv: list[str]) -> int:
    from lmselfplay.cli import main

    return main(argv)


def test_eval_reasoning_on_a_thinking_standin(standin, tmp_path, capsys):
    assert run_cli(["eval", "reasoning", "--suite", "tiny", "--model", str(standin("qwen3")), "--max-new-tokens", "6",
                    "--out", str(tmp_path)]) == 0
    result = json.loads(next(tmp_path.glob("reasoning_tiny*.json")).read_text())
    assert result["max_new_tokens"] == 6 and 0.0 <= result["greedy"]["overall"]["pass@1"] <= 1.0


def test_eval_humaneval_on_a_base_code_standin(standin, tmp_path):
    assert run_cli(["eval", "humaneval", "--model", str(standin("qwen2.5-coder-base")), "--limit", "2",
                    "--max-new-tokens", "8", "--out", str(tmp_path)]) == 0
    result = json.loads(next(tmp_path.glob("humaneval*.json")).read_text())
    assert result["max_new_tokens"] == 8


def test_eval_game_reads_a_thinking_standin_by_sampling(standin, tmp_path):
    path = tmp_path / "game.json"
    assert run_cli(["eval-game", "kuhn_poker", "--model", str(standin("qwen3")), "--n-games", "2",
                    "--max-new-tokens", "8", "--readout-samples", "2", "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())
    assert row["readout"] == "sampled" and row["readout_samples"] == 2
    assert 0.0 <= row["exploitability"] and 0.0 <= row["readout_legal_rate"] <= 1.0


def test_arena_of_two_standins(standin, tmp_path):
    a, b = standin("llama-3.1-instruct"), standin("qwen2.5-instruct")
    assert run_cli(["arena", "nim", "--models", str(a), str(b), "--bots", "random", "--games", "2",
                    "--bootstrap", "5", "--max-new-tokens", "6", "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "arena_nim.json").read_text())
    assert len(out["ratings"]) == 3


def test_the_matrix_table_reads_pytests_junit_xml(tmp_path):
    """scripts/standin_matrix_table.py: one row per recipe / config, one column per stand-in;
    a later file's result for a cell replaces an earlier one; the other tests are listed."""
    import subprocess
    import sys

    def junit(path: Path, cases: str) -> Path:
        path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
        return path

    cell = "test_recipe_runs_on_the_standin[{}]"
    first = junit(tmp_path / "a.xml",
                  f'<testcase name="{cell.format("spin-spin_zephyr-qwen3")}" time="12.4"><failure message="boom\nmore"/></testcase>'
                  f'<testcase name="{cell.format("r_zero-r_zero-llama-3.1-base")}" time="3.0">'
                  '<skipped message="no gpu"/></testcase>'
                  '<testcase name="test_lora_run_on_a_standin" time="9.0"/>')
    rerun = junit(tmp_path / "b.xml", f'<testcase name="{cell.format("spin-spin_zephyr-qwen3")}" time="20.6"/>')
    script = Path(__file__).resolve().parents[2] / "scripts" / "standin_matrix_table.py"
    proc = subprocess.run([sys.executable, str(script), str(first), str(rerun), "--out", str(tmp_path / "m")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = (tmp_path / "m.md").read_text()
    names = list(STANDINS)
    spin_row = next(line for line in table.splitlines() if line.startswith("| spin | spin_zephyr.yaml |"))
    assert spin_row.split(" | ")[2 + names.index("qwen3")] == "pass 21 s"
    r_zero_row = next(line for line in table.splitlines() if line.startswith("| r_zero | r_zero.yaml |"))
    assert r_zero_row.split(" | ")[2 + names.index("llama-3.1-base")] == "skip 3 s (no gpu)"
    assert "| test_lora_run_on_a_standin | pass 9 s |" in table
    records = json.loads((tmp_path / "m.json").read_text())
    assert {(r.get("recipe"), r["outcome"]) for r in records} == {("spin", "pass"), ("r_zero", "skip"), (None, "pass")}
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "missing.xml")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "cannot read junit xml" in bad.stderr and "Traceback" not in bad.stderr
