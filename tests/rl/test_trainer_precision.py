"""Precision: the trainer keeps float32 master weights (AdamW on bfloat16 weights loses the
updates smaller than a weight's last bit), and a CPU run never computes in bfloat16."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch
from lm_fixtures import tiny_model, tiny_tokenizer

from lmselfplay.lm.batching import sequence_logprobs
from lmselfplay.lm.trajectory import Sample
from lmselfplay.models.policy import PolicyConfig, load_policy, resolve_dtype
from lmselfplay.rl.precision import master_weights
from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.recipe_loader import run_recipe


def _batch():
    g = torch.Generator().manual_seed(0)
    return [Sample([1] + torch.randint(3, 300, (6,), generator=g).tolist(),
                   torch.randint(3, 300, (4,), generator=g).tolist() + [2], [-5.0] * 5,
                   advantage=1.0 if i % 2 else -1.0) for i in range(8)]


def _fraction_moved(model, device="cpu", lr=1e-6):
    cfg = TrainerConfig(learning_rate=lr, beta=0.1, num_iterations=1, max_grad_norm=0.0, merge_identical=False)
    tr = PolicyTrainer(model.to(device), tiny_tokenizer(), cfg)
    # the input embedding rows of tokens the batch never shows get no gradient: left out
    params = [p for n, p in tr.unwrapped.named_parameters() if "embed_tokens" not in n]
    before = [p.detach().clone() for p in params]
    tr.step(_batch())
    moved = sum(int((a != b).sum()) for a, b in zip(params, before, strict=True))
    return moved / sum(p.numel() for p in params), tr


def test_bfloat16_weights_keep_their_small_updates():
    """At lr 1e-6 AdamW moves every weight by ~1e-6: below bfloat16's resolution for most of
    them, so bfloat16 weights updated in place barely move; float32 master weights all move."""
    moved, tr = _fraction_moved(tiny_model(seed=0).to(torch.bfloat16))
    assert all(p.dtype == torch.float32 for p in tr.unwrapped.parameters())
    assert moved > 0.95, moved
    fp32_moved, _ = _fraction_moved(tiny_model(seed=0))
    assert fp32_moved > 0.95
    assert all(p.dtype == torch.bfloat16 for p in tr.ref_model.parameters())  # frozen: stays small


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU run's error (the run's device is its accelerator's)")
def test_a_cpu_run_refuses_half_precision(model_dir, capsys, tmp_path):
    with pytest.raises(ConfigError, match="bfloat16 on a CPU run"):
        resolve_dtype("bfloat16", torch.device("cpu"))
    with pytest.raises(ConfigError, match="float16 on a CPU run"):
        load_policy(PolicyConfig(model_name_or_path=str(model_dir), dtype="float16"), device="cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    code = run_main(partial(run_recipe, "selfplay_games"), ["--dtype", "bfloat16", "--model_name_or_path", str(model_dir),
                                                          "--output_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "bfloat16 on a CPU run" in err[0], err


def test_mixed_precision_on_a_cpu_run_is_refused():
    acc = SimpleNamespace(mixed_precision="bf16", device=torch.device("cpu"), state=SimpleNamespace())
    with pytest.raises(ConfigError, match="mixed_precision bf16 on a CPU run"):
        master_weights(tiny_model(), acc)


@pytest.mark.gpu
def test_on_a_gpu_master_weights_are_float32_and_the_forward_bfloat16():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    moved, tr = _fraction_moved(tiny_model(seed=0).to(torch.bfloat16), device="cuda")
    assert moved > 0.95 and all(p.dtype == torch.float32 for p in tr.unwrapped.parameters())
    ids = torch.tensor([[1, 50, 60, 70]], device="cuda")
    assert tr.unwrapped(input_ids=ids).logits.dtype == torch.bfloat16  # computed under autocast
    # the engine (sharing the module) and the trainer score alike: one forward, one numerics
    s = _batch()[0]
    lp = sequence_logprobs(tr.unwrapped, [s.prompt_ids], [s.completion_ids], pad_id=0)[0]
    ref = sequence_logprobs(tr.ref_model, [s.prompt_ids], [s.completion_ids], pad_id=0)[0]
    assert len(lp) == len(ref) == len(s.completion_ids)
