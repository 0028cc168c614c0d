"""The colocated vLLM engine's dtype, its push and the settings it refuses, on CPU without vLLM
(a fake ``vllm.LLM``), and the same on vLLM's CPU build under ``-m slow``
(``scripts/test_vllm_cpu.sh`` builds that venv and runs these)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from lm_fixtures import tiny_model, tiny_tokenizer

import lmselfplay.lm.engines.vllm as vllm_mod
import lmselfplay.lm.engines.weight_sync as weight_sync
from lmselfplay.lm.engines import EngineConfig, SamplingParams
from lmselfplay.lm.trajectory import Sample
from lmselfplay.r_zero.config import RZeroConfigs
from lmselfplay.rl.trainer import PolicyTrainer, TrainerConfig
from lmselfplay.selfplay_games.config import SelfPlayConfigs
from lmselfplay.utils.config import ConfigError, parse_configs


class FakeLLM:
    """What VLLMEngine calls on ``vllm.LLM`` (vllm/entrypoints/llm.py: ``LLM(dtype=...)``,
    ``collective_rpc`` running a callable or a worker method name on every worker,
    ``apply_model``, ``reset_prefix_cache``, ``llm_engine.model_config.max_model_len``), and the
    worker's ``reload_weights(weights_iterator=...)`` (vllm/v1/worker/gpu_worker.py), which consumes
    the pushed tensors."""

    def __init__(self, **kwargs):
        self.kwargs, self.pushed = kwargs, []
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=kwargs["max_model_len"] or 256))

    def collective_rpc(self, method, kwargs=None):
        if callable(method):
            return [True]  # _worker_can_reload
        self.pushed.append([(k, t.dtype) for k, t in kwargs["weights_iterator"]])
        return [None]

    def apply_model(self, fn):
        return [None]

    def reset_prefix_cache(self):
        return True


@pytest.fixture
def fake_vllm(monkeypatch):
    made = []
    monkeypatch.setattr(vllm_mod, "require_vllm",
                        lambda: SimpleNamespace(LLM=lambda **kw: made.append(FakeLLM(**kw)) or made[-1]))
    return made


def _bf16_trainer():
    """A model declared (and loaded) in bfloat16, after the trainer upcast its weights to float32."""
    model = tiny_model().to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    trainer = PolicyTrainer(model, tiny_tokenizer(), TrainerConfig(num_iterations=1, beta=0.0))
    assert next(trainer.unwrapped.parameters()).dtype == torch.float32
    return trainer


# --- 1: the engine's dtype ------------------------------------------------------------------------

def test_the_engine_runs_in_the_declared_dtype_not_the_upcast_one_and_the_push_casts(fake_vllm):
    trainer = _bf16_trainer()
    engine = vllm_mod.VLLMEngine(trainer.unwrapped, tiny_tokenizer(), max_model_len=128)
    llm = fake_vllm[-1]
    assert llm.kwargs["dtype"] == "bfloat16"
    assert {d for push in llm.pushed for _, d in push} == {torch.bfloat16}  # float32 masters travel as bf16
    assert engine.last_sync.bytes == sum(p.numel() * 2 for p in trainer.unwrapped.parameters())
    with trainer.serving(engine):
        pass
    metrics = trainer.step([Sample([1, 2, 3], [4, 5], [-1.0, -1.0], advantage=1.0)], engine=engine)
    assert metrics["engine/dtype"] == "bfloat16"  # in every step's row of the run's metrics


@pytest.mark.parametrize("setting, declared, cuda, want", [
    ("auto", torch.bfloat16, False, "bfloat16"), ("auto", torch.float16, True, "float16"),
    ("auto", torch.float32, False, "float32"), ("auto", None, False, "float32"),
    ("float32", torch.bfloat16, True, "float32"), ("bfloat16", torch.float32, False, "bfloat16"),
])
def test_engine_dtype_rule(setting, declared, cuda, want):
    from lmselfplay.lm.engines.vllm import engine_dtype

    model = SimpleNamespace(config=SimpleNamespace(dtype=declared))
    assert engine_dtype(setting, model, cuda=cuda) == want


def test_engine_dtype_on_cuda_is_half_for_a_float32_model(monkeypatch):
    from lmselfplay.lm.engines.vllm import engine_dtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    model = SimpleNamespace(config=SimpleNamespace(dtype=torch.float32))
    assert engine_dtype("auto", model, cuda=True) == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert engine_dtype("auto", model, cuda=True) == "float16"


def test_vllm_dtype_is_a_setting_the_factory_passes(fake_vllm, tmp_path):
    from lmselfplay.lm.engines import make_engine

    with pytest.raises(ConfigError, match="vllm_dtype"):  # EngineConfig's checks run in a recipe's parse
        SelfPlayConfigs.parse(["--vllm_dtype", "int8", "--output_dir", str(tmp_path)])
    cfg = parse_configs((EngineConfig,), ["--engine", "vllm", "--vllm_dtype", "float16"])[0]
    make_engine(cfg, tiny_model(), tiny_tokenizer(), answer_budget=64, temperature=1.0, top_p=1.0, seed=0)
    assert fake_vllm[-1].kwargs["dtype"] == "float16"


# --- 8: the push waits for the device before a bucket leaves ---------------------------------------

def test_each_bucket_leaves_only_after_the_device_synchronized(monkeypatch):
    events = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))

    @contextlib.contextmanager
    def gather(params):  # a ZeRO-3 gather: its kernels are queued when the bucket is built
        events.append("gather")
        yield

    for _ in weight_sync.iter_weight_buckets(tiny_model(), max_bytes=4096, gather=gather):
        events.append("yield")
    assert events.count("yield") > 2
    assert all(events[i - 1] == "sync" for i, e in enumerate(events) if e == "yield")


# --- 9: two colocated sleep-mode engines in one process --------------------------------------------

def test_r_zero_two_copies_with_sleep_mode_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="one sleep-mode engine per process") as e:
        RZeroConfigs.parse(["--two_copies", "true", "--engine", "vllm", "--vllm_enable_sleep_mode", "true",
                            "--output_dir", str(tmp_path)])
    assert "\n" not in str(e.value)
    for ok in (["--two_copies", "true", "--engine", "vllm"], ["--engine", "vllm", "--vllm_enable_sleep_mode", "true"]):
        RZeroConfigs.parse(ok + ["--output_dir", str(tmp_path)])


# --- the real engine (vLLM's CPU build) -----------------------------------------------------------

@pytest.mark.slow
def test_real_vllm_engine_serves_the_declared_dtype_after_the_upcast(tmp_path):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    # head_dim 64: vLLM's CPU attention kernels do not take the fixture's default head_dim 8
    path = tiny_model(seed=0, width=256).save_pretrained(tmp_path / "m") or tmp_path / "m"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)  # declared bfloat16 by its load
    tok = tiny_tokenizer()
    trainer = PolicyTrainer(model, tok, TrainerConfig(num_iterations=1, beta=0.0))
    engine = vllm_mod.VLLMEngine(trainer.unwrapped, tok, max_model_len=128, enforce_eager=True)
    try:
        assert engine.dtype == "bfloat16"
        # every weight vLLM holds, after the push of the trainer's float32 masters (no generate: vLLM
        # 0.32's CPU bfloat16 attention stops on an illegal instruction on this machine kind)
        held = engine.llm.apply_model(lambda m: sorted({str(p.dtype) for p in m.parameters()}))
        assert held == [["torch.bfloat16"]] and engine.last_sync.tensors > 0
    finally:
        engine.close()


@pytest.mark.slow
def test_real_vllm_engine_forfeits_a_prompt_over_max_model_len_and_serves_the_rest(tmp_path):
    pytest.importorskip("vllm")
    from lmselfplay.lm.engines.base import PROMPT_TOO_LONG, generate_fitting

    model = tiny_model(seed=0, width=256)
    tok = tiny_tokenizer()
    engine = vllm_mod.VLLMEngine(model, tok, max_model_len=64, enforce_eager=True)
    try:
        prompts = [[1, 5, 6], [1] + [7] * 100, [1, 8]]
        with pytest.warns(UserWarning, match="1 of 3 prompt"):
            out = generate_fitting(engine, prompts, SamplingParams(max_new_tokens=4, temperature=0.0))
        assert [o.finish_reason == PROMPT_TOO_LONG for o in out] == [False, True, False]
        assert out[1].token_ids == [] and len(out[0].token_ids) >= 1 and engine.over_long_prompts == 1
        # what it saves the run from (the message differs by vLLM version and entry point)
        with pytest.raises(Exception, match="maximum context length|longer than the maximum model length"):
            engine.generate(prompts[1:2], SamplingParams(max_new_tokens=4, temperature=0.0))
    finally:
        engine.close()
