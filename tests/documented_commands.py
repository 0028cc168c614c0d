"""Every command README.md and docs/*.md tell a user to type, and how CI runs it at reduced size.

``tests/project/test_documented_commands.py`` extracts the commands from the docs (:func:`documented_commands`)
and fails naming any that is missing here, then runs each entry as a subprocess from the repository
root and checks its exit code, the files it must write and its output.

An entry's ``documented`` text is the command as the docs write it, normalised (continuation lines
joined, the ``# comment`` dropped, spaces collapsed, ``a && b`` split in two). What runs is that text
with ``subs`` applied (placeholders like ``runs/x/checkpoint-200`` replaced) and ``extra`` appended
(reduced sizes; a later flag wins over the config file's value). In ``subs``, ``extra``, ``files``:
``{out}`` is a fresh folder for this command, ``{model}`` the embedded model, ``{run}`` the folder
of the main job's reduced run (the entry with ``makes_run``), ``{data}`` a folder of prepared inputs
(``samples.jsonl`` for HumanEval, ``outputs.jsonl`` for the reasoning suite). ``skip`` says why a
command is not run here (a GPU, a network install, an interactive terminal, ...): it stays listed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("python ", ".venv/bin/python ", ".venv/bin/pytest ", "accelerate launch", "lmselfplay ", "bash .ci/",
            "pip install ")
# a bare script path is a file reference; with arguments, a command
SCRIPT_PATH = re.compile(r"^(benchmarks|recipes|scripts)/\S+\.py \S")
# an interpreter or launcher named alone or with flags only (``python -I``) is prose, not a command
NO_PROGRAM = re.compile(r"^(?:\S*python(?: -\w+)*|accelerate launch)$")
ENV_PREFIX = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+ )+")


@dataclass(frozen=True)
class Command:
    documented: str
    subs: tuple[tuple[str, str], ...] = ()
    extra: str = ""
    files: tuple[str, ...] = ()
    output: str = ""
    skip: str = ""
    slow: bool = False  # over ~40 s even at reduced size: `-m slow` only (the default run stays < 15 min)
    makes_run: bool = False
    timeout_s: int = 600

    def line(self) -> str:
        text = self.documented
        for old, new in self.subs:
            assert old in text, f"{old!r} is not in {self.documented!r}"
            text = text.replace(old, new)
        return f"{text} {self.extra}".strip()


def normalise(text: str) -> list[str]:
    """A documented line (continuations already joined) as the commands it holds."""
    text = re.sub(r"\s+#.*$", "", text.strip())
    return [" ".join(part.split()) for part in text.split("&&") if part.strip()]


def is_command(text: str) -> bool:
    bare = ENV_PREFIX.sub("", text)
    return (bare.startswith(PROGRAMS) or bool(SCRIPT_PATH.match(bare))) and not NO_PROGRAM.match(bare)


def fenced_commands(markdown: str) -> list[str]:
    """Command lines of the shell code blocks (``bash``, ``sh``, ``console`` or no language)."""
    out, block, lang, pending = [], False, "", ""
    for raw in markdown.splitlines():
        if raw.startswith("```"):
            block, lang, pending = not block, raw[3:].strip(), ""
            continue
        if not block or lang not in ("", "bash", "sh", "shell", "console"):
            continue
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        out += [c for c in normalise(line) if is_command(c)]
    return out


def inline_commands(markdown: str) -> list[str]:
    """Backticked commands outside code blocks (tables and prose)."""
    prose = re.sub(r"(?ms)^```.*?^```", "", markdown)
    return [c for span in re.findall(r"`([^`\n]+)`", prose) for c in normalise(span) if is_command(c)]


def documented_commands() -> dict[str, list[str]]:
    """Each command of the docs -> where it is written (file:kind)."""
    found: dict[str, list[str]] = {}
    for path in DOCS:
        text = path.read_text()
        for kind, commands in (("code block", fenced_commands(text)), ("inline", inline_commands(text))):
            for c in commands:
                found.setdefault(c, []).append(f"{path.relative_to(ROOT)} ({kind})")
    return found


# --- the registry ----------------------------------------------------------------------------

GPU = "needs a CUDA GPU"
MODEL = ("runs/x/checkpoint-200", "{model}")
NO_TB = "--tensorboard false --progress false"
MAIN_JOB = ("--output_dir {out} --max_steps 2 --episodes_per_step 6 --eval_every 0 --eval_games 2 "
            "--eval_positions 10 --checkpoint_every 1 --max_new_tokens 6")
# the exact-feedback reference: one step and one pass over the valued positions show its path end to end
# (each pass trains on every Nim and Kuhn position: its config's 4 passes x 2 steps took ~9 s of the 19)
EXACT_JOB = MAIN_JOB.replace("--max_steps 2", "--max_steps 1") + " --target_passes 1"
SELFPLAY_SMALL = "--output_dir {out} --max_steps 1 --episodes_per_step 4 --eval_every 0 --eval_games 2 --eval_positions 10"
SEARCH_SMALL = (f"--output_dir {{out}} --rounds 1 --games_per_round 2 --n_sims 4 --distill_steps 1 "
                f"--batch_size 8 --value_steps 1 --eval_every 1 --eval_games 2 --eval_budgets 0 --eval_openings 1 "
                f"--eval_positions 10 {NO_TB}")
AZ_SMALL = (f"--output_dir {{out}} --iterations 1 --games_per_iteration 4 --n_sims 4 --train_steps 2 --batch_size 8 "
            f"--eval_games 2 --eval_budgets 0 4 --winrate_games 0 --gate_games 2 {NO_TB}")
AZR_SMALL = ("--output_dir {out} --max_steps 1 --proposals_per_type 2 --solve_tasks_per_type 2 --num_generations 2 "
             "--references 1 --seed_programs 4 --eval_tasks_per_type 3 --eval_every 1 --checkpoint_every 1 "
             "--propose_max_new_tokens 16 --solve_max_new_tokens 12")
RLVR_SMALL = ("--output_dir {out} --max_steps 1 --prompts_per_step 2 --num_generations 2 --heldout_size 4 "
              "--eval_every 0 --max_new_tokens 6 --checkpoint_every 1")
RZERO_SMALL = ("--rounds 1 --challenger_steps 1 --num_questions 4 --challenger_group_size 4 --pool_size 4 "
               "--num_answers 10 --solver_steps 1 --solver_batch 2 --solver_group_size 10 --heldout_size 4 "
               "--challenger_max_new_tokens 12 --solver_max_new_tokens 8")
DEBATE_SMALL = ("--output_dir {out} --max_steps 1 --debates_per_step 2 --train_tasks 8 --eval_tasks 4 "
                "--eval_protocols debate --max_new_tokens 8 --num_rounds 1 --checkpoint_every 0")
SPIN_SMALL = (f"--output_dir {{out}} --spin_iterations 1 --num_train_examples 8 --num_eval_examples 4 "
              f"--max_completion_length 8 --per_device_train_batch_size 4 --num_train_epochs 1 "
              f"--generation_batch_size 8 --logging_steps 1 {NO_TB}")
SPIN_SET = ("--set spin_iterations=1 num_train_examples=8 num_eval_examples=4 max_completion_length=8 "
            "per_device_train_batch_size=4 num_train_epochs=1 generation_batch_size=8")
CPU_LAUNCH = ("accelerate launch", "accelerate launch --config_file recipes/accelerate/ddp_cpu.yaml --num_processes 1")
RESULT = r"results: \S+\.json"
FIGURE = r"figure: \S+\.png"
THROUGHPUT = r"wrote \S+/results/eval_throughput\.json"

REGISTRY: list[Command] = [
    # quick start
    Command("bash .ci/setup", skip="installs the environment (network, minutes): CI has just run it"),
    Command("bash .ci/setup run", skip="installs the recipes' part of the environment (network, minutes): CI has "
            "just run the full set-up, which holds it"),
    Command(".venv/bin/python -m pytest -q", skip="the test suite itself: CI runs it"),
    Command(".venv/bin/python -m pytest -q tests/rl/test_absolute_zero.py", skip="part of the test suite CI runs"),
    Command(".venv/bin/python -m pytest -q tests/project/test_layers.py", skip="part of the test suite CI runs"),
    Command(".venv/bin/python -m pytest -q tests/verifiers/test_executor.py tests/verifiers/test_sandbox.py",
            skip="part of the test suite CI runs"),
    Command(".venv/bin/python recipes/selfplay_games.py --config recipes/configs/selfplay_games.yaml",
            extra=MAIN_JOB, files=("metrics.jsonl", "config.json", "checkpoint-2", "final_model"), makes_run=True),
    Command("python recipes/selfplay_games.py --config recipes/configs/selfplay_games.yaml", extra=MAIN_JOB,
            files=("metrics.jsonl", "config.json", "checkpoint-2", "final_model")),
    Command("python recipes/selfplay_games.py --config recipes/configs/selfplay_games_exact.yaml", extra=EXACT_JOB,
            files=("metrics.jsonl", "final_model")),
    Command('pip install -e .', skip="installs the package (network)"),
    Command('pip install -e ".[dev]"', skip="installs the dev extras (network)"),
    Command("lmselfplay eval-game nim tictactoe kuhn_poker",
            # tic-tac-toe's exact metrics read all 4,520 positions (minutes on 2 cores): the reduced run leaves it out
            subs=((" tictactoe", ""),), extra="--n-games 4 --json {out}/metrics.json", files=("metrics.json",)),
    Command("lmselfplay eval humaneval", extra="--limit 2 --max-new-tokens 16 --out {out}", output=r"pass@1"),
    Command("accelerate launch recipes/spin.py --config recipes/configs/spin.yaml", subs=(CPU_LAUNCH,),
            extra=SPIN_SMALL, files=("metrics.jsonl",)),
    Command("python recipes/alphazero.py --config recipes/configs/alphazero_nim.yaml", extra=AZ_SMALL,
            files=("metrics.jsonl",)),
    Command("python recipes/spin.py --config recipes/configs/spin.yaml", slow=True, extra=SPIN_SMALL, files=("metrics.jsonl",)),
    Command("python recipes/alphazero.py --config recipes/configs/alphazero_tictactoe.yaml --iterations 20", slow=True,
            subs=(("--iterations 20", "--iterations 1"),), extra=AZ_SMALL, files=("metrics.jsonl",)),
    Command("OMP_NUM_THREADS=1 python recipes/alphazero.py --config recipes/configs/alphazero_go9.yaml",
            extra=AZ_SMALL.replace("--games_per_iteration 4", "--games_per_iteration 2"), files=("metrics.jsonl",)),
    Command("python recipes/selfplay_games.py --config recipes/configs/selfplay_go9.yaml", extra=SELFPLAY_SMALL,
            files=("metrics.jsonl",), slow=True),
    Command("python recipes/search_selfplay.py --config recipes/configs/search_selfplay_nim.yaml", extra=SEARCH_SMALL,
            files=("metrics.jsonl",)),
    Command(".venv/bin/python recipes/search_selfplay.py --config recipes/configs/search_selfplay_nim.yaml",
            extra=SEARCH_SMALL, files=("metrics.jsonl",), slow=True),
    Command(".venv/bin/python recipes/search_selfplay.py --config recipes/configs/search_selfplay_tictactoe.yaml",
            extra=SEARCH_SMALL, files=("metrics.jsonl",), slow=True),
    Command("python recipes/absolute_zero.py --config recipes/configs/absolute_zero.yaml", extra=AZR_SMALL,
            files=("metrics.jsonl",)),
    Command(".venv/bin/python recipes/absolute_zero.py --config recipes/configs/absolute_zero.yaml",
            extra=AZR_SMALL, files=("metrics.jsonl",), slow=True),
    Command("accelerate launch --config_file recipes/accelerate/zero2.yaml --num_processes 8 recipes/selfplay_games.py "
            "--config recipes/configs/spiral_qwen3_base.yaml", skip=f"{GPU}s (8) and Qwen3-4B-Base weights"),
    Command("accelerate launch --config_file recipes/accelerate/zero2.yaml --num_processes 8 recipes/spin.py "
            "--config recipes/configs/spin_zephyr.yaml --dataset /data/ultrachat_spin",
            skip=f"{GPU}s (8), zephyr-7b-sft-full weights and UltraChat data"),
    Command("accelerate launch --config_file recipes/accelerate/zero2.yaml --num_processes 8 recipes/absolute_zero.py "
            "--config recipes/configs/absolute_zero_qwen_coder.yaml", skip=f"{GPU}s (8) and Qwen2.5-Coder-7B weights"),
    Command("python recipes/r_zero.py --config recipes/configs/r_zero.yaml", extra=f"--output_dir {{out}} {RZERO_SMALL}",
            files=("metrics.jsonl",)),
    Command("accelerate launch --config_file recipes/accelerate/zero2.yaml recipes/r_zero.py "
            "--config recipes/configs/r_zero_qwen3.yaml", skip=f"{GPU}s and Qwen3-4B-Base weights"),
    Command("lmselfplay referee-study --config recipes/configs/r_zero.yaml",
            extra=f"--output_dir {{out}} --referees grounded,vote {RZERO_SMALL}", output=r"label_accuracy", slow=True),
    Command("python recipes/r_zero.py --config recipes/configs/r_zero_sum.yaml", extra=f"--output_dir {{out}} {RZERO_SMALL}",
            files=("metrics.jsonl",)),
    Command("python recipes/r_zero.py --config recipes/configs/r_zero_sum.yaml --rounds 12 --pool_size 2048 --seed 0",
            extra=f"--output_dir {{out}} {RZERO_SMALL}", files=("metrics.jsonl",), slow=True),
    Command("lmselfplay referee-study --config recipes/configs/r_zero_sum.yaml",
            extra=f"--output_dir {{out}} {RZERO_SMALL}", output=r"vote \| 1 \|"),
    Command("lmselfplay referee-study --config recipes/configs/r_zero_sum.yaml --seed 0",
            extra=f"--output_dir {{out}} --referees fixed,grounded {RZERO_SMALL}", output=r"rules \| 1 \|"),
    Command("lmselfplay referee-study", extra=f"--output_dir {{out}} --referees fixed,grounded {RZERO_SMALL}",
            output=r"fixed \| 1 \|"),  # the positive-control arm and one referee: the by-default run of the study
    Command("python recipes/debate.py --config recipes/configs/debate.yaml", extra=DEBATE_SMALL,
            files=("metrics.jsonl", "accuracy_table.json")),
    Command(".venv/bin/python recipes/debate.py --config recipes/configs/debate.yaml", extra=DEBATE_SMALL,
            files=("metrics.jsonl", "accuracy_table.json"), slow=True),
    Command("accelerate launch recipes/debate.py --config recipes/configs/debate_real.yaml --model_name_or_path "
            "PATH_DEBATER --judge_model_name_or_path PATH_JUDGE", skip=f"{GPU} and two real models (debater, judge)"),
    # evaluation
    Command("lmselfplay eval reasoning --suite default", subs=(("default", "tiny"),), extra="--out {out}",
            output=r"\d"),
    Command("lmselfplay eval reasoning --suite default --model runs/x/checkpoint-200",
            subs=(("default", "tiny"), MODEL), extra="--out {out}", output=r"\d", slow=True),
    Command("lmselfplay eval reasoning --suite default --model runs/rlvr/final_model",
            subs=(("default", "tiny"), ("runs/rlvr/final_model", "embedded:v8")), extra="--out {out}", output=r"\d"),
    Command("lmselfplay eval reasoning --suite default --samples 8 --k 1,4,8",
            subs=(("default", "tiny"), ("--samples 8", "--samples 4"), ("1,4,8", "1,4")), extra="--out {out}",
            output=r"pass@4", slow=True),
    Command("lmselfplay eval reasoning --suite default --completions outputs.jsonl",
            subs=(("default", "tiny"), ("outputs.jsonl", "{data}/outputs.jsonl")), extra="--out {out}", output=r"\d"),
    Command("lmselfplay eval humaneval --model runs/x/checkpoint-200", subs=(MODEL,),
            extra="--limit 2 --max-new-tokens 16 --out {out}", output=r"\d", slow=True),
    Command("lmselfplay eval humaneval --completions samples.jsonl --k 1,10",
            subs=(("samples.jsonl", "{data}/samples.jsonl"), ("1,10", "1,2")), extra="--out {out}",
            output=r"pass@1"),
    Command("lmselfplay arena tictactoe --models runs/x/checkpoint-100 runs/x/checkpoint-200 --bots random,exact",
            subs=(("runs/x/checkpoint-100", "{run}/checkpoint-2"), MODEL), extra="--games 2 --bootstrap 10 --out {out}",
            output=r"random", slow=True),  # ~12 s; eval/test_arena.py loads a run's checkpoints by default
    Command("lmselfplay arena nim --bots random,exact", extra="--models embedded --games 2 --bootstrap 10 --out {out}",
            output=r"exact"),
    Command("lmselfplay lm-eval --model lmselfplay --model_args pretrained=runs/x/checkpoint-200 --batch_size 64 "
            "--tasks gsm8k", skip="downloads the gsm8k dataset from the Hugging Face hub"),
    Command("lmselfplay lm-eval ...", skip="a template of the command above (lm-eval's own flags follow)"),
    Command('pip install -e ".[lmeval]"', skip="installs packages (network)"),
    Command('pip install .[vllm]', skip=f"installs vLLM for a {GPU}"),
    Command("accelerate launch --config_file recipes/accelerate/zero3.yaml --num_machines 2 --num_processes 16 "
            "--machine_rank $RANK --main_process_ip $HEAD --main_process_port 29500 recipes/selfplay_games.py "
            "--config my_run.yaml", skip="two machines of 8 CUDA GPUs each and the user's own config"),
    *[Command(c, skip="needs `vllm serve` processes at gen0/gen1 (CUDA); tests/rl/test_overlap.py runs these flags "
                      "against simulated servers") for c in (
        "python recipes/absolute_zero.py --config recipes/configs/absolute_zero.yaml --engine vllm-server "
        "--vllm_server_urls http://gen0:8000 http://gen1:8000 --max_staleness 1 --tis_cap 2",
        "python recipes/r_zero.py --config recipes/configs/r_zero.yaml --engine vllm-server "
        "--vllm_server_urls http://gen0:8000 http://gen1:8000 --max_staleness 1 --tis_cap 2",
        "python recipes/r_zero.py --config recipes/configs/r_zero.yaml --two_copies true --engine vllm-server "
        "--vllm_server_urls http://gen0:8000 --challenger_vllm_server_urls http://gen1:8000 --max_staleness 1 --tis_cap 2")],
    Command("python benchmarks/bench_scale.py --rounds 5", subs=(("--rounds 5", "--rounds 1"),), extra="--prompts 8 --tokens 8 --steps 2 --train_batch 8 --out_dir {out}",
            files=("bench_scale.json",), slow=True),
    Command("python benchmarks/bench_staleness_learning.py",
            extra="--steps 2 --seeds 0 --eval_every 2 --episodes 4 --settings k0,k1 --out_dir {out}",
            files=("bench_staleness_learning.json",), slow=True),
    Command('pip install -e ".[vllm]"', skip=f"installs vLLM for a {GPU}"),
    Command("python recipes/selfplay_games.py --config recipes/configs/selfplay_games.yaml --engine vllm "
            "--vllm_gpu_memory_utilization 0.3 [--vllm_enable_sleep_mode true]", skip=f"{GPU} and vLLM"),
    Command("recipes/selfplay_games.py --config recipes/configs/selfplay_games.yaml --exact_games kuhn_poker", slow=True,
            subs=(("recipes/selfplay_games.py", "python recipes/selfplay_games.py"),),
            extra=f"--feedback exact {SELFPLAY_SMALL} --games kuhn_poker",
            files=("metrics.jsonl",)),
    Command("python recipes/selfplay_games.py --config recipes/configs/selfplay_taboo.yaml", slow=True,
            extra=SELFPLAY_SMALL.replace("--eval_positions 10", "--text_max_new_tokens 8"), files=("metrics.jsonl",)),
    # benchmarks (LMSELFPLAY_RESULTS_DIR keeps the cited results files untouched)
    Command(".venv/bin/python benchmarks/bench_search_selfplay.py", slow=True, extra="--trees 2 --sims 4", output=RESULT),
    Command(".venv/bin/python benchmarks/bench_ttt_representation.py",
            extra="--steps 2 --batch 8 --eval_every 1 --eval_positions 20", output=RESULT, slow=True),
    Command("OMP_NUM_THREADS=1 python benchmarks/bench_alphazero_go_vs_gnugo.py --run runs/alphazero_go9 --budgets 0 "
            "--levels 1 --games 20 --random_games 100 --out benchmarks/results/alphazero_go9_raw.json",
            skip="needs the gnugo program and a finished 9x9 AlphaZero run (hours)"),
    Command("OMP_NUM_THREADS=1 python benchmarks/bench_alphazero_go_vs_gnugo.py --run runs/alphazero_go9 --budgets 16 "
            "32 64 --levels 1 --games 20 --random_games 40 --out benchmarks/results/alphazero_go9_search.json",
            skip="needs the gnugo program and a finished 9x9 AlphaZero run (hours)"),
    Command(".venv/bin/python benchmarks/bench_eval_throughput.py", slow=True, extra="--suite tiny --rounds 1 --skip-default",
            output=THROUGHPUT),
    Command("benchmarks/bench_eval_throughput.py --rounds 2", subs=(("benchmarks/", "python benchmarks/"),
                                                                    ("--rounds 2", "--rounds 1")),
            extra="--suite tiny --skip-default", output=THROUGHPUT, slow=True),
    Command(".venv/bin/python benchmarks/bench_rollout.py", slow=True, extra="--games 4 --sequential-games 1 --max-new-tokens 4",
            output=RESULT),
    Command(".venv/bin/python benchmarks/bench_selfplay_learning.py", extra="--steps 1 --eval-every 1 --seeds 0",
            output=RESULT, slow=True),
    Command(".venv/bin/python benchmarks/bench_kuhn_card_reading.py", slow=True, extra="--steps 1", output=RESULT),
    Command("benchmarks/bench_kuhn_card_reading.py --model OLD NEW",
            subs=(("benchmarks/", "python benchmarks/"), ("OLD", "{model}"), ("NEW", "{run}/final_model")),
            extra="--steps 1 --name card_reading_check", output=r"results: \S+/card_reading_check\.json", slow=True),
    Command(".venv/bin/python benchmarks/bench_trainer_vs_trl.py", slow=True,
            extra="--prompts 2 --num-generations 2 --batches 1 --warmup 0 --no-merge-variant", output=RESULT),
    Command(".venv/bin/python benchmarks/bench_test_suite.py --base BASE --new NEW",
            skip="times the whole test suite in two set-up checkouts (minutes a run); tests/benchmarks/test_bench_test_suite.py runs it on stand-in checkouts"),
    Command(".venv/bin/python benchmarks/bench_cfr.py", extra="--iterations 10 --repeats 1", output=RESULT),
    Command(".venv/bin/python benchmarks/bench_alphazero_speed.py",
            extra="--trees 4 --sims 8 --repeats 1 --openspiel_sims 8", output=RESULT),
    Command(".venv/bin/python benchmarks/bench_alphazero_learning.py", extra="--only nim --nim_seeds 1 --out {out}",
            output=RESULT, slow=True),
    Command(".venv/bin/python benchmarks/bench_memory.py", extra="--quick --out {out}/memory.json", files=("memory.json",),
            slow=True),
    Command(".venv/bin/python benchmarks/bench_gpu.py", skip=f"{GPU}; tests/benchmarks/test_bench_gpu.py runs its --dry_run"),
    Command("python benchmarks/bench_alphazero_go_vs_gnugo.py --run runs/alphazero_go9",
            skip="needs the gnugo program and a finished 9x9 AlphaZero run (hours)"),
    Command("python benchmarks/bench_llm_go.py --models embedded runs/selfplay_go9/final_model", slow=True,
            subs=(("runs/selfplay_go9/final_model", "{run}/final_model"),),
            extra="--games 2 --gnugo_games 0 --positions 4", output=RESULT),
    Command(".venv/bin/python benchmarks/bench_executor.py", extra="--n 20 --naive-n 5 --rounds 1", output=RESULT),
    Command(".venv/bin/python benchmarks/bench_vllm_gpu.py", skip=f"{GPU} and vLLM"),
    Command("python benchmarks/bench_vllm_gpu.py", skip=f"{GPU} and vLLM"),
    Command(".venv/bin/python benchmarks/bench_go.py", extra="--games 2 --mask_states 20 --repeats 1 --out {out}/go.json",
            files=("go.json",)),
    Command("python benchmarks/bench_go.py", slow=True, extra="--games 2 --mask_states 20 --repeats 1 --out {out}/go.json",
            files=("go.json",)),
    Command(".venv/bin/python benchmarks/bench_spin.py", slow=True, extra=SPIN_SET, output=RESULT),
    Command("python benchmarks/bench_spin.py --control-epochs 1 5", subs=(("1 5", "1 2"),), extra=SPIN_SET,
            output=RESULT, slow=True),
    Command("python benchmarks/bench_spin.py --plateau", extra=f"{SPIN_SET} --plateau-max-rounds 1", output=RESULT,
            slow=True),
    Command(".venv/bin/python benchmarks/bench_leak.py", extra="--steps 3 --quick", output=RESULT, slow=True),
    Command(".venv/bin/python benchmarks/bench_threads_under_load.py",
            extra="--steps 2 --loads 0,1 --policies one,auto --extra '--episodes_per_step 8 --max_new_tokens 6'",
            output=r"auto +load 0", slow=True),
    Command(".venv/bin/python benchmarks/bench_main_job.py", extra="--steps 1 --threads 1 --no-eval", output=RESULT,
            slow=True),
    # docs/embedded_model.md: a named build, and the measurements of a build's folder (PATH)
    # ~12 s; test_tiny_v4 runs the same bootstrap options in-process by default
    Command("lmselfplay bootstrap --build v4", output=r"tiny model: ", slow=True,
            extra="--cache-dir {out} --quiet --num_layers 1 --hidden_size 32 --num_heads 2 --intermediate_size 64 "
                  "--train_steps 2 --batch_size 4 --tokenizer_texts 300"),
    Command("lmselfplay bootstrap --build v3", output=r"tiny model: ", slow=True,
            extra="--cache-dir {out} --quiet --num_layers 1 --hidden_size 32 --num_heads 2 --intermediate_size 64 "
                  "--train_steps 2 --batch_size 4 --tokenizer_texts 300"),
    Command("lmselfplay bootstrap", output=r"tiny model: ", extra="--cache-dir {out} --quiet"),  # copies the shipped v7
    Command("lmselfplay bootstrap --build v7", output=r"tiny model: ", slow=True,
            extra="--cache-dir {out} --quiet --hidden_size 32 --num_heads 2 --intermediate_size 64 "
                  "--train_steps 2 --batch_size 4 --tokenizer_texts 300"),
    Command(".venv/bin/python benchmarks/bench_ttt_representation.py --which fresh --cell_tokens --layers 2 --heads 8 "
            "--intermediate 256 --format FORMAT", subs=(("FORMAT", "cells_last"), ("--intermediate 256", "--intermediate 32")),
            extra="--steps 2 --batch 8 --eval_every 1 --eval_positions 20", output=RESULT, slow=True),
    Command("python recipes/selfplay_games.py --config recipes/configs/selfplay_games.yaml --model_name_or_path PATH "
            "--seed S --output_dir /tmp/v7_main_S", subs=(("PATH", "{model}"), ("--seed S", "--seed 1"),
                                                           ("--output_dir /tmp/v7_main_S", "")),
            extra=MAIN_JOB, files=("metrics.jsonl",), slow=True),
    Command("python recipes/selfplay_games.py --config recipes/configs/selfplay_games.yaml --model_name_or_path PATH "
            "--lr_scheduler_type constant", subs=(("PATH", "{model}"),), extra=MAIN_JOB,
            files=("metrics.jsonl", "final_model"), slow=True),
    Command(".venv/bin/python benchmarks/bench_tiny_legal.py --model PATH --n 512",
            subs=(("PATH", "{model}"), ("--n 512", "--n 2")), output=RESULT, slow=True),
    Command("lmselfplay eval-game nim tictactoe kuhn_poker --model PATH", subs=(("PATH", "{model}"), (" tictactoe", "")),
            extra="--n-games 4 --json {out}/metrics.json", files=("metrics.json",), slow=True),
    Command(".venv/bin/python benchmarks/bench_ttt_representation.py --model PATH --which embedded --steps 400 "
            "--batch 128", subs=(("PATH", "{model}"), ("--steps 400 --batch 128", "--steps 2 --batch 8")),
            extra="--eval_every 1 --eval_positions 20", output=RESULT, slow=True),
    # docs/search_selfplay.md: tic-tac-toe's search self-play on v7 (tic-tac-toe's positions: over 40 s)
    Command("python recipes/search_selfplay.py --config recipes/configs/search_selfplay_tictactoe_v7.yaml",
            extra=SEARCH_SMALL, files=("metrics.jsonl",), slow=True),
    Command("lmselfplay eval-game tictactoe --model RUN/checkpoint-N/model --n-games 200 --temperature 0",
            subs=(("RUN/checkpoint-N/model", "{model}"), ("--n-games 200", "--n-games 2")),
            extra="--json {out}/metrics.json", files=("metrics.json",), slow=True),
    Command("python recipes/r_zero.py --config recipes/configs/r_zero.yaml --model_name_or_path PATH --rounds 1",
            subs=(("PATH", "{model}"),), extra=f"--output_dir {{out}} {RZERO_SMALL}", files=("metrics.jsonl",),
            slow=True),
    Command("python recipes/absolute_zero.py --config recipes/configs/absolute_zero.yaml --model_name_or_path PATH",
            subs=(("PATH", "{model}"),), extra=AZR_SMALL, files=("metrics.jsonl",), slow=True),
    Command(".venv/bin/python benchmarks/record_run.py RUN --name NAME", subs=(("RUN", "{run}"), ("NAME", "main_job")),
            output=RESULT),
    # the docs' figures, drawn into {out} so that the tracked PNGs stay as committed
    Command(".venv/bin/python benchmarks/record_run.py --plot benchmarks/results/main_job_v6.json",
            extra="--out {out}/main_job_v6.png", files=("main_job_v6.png",), output=FIGURE),
    Command("python benchmarks/record_run.py --plot benchmarks/results/referee_study_v6.jsonl",
            extra="--out {out}/referee_study_v6.png", files=("referee_study_v6.png",), output=FIGURE),
    Command("python benchmarks/record_run.py --plot benchmarks/results/referee_study_v7.jsonl",
            extra="--out {out}/referee_study_v7.png", files=("referee_study_v7.png",), output=FIGURE),
    Command("python benchmarks/bench_llm_taboo.py --models embedded --name llm_taboo_v7",
            subs=(("llm_taboo_v7", "taboo_check"),), extra="--games 2 --max_new_tokens 8",
            output=r"results: \S+/taboo_check\.json", slow=True),
    Command("python benchmarks/bench_llm_go.py --models embedded --name llm_go_v7", subs=(("llm_go_v7", "go_check"),),
            extra="--games 1 --gnugo_games 0 --positions 4", output=r"results: \S+/go_check\.json", slow=True),
    Command("python benchmarks/bench_llm_taboo.py --models embedded runs/selfplay_taboo/final_model", slow=True,
            subs=(("runs/selfplay_taboo/final_model", "{run}/final_model"),), extra="--games 2 --max_new_tokens 8",
            output=RESULT),
    # docs/bring_your_own_game.md
    Command("lmselfplay show openspiel:leduc_poker", output=r"Round"),
    Command("lmselfplay eval-game openspiel:kuhn_poker openspiel:connect_four --n-games 20",
            subs=(("--n-games 20", "--n-games 2"),), extra="--json {out}/metrics.json", files=("metrics.json",),
            output=r"win_vs_mcts128"),
    Command('lmselfplay arena "openspiel:liars_dice(numdice=1)" --models embedded --bots random --games 4',
            extra="--bootstrap 10 --out {out}", output=r"random"),
    Command("pip install 'lmselfplay[textarena]'", skip="installs TextArena (network); the dev extras hold it"),
    Command("pip install 'lmselfplay[openenv]'", skip="installs openenv-core (network); the dev extras hold it"),
    Command("lmselfplay arena textarena:TicTacToe-v0 --models embedded embedded --bots '' --games 4",
            extra="--bootstrap 10 --out {out}", output=r"embedded"),
    Command("python scripts/games_tables.py", extra="--check --only openspiel", output=r"tables up to date"),
    Command("python recipes/selfplay_games.py --config recipes/configs/selfplay_leduc.yaml", slow=True,
            extra="--output_dir {out} --max_steps 1 --eval_every 0 --eval_games 2 --checkpoint_every 1",
            files=("metrics.jsonl", "final_model")),
    Command("python benchmarks/bench_selfplay_leduc.py --seeds 0 1 2", slow=True,
            subs=(("--seeds 0 1 2", "--seeds 0"),),
            extra="--cfr-iterations 5 --name leduc_check -- --max_steps 1 --eval_every 1 --eval_games 2 "
                  "--checkpoint_every 0", output=r"results: \S+/leduc_check\.json", timeout_s=900),
    Command("python -m lmselfplay.rl.openenv_env --game kuhn_poker --opponent random --port 8000",
            skip="a server that runs until stopped; tests/rl/test_environments.py serves one and plays it"),
    # scripts
    Command("python scripts/make_standins.py", output=r"(?m)^\S+\t/\S+$"),  # the cached builds are reused
    Command("python scripts/build_taboo_words.py", skip="rebuilds the shipped word list from wordfreq (a dev extra)"),
    Command("python scripts/ship_embedded_model.py",
            skip="rewrites the shipped embedded model in the package (minutes); tests/models/test_shipped_model.py checks it"),
    Command("python recipes/rlvr.py --config recipes/configs/rlvr.yaml", extra=RLVR_SMALL,
            files=("metrics.jsonl", "final_model")),
    Command("python recipes/rlvr.py --config recipes/configs/rlvr_arithmetic.yaml", extra=RLVR_SMALL,
            files=("metrics.jsonl",)),
    Command("python recipes/rlvr.py --config recipes/configs/rlvr_arithmetic.yaml --task program", extra=RLVR_SMALL,
            files=("metrics.jsonl",)),
    Command("python recipes/rlvr.py --config recipes/configs/rlvr_arithmetic.yaml --task reasoning_gym:chain_sum "
            "--task_config '{\"min_terms\": 2, \"max_terms\": 3}' --max_new_tokens 24", extra=RLVR_SMALL,
            subs=(('{"min_terms": 2, "max_terms": 3}', '{{"min_terms": 2, "max_terms": 3}}'),),  # literal braces: the line is str.format-ed
            files=("metrics.jsonl",)),
    Command("python recipes/rlvr.py --config recipes/configs/rlvr_arithmetic.yaml --task jsonl:my_questions.jsonl",
            subs=(("my_questions.jsonl", "{data}/questions.jsonl"),), extra=RLVR_SMALL, files=("metrics.jsonl",)),
    Command("python recipes/rlvr.py --config recipes/configs/rlvr.yaml --resume true", extra=RLVR_SMALL,
            files=("metrics.jsonl",)),
    Command("python recipes/rlvr.py --config recipes/configs/rlvr_qwen.yaml", skip=f"{GPU} and Qwen2.5-0.5B-Instruct weights"),
    Command("python benchmarks/bench_heldout_overlap.py --models embedded:v8 runs/rlvr/final_model "
            "--name heldout_overlap_chain_sum", subs=((" runs/rlvr/final_model", ""), ("heldout_overlap_chain_sum", "overlap_check")),
            extra="--heldout-size 8", output=r"results: \S+/overlap_check\.json"),
    Command("python benchmarks/bench_spin.py --set model_name_or_path=embedded:v8 dataset=reasoning_gym:chain_sum "
            "'dataset_config={\"min_terms\":3,\"max_terms\":3,\"min_digits\":1,\"max_digits\":1}' max_completion_length=16 "
            "--control-epochs 5 --name bench_spin_chain_sum_v8",
            subs=(("{", "{{"), ("}", "}}"), ("--control-epochs 5", "--control-epochs 1"),
                  ("max_completion_length=16", "max_completion_length=16 " + SPIN_SET.removeprefix("--set ")),
                  ("bench_spin_chain_sum_v8", "spin_rg_check")),
            output=r"results: \S+/spin_rg_check\.json"),
    Command("python benchmarks/bench_spin.py --set model_name_or_path=embedded:v8 dataset=reasoning_gym:chain_sum "
            "'dataset_config={\"min_terms\":3,\"max_terms\":3,\"min_digits\":1,\"max_digits\":1}' max_completion_length=16 "
            "--plateau --name bench_spin_chain_sum_v8_plateau",
            subs=(("{", "{{"), ("}", "}}"),
                  ("max_completion_length=16", "max_completion_length=16 " + SPIN_SET.removeprefix("--set ")),
                  ("bench_spin_chain_sum_v8_plateau", "spin_rg_plateau_check")),
            extra="--plateau-max-rounds 1", output=r"results: \S+/spin_rg_plateau_check\.json", slow=True),
    Command(".venv/bin/python benchmarks/bench_rlvr.py", slow=True,
            extra="--seeds 0 --max-steps 1 --prompts-per-step 2 --num-generations 2 --heldout-size 4 --eval-every 0 "
                  "--max-new-tokens 6 --name rlvr_check", output=r"results: \S+/rlvr_check\.json"),
    Command("python benchmarks/bench_number_tokens.py --games nim --weights arithmetic=20,nim=0.01 --steps 400 --out A.json",
            subs=(("--steps 400", "--steps 2"), ("A.json", "{out}/A.json")), extra="--eval_every 1 --heldout 4",
            files=("A.json",)),
    Command("python benchmarks/bench_number_tokens.py --games nim --weights arithmetic=20,nim=0.01 --steps 400 --whole_numbers --out B.json",
            subs=(("--steps 400", "--steps 2"), ("B.json", "{out}/B.json")), extra="--eval_every 1 --heldout 4",
            files=("B.json",)),
    Command("python scripts/ship_embedded_model.py --build v8",
            skip="rebuilds v8 from its corpus (20 minutes on one core); tests/models/test_shipped_model.py checks the shipped copy"),
    Command("lmselfplay eval reasoning --suite default --model PATH", subs=(("default", "tiny"), ("PATH", "embedded:v8")),
            extra="--out {out}", files=("reasoning_tiny.json",)),
    Command("python recipes/absolute_zero.py --config recipes/configs/absolute_zero.yaml --model_name_or_path embedded:v8",
            extra=AZR_SMALL, files=("metrics.jsonl",), slow=True),
    Command("python recipes/absolute_zero.py --config recipes/configs/absolute_zero.yaml --model_name_or_path embedded:v8 "
            "--learning_rate 2e-4 --max_steps 400 --eval_every 100 --seed 0",
            extra=AZR_SMALL, files=("metrics.jsonl",), slow=True),
    Command("python benchmarks/bench_rlvr.py --task program --arms sft --seeds 0 1 2 --max-steps 400 --learning-rate 2e-4 "
            "--max-new-tokens 24 --heldout-size 300 --eval-every 100 --name bench_rlvr_program_sft",
            subs=(("--seeds 0 1 2 --max-steps 400", "--seeds 0 --max-steps 1"), ("--heldout-size 300", "--heldout-size 4"),
                  ("--eval-every 100", "--eval-every 0"), ("bench_rlvr_program_sft", "rlvr_program_sft_check")),
            extra="--prompts-per-step 2", output=r"results: \S+/rlvr_program_sft_check\.json", slow=True),
]
