"""benchmarks/bench_gpu.py --dry_run: the device script's whole flow on CPU at tiny size (so it
cannot rot before a GPU is lent), and its imports stay within the lent machine's image."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the lent machine's image: torch, transformers, accelerate, peft (and what they bring)
IMAGE = {"torch", "transformers", "accelerate", "peft", "lmselfplay"}


def _bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_gpu
    finally:
        sys.path.pop(0)
    return bench_gpu


def test_gpu_script_dry_run_writes_its_numbers(tmp_path):
    out = tmp_path / "gpu_dry.json"
    assert _bench().main(["--dry_run", "--no_trl", "--out", str(out)]) == 0
    res = json.loads(out.read_text())["results"]
    ours = res["ours"]
    assert res["dry_run"] and res["trl"] == {"skipped": "--no_trl"}
    assert ours["generation"]["tokens_per_s"] > 0 and ours["training"]["tokens_per_s"] > 0
    assert ours["training"]["seconds_per_step"] > 0 and ours["master_dtype"] == "torch.float32"
    assert ours["training"]["logprob_diff"] < 1e-2  # the engine serves the trainer's weights


def test_gpu_script_imports_only_what_the_image_has():
    """Module-level imports: the standard library and the image; anything else (trl, datasets)
    only inside a guarded function."""
    tree = ast.parse((ROOT / "benchmarks" / "bench_gpu.py").read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert top - set(sys.stdlib_module_names) - IMAGE - {"__future__"} == set()


@pytest.mark.slow  # TRL's GRPOTrainer beside ours (~15 s more on CPU)
def test_gpu_script_dry_run_with_trl(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    out = tmp_path / "gpu_dry.json"
    assert _bench().main(["--dry_run", "--out", str(out)]) == 0
    trl = json.loads(out.read_text())["results"]["trl"]
    assert "error" not in trl and trl["seconds_per_optimizer_step"] > 0
