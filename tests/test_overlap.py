"""max_staleness: 0 is the plain loop, k >= 1 generates one step ahead and drops what is too old."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from lm_fixtures import tiny_tokenizer

from lmselfplay.lm.trajectory import Sample
from lmselfplay.rl.overlap import OverlappedRollouts, drop_stale
from lmselfplay.utils.config import ConfigError


def _loop(max_staleness, steps=4, gen_s=0.0, train_s=0.0, lag=0):
    """A loop whose 'trainer' version is the step count; generation samples at the version last
    synced (minus ``lag``: an engine deliberately left behind)."""
    state = {"trainer": 0, "engine": 0}
    log = []

    def plan(step):
        def play():
            log.append(("gen", step, threading.current_thread() is threading.main_thread()))
            time.sleep(gen_s)
            return [Sample([1], [2], [-1.0], policy_version=state["engine"] - lag) for _ in range(3)]
        return play

    @contextmanager
    def serving():
        log.append(("sync", state["trainer"]))
        state["engine"] = state["trainer"]
        yield

    r = OverlappedRollouts(plan, max_staleness, SimpleNamespace(shares_module=False), serving=serving)
    out = []
    t0 = time.perf_counter()
    for step in range(steps):
        samples, m = r.next_batch(step, state["trainer"], last_step=steps - 1)
        out.append((len(samples), m))
        time.sleep(train_s)
        state["trainer"] += 1
    r.close()
    return log, out, time.perf_counter() - t0, r


def test_zero_is_the_plain_loop():
    log, out, _, _ = _loop(0)
    assert log == [x for s in range(4) for x in (("sync", s), ("gen", s, True))]  # in the caller, in order
    assert all(n == 3 and m == {} for n, m in out)


def test_one_overlaps_generation_with_training_and_keeps_one_step_old_rollouts():
    log, out, wall, _ = _loop(1, steps=5, gen_s=0.15, train_s=0.15)
    assert [x for x in log if x[0] == "gen"][1:] == [("gen", s, False) for s in range(1, 5)]  # background
    assert [n for n, _ in out] == [3] * 5 and all(m["staleness/dropped"] == 0 for _, m in out)
    assert [m["staleness/age"] for _, m in out][1:] == [1.0] * 4
    assert wall < 5 * 0.3 * 0.8  # overlapped: well under generation + training in series


def test_rollouts_older_than_k_are_dropped_and_counted():
    _, out, _, r = _loop(1, steps=3, lag=1)  # the engine is one more version behind: age 2 > k
    assert [n for n, _ in out][1:] == [0, 0] and r.dropped == 6
    kept, m = drop_stale([Sample([1], [2], [0.0], policy_version=v) for v in (5, 4, 3)], 5, 1)
    assert [s.policy_version for s in kept] == [5, 4] and m == {"staleness/dropped": 1.0, "staleness/age": 0.5}
    targets = [Sample([1], [], [], policy_version=0), Sample([1], [2], [0.0], target=(0, [2], [1.0]))]
    assert drop_stale(targets, 5, 1)[0] == targets  # sampled by no policy: never stale


def test_overlap_refuses_an_engine_sharing_the_trainers_module():
    with pytest.raises(ConfigError, match="vllm-server"):
        OverlappedRollouts(lambda s: [], 1, SimpleNamespace(shares_module=True))
    with pytest.raises(ConfigError, match=">= 0"):
        OverlappedRollouts(lambda s: [], -1)


def test_a_failing_background_generation_surfaces_in_the_caller():
    def play(step):
        if step == 1:
            raise RuntimeError("server exploded")
        return []

    r = OverlappedRollouts(lambda step: lambda: play(step), 1, None)
    r.next_batch(0, 0)
    with pytest.raises(RuntimeError, match="exploded"):
        r.next_batch(1, 1)


# --- the self-play recipe against simulated servers (engine vllm-server, weights pushed by checksum) ---

def _selfplay(model_dir, out, urls, steps, recipe=None, **kw):
    from lmselfplay.utils.recipe_loader import load_recipe

    args = {"model_name_or_path": str(model_dir), "output_dir": str(out), "max_steps": steps, "games": "nim",
            "episodes_per_step": 4, "eval_every": 0, "checkpoint_every": 0, "league_add_every": 0,
            "max_new_tokens": 3, "engine": "vllm-server",
            "vllm_server_timeout": 30, "vllm_push_timeout": 30, "staleness_threshold": 0, **kw}
    (recipe or load_recipe("selfplay_games")).main([x for k, v in args.items() for x in (f"--{k}", str(v))]
                                       + ["--vllm_server_urls", *urls])
    import json

    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_selfplay_recipe_overlaps_on_servers_and_logs_the_staleness(model_dir, tmp_path):
    from lmselfplay.lm.engines.sim_server import SimServer

    vocab = len(tiny_tokenizer())
    with SimServer(token_delay=0.002, vocab=vocab) as a, SimServer(token_delay=0.002, vocab=vocab) as b:
        rows = _selfplay(model_dir, tmp_path / "run", [a.url, b.url], 3, max_staleness=1)
        pushed = [a.weights, b.weights]
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert [r["staleness/age"] for r in train] == [0.0, 1.0, 1.0]  # step 1 on-policy, then one version behind
    assert [r["staleness/dropped"] for r in train] == [0.0, 0.0, 0.0]
    assert pushed[0] == pushed[1] != "checkpoint"  # both servers hold the trainer's weights


def test_selfplay_recipe_drops_games_older_than_max_staleness(model_dir, tmp_path, monkeypatch):
    """A push that never lands (the engine stays at version 0): the third step's games are
    two versions old, more than k = 1, and none is trained on."""
    from lmselfplay.lm.engines.sim_server import SimServer
    from lmselfplay.lm.engines.vllm_server import VLLMServerEngine

    real = VLLMServerEngine.update_weights
    monkeypatch.setattr(VLLMServerEngine, "update_weights",
                        lambda self, model, version=None: real(self, model, version) if version == 0 else None)
    with SimServer(vocab=len(tiny_tokenizer())) as a:
        rows = _selfplay(model_dir, tmp_path / "run", [a.url], 3, max_staleness=1)
    train = [r for r in rows if "train/loss" in r or "train/samples" in r]
    assert [r["staleness/dropped"] > 0 for r in train] == [False, False, True]
    assert [r["staleness/age"] for r in train][:2] == [0.0, 1.0] and train[2]["train/samples"] == 0.0


def test_debate_recipe_overlaps_on_a_server(model_dir, tmp_path):
    import json

    from lmselfplay.lm.engines.sim_server import SimServer
    from lmselfplay.utils.recipe_loader import load_recipe

    out = tmp_path / "run"
    with SimServer(vocab=len(tiny_tokenizer())) as a:
        load_recipe("debate").main([
            "--model_name_or_path", str(model_dir), "--output_dir", str(out), "--max_steps", "2", "--eval_tasks", "2",
            "--eval_protocols", "debate", "--train_tasks", "8", "--debates_per_step", "2", "--max_new_tokens", "4",
            "--max_prompt_tokens", "240", "--num_rounds", "1", "--checkpoint_every", "0", "--engine", "vllm-server",
            "--vllm_server_urls", a.url, "--max_staleness", "1"])
    train = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if "train/loss" in r]
    assert [r["staleness/age"] for r in train] == [0.0, 1.0] and [r["staleness/dropped"] for r in train] == [0, 0]


def test_selfplay_max_staleness_0_is_the_loop_without_the_hook(model_dir, tmp_path, monkeypatch):
    """max_staleness 0 against a server (its answers depend on the pushed weights) gives the
    metrics of the same run with the hook replaced by the plain ``with serving: play()``."""
    from lmselfplay.lm.engines.sim_server import SimServer
    from lmselfplay.utils.recipe_loader import load_recipe

    class Inline:  # the loop without the feature
        def __init__(self, cfg, trainer, engine, plan):
            self.trainer, self.engine, self.plan = trainer, engine, plan

        def next(self, step, last_step=None):
            play = self.plan(step)
            with self.trainer.serving(self.engine):
                return play()

        def keep(self, samples, version):
            return samples, {}

    runs = []
    for hooked in (True, False):
        recipe = load_recipe("selfplay_games")
        if not hooked:
            monkeypatch.setattr(recipe, "rollouts_for", Inline)
        with SimServer(vocab=len(tiny_tokenizer())) as a:
            rows = _selfplay(model_dir, tmp_path / f"run{hooked}", [a.url], 2, recipe, max_staleness=0)
        runs.append([{k: v for k, v in r.items() if k != "wall_s"} for r in rows])
    assert runs[0] == runs[1] and any("train/loss" in r for r in runs[0])


@pytest.mark.parametrize("args, says", [
    (["--max_staleness", "-1"], "max_staleness must be >= 0"),
    (["--max_staleness", "1"], "the hf engine shares the trainer's"),
    (["--max_staleness", "1", "--engine", "vllm", "--vllm_enable_sleep_mode", "true"], "use one or the other"),
])
def test_overlap_settings_that_cannot_work_are_config_errors(args, says):
    """Refused when the config is read, before any folder, model or engine is touched."""
    from lmselfplay.utils.config import ConfigError, parse_config
    from lmselfplay.utils.recipe_loader import load_recipe

    with pytest.raises(ConfigError, match=says):
        parse_config(load_recipe("selfplay_games").SelfPlayConfig, args)
