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

def _selfplay(model_dir, out, urls, steps, **kw):
    from lmselfplay.utils.recipe_loader import run_recipe

    args = {"model_name_or_path": str(model_dir), "output_dir": str(out), "max_steps": steps, "games": "nim",
            "episodes_per_step": 4, "eval_every": 0, "checkpoint_every": 0, "league_add_every": 0,
            "max_new_tokens": 3, "engine": "vllm-server",
            "vllm_server_timeout": 30, "vllm_push_timeout": 30, "weight_sync_threshold": 0, **kw}
    run_recipe("selfplay_games", [x for k, v in args.items() for x in (f"--{k}", str(v))]
               + ["--vllm_server_urls", *urls])
    import json

    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_selfplay_recipe_overlaps_on_servers_and_logs_the_staleness(model_dir, tmp_path):
    from sim_server import SimServer

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
    from sim_server import SimServer

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

    from sim_server import SimServer

    from lmselfplay.utils.recipe_loader import run_recipe

    out = tmp_path / "run"
    with SimServer(vocab=len(tiny_tokenizer())) as a:
        run_recipe("debate", [
            "--model_name_or_path", str(model_dir), "--output_dir", str(out), "--max_steps", "2", "--eval_tasks", "2",
            "--eval_protocols", "debate", "--train_tasks", "8", "--debates_per_step", "2", "--max_new_tokens", "4",
            "--max_prompt_tokens", "240", "--num_rounds", "1", "--checkpoint_every", "0", "--engine", "vllm-server",
            "--vllm_server_urls", a.url, "--max_staleness", "1"])
    train = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if "train/loss" in r]
    assert [r["staleness/age"] for r in train] == [0.0, 1.0] and [r["staleness/dropped"] for r in train] == [0, 0]


class Inline:
    """``rollouts_for`` without the feature: each step ``with serving: play()`` for every role
    (the loop as it is without max_staleness), everything kept."""

    def __init__(self, cfg, trainer, engine, plan, also=()):
        self.pairs, self.plan = [(trainer, engine), *[(t, e) for t, e in also if e is not engine]], plan

    def next(self, step, last_step=None):
        from contextlib import ExitStack

        play = self.plan(step)
        with ExitStack() as stack:
            for t, e in self.pairs:
                stack.enter_context(t.serving(e))
            return play()

    def keep(self, samples, version):
        return samples, {}

    def close(self):
        pass


def _metrics(out, name="metrics.jsonl"):
    """The run's logged rows without what the clock decides (wall time, time shares, rates)."""
    import json

    rows = [json.loads(x) for x in (out / name).read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "wall_s" and not k.startswith("time/") and not k.endswith("_per_s")}
            for r in rows]


def test_selfplay_max_staleness_0_is_the_loop_without_the_hook(model_dir, tmp_path, monkeypatch):
    """max_staleness 0 against a server (its answers depend on the pushed weights) gives the
    metrics of the same run with the hook replaced by the plain ``with serving: play()``."""
    from sim_server import SimServer

    runs = []
    for hooked in (True, False):
        if not hooked:  # the recipe, loaded after this, imports the replacement
            monkeypatch.setattr("lmselfplay.rl.overlap.rollouts_for", Inline)
        with SimServer(vocab=len(tiny_tokenizer())) as a:
            rows = _selfplay(model_dir, tmp_path / f"run{hooked}", [a.url], 2, max_staleness=0)
        runs.append([{k: v for k, v in r.items() if k != "wall_s"} for r in rows])
    assert runs[0] == runs[1] and any("train/loss" in r for r in runs[0])


@pytest.mark.parametrize("args, says", [
    (["--max_staleness", "-1"], "max_staleness must be >= 0"),
    (["--max_staleness", "1"], "the hf engine shares the trainer's"),
    (["--max_staleness", "1", "--engine", "vllm", "--vllm_enable_sleep_mode", "true"], "use one or the other"),
])
def test_overlap_settings_that_cannot_work_are_config_errors(args, says):
    """Refused when the config is read, before any folder, model or engine is touched."""
    from lmselfplay.selfplay_games.config import SelfPlayConfigs
    from lmselfplay.utils.config import ConfigError

    with pytest.raises(ConfigError, match=says):
        SelfPlayConfigs.parse(args)


# --- data parallelism: each rank drops its own, all log the run's counts ---

def _two_ranks(fn):
    """``fn(rank, rank_sum)`` on two threads standing in for two data-parallel ranks, with
    ``rank_sum`` an element-wise all-reduce between them; the two results."""
    slots, results = [None, None], [None, None]
    barrier = threading.Barrier(2)

    def rank_sum_for(rank):
        def rank_sum(values):
            slots[rank] = list(values)
            barrier.wait()
            total = [a + b for a, b in zip(*slots)]
            barrier.wait()
            return total
        return rank_sum

    def run(rank):
        results[rank] = fn(rank, rank_sum_for(rank))

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def test_the_ranks_log_the_run_wide_staleness_counts():
    """Each rank drops its own stale rollouts (rank 0's are all three versions old, a
    supervised target stays) and both log the same counts, summed over the ranks."""
    target = Sample([1], [2], [0.0], target=(0, [2], [1.0]))

    def keep(rank, rank_sum):
        versions = (2, 2, 2) if rank == 0 else (5, 4, 3)
        kept, m = drop_stale([Sample([1], [2], [0.0], policy_version=v) for v in versions] + [target], 5, 1,
                             rank_sum)
        return [s.policy_version for s in kept if s.target is None], m

    (kept0, m0), (kept1, m1) = _two_ranks(keep)
    assert kept0 == [] and kept1 == [5, 4]
    assert m0 == m1 == {"staleness/dropped": 4.0, "staleness/age": 0.5}


# --- Absolute Zero, R-Zero, search self-play, debate resume ---

def _argv(args: dict, *extra: str) -> list[str]:
    return [x for k, v in args.items() for x in (f"--{k}", str(v))] + list(extra)


def _azr_args(model_dir, out, steps, **kw):
    """A tiny Absolute Zero run (a generous program timeout: none expires on a loaded machine)."""
    return {"model_name_or_path": model_dir, "output_dir": out, "max_steps": steps, "proposals_per_type": 1,
            "solve_tasks_per_type": 1, "num_generations": 2, "references": 1, "seed_programs": 2,
            "eval_tasks_per_type": 2, "eval_every": 0, "checkpoint_every": 1, "timeout_s": 10, "propose_max_new_tokens": 6,
            "solve_max_new_tokens": 4, "learning_rate": 1e-3, "save_datasets": "false", **kw}


def _server_args(*urls):
    return {"engine": "vllm-server", "vllm_server_timeout": 30, "vllm_push_timeout": 30}, ["--vllm_server_urls", *urls]


def test_absolute_zero_overlaps_on_two_servers(model_dir, tmp_path):
    from sim_server import SimServer

    from lmselfplay.utils.recipe_loader import run_recipe

    vocab = len(tiny_tokenizer())
    with SimServer(token_delay=0.001, vocab=vocab) as a, SimServer(token_delay=0.001, vocab=vocab) as b:
        server, urls = _server_args(a.url, b.url)
        run_recipe("absolute_zero", _argv(_azr_args(model_dir, tmp_path / "run", 3, max_staleness=1,
                                                          **server), *urls))
        pushed = [a.weights, b.weights]
    train = [r for r in _metrics(tmp_path / "run") if "train/samples" in r]
    assert [r["staleness/age"] for r in train] == [0.0, 1.0, 1.0]  # step 1 on-policy, then one version behind
    assert [r["staleness/dropped"] for r in train] == [0.0, 0.0, 0.0]
    assert pushed[0] == pushed[1] != "checkpoint"


def test_absolute_zero_drops_rollouts_older_than_max_staleness(model_dir, tmp_path, monkeypatch):
    """A push that never lands: the third step's proposals and attempts are two versions old."""
    from sim_server import SimServer

    from lmselfplay.lm.engines.vllm_server import VLLMServerEngine
    from lmselfplay.utils.recipe_loader import run_recipe

    real = VLLMServerEngine.update_weights
    monkeypatch.setattr(VLLMServerEngine, "update_weights",
                        lambda self, model, version=None: real(self, model, version) if version == 0 else None)
    with SimServer(vocab=len(tiny_tokenizer())) as a:
        server, urls = _server_args(a.url)
        run_recipe("absolute_zero", _argv(_azr_args(model_dir, tmp_path / "run", 3, max_staleness=1,
                                                          **server), *urls))
    train = [r for r in _metrics(tmp_path / "run") if "train/samples" in r]
    assert [r["staleness/dropped"] > 0 for r in train] == [False, False, True]
    assert [r["staleness/age"] for r in train][:2] == [0.0, 1.0] and train[2]["train/samples"] == 0.0


@pytest.mark.slow  # ~25 s
def test_absolute_zero_checkpoint_holds_the_buffers_its_step_left(model_dir, tmp_path, monkeypatch):
    """With overlap the next step's proposals enter the live buffers while this step trains and
    checkpoints: the checkpoint holds the buffers as this step left them (those of a run that
    ends at this step: the scripted proposer does not depend on the weights), and a run
    resumed from it ends with the buffers of the uninterrupted one."""
    import torch
    from absolute_zero_fakes import patch_make_engine, proposing_engine

    from lmselfplay.rl.trainer import PolicyTrainer
    from lmselfplay.utils.recipe_loader import run_recipe

    patch_make_engine(monkeypatch, lambda cfg, model, tok, **run: proposing_engine(tok))
    step = PolicyTrainer.step

    def slow_step(self, samples, **kw):  # training outlasts the next step's proposals
        time.sleep(0.3)
        return step(self, samples, **kw)

    monkeypatch.setattr(PolicyTrainer, "step", slow_step)
    overlap = {"max_staleness": 1, "engine": "vllm-server"}
    run_recipe("absolute_zero", _argv(_azr_args(model_dir, tmp_path / "overlap", 3, **overlap)))
    run_recipe("absolute_zero", _argv(_azr_args(model_dir, tmp_path / "cut", 2, **overlap)))  # its last step: nothing ahead
    run_recipe("absolute_zero", _argv(_azr_args(model_dir, tmp_path / "cut", 3, **overlap), "--resume", "true"))

    def buffers(name, step):
        state = tmp_path / name / f"checkpoint-{step}" / "lmselfplay_state.pt"
        return torch.load(state, weights_only=False)["extra"]["buffers"]

    assert buffers("cut", 2) != buffers("cut", 3)  # the buffers grow every step
    assert buffers("overlap", 2) == buffers("cut", 2)  # saved while step 3's proposals were entering
    assert buffers("cut", 3) == buffers("overlap", 3)


def test_absolute_zero_max_staleness_0_is_the_loop_without_the_hook(model_dir, tmp_path, monkeypatch):
    import lmselfplay.rl.overlap as overlap
    from lmselfplay.utils.recipe_loader import run_recipe

    runs = []
    for hooked in (True, False):
        if not hooked:  # run_recipe executes the recipe afresh: its import reads the patched name
            monkeypatch.setattr(overlap, "rollouts_for", Inline)
        run_recipe("absolute_zero", _argv(_azr_args(model_dir, tmp_path / f"run{hooked}", 2, max_staleness=0)))
        runs.append(_metrics(tmp_path / f"run{hooked}"))
    assert runs[0] == runs[1] and any("train/loss" in r for r in runs[0])


KEPT = [{"prompt": "What is 2 + 2? End with '#### <answer>'.", "label": "4", "truth": "4"},
        {"prompt": "What is 3 + 5? End with '#### <answer>'.", "label": "8", "truth": "8"}]


def _rz_args(model_dir, out, **kw):
    return {"model_name_or_path": model_dir, "output_dir": out, "rounds": 1, "challenger_steps": 3,
            "num_questions": 2, "challenger_group_size": 2, "pool_size": 2, "num_answers": 2, "solver_steps": 3,
            "solver_batch": 2, "solver_group_size": 2, "heldout_size": 2, "learning_rate": 1e-3,
            "challenger_max_new_tokens": 6, "solver_max_new_tokens": 4, "filter_low": 0, "filter_high": 2, **kw}


def _phases(out):
    rows = _metrics(out)
    return ([r for r in rows if "challenger/samples" in r], [r for r in rows if "solver/samples" in r])


@pytest.mark.parametrize("two_copies", [False, True])
def test_r_zero_overlaps_each_phase_on_servers(model_dir, tmp_path, monkeypatch, two_copies):
    """Both training phases one step ahead (the solver's on a fixed kept pool: a random tiny
    model writes no checkable question). Two copies: the challenger's own server and the
    solver's, each holding its model's weights."""
    from sim_server import SimServer

    from lmselfplay.lm.engines.vllm_server import VLLMServerEngine
    from lmselfplay.r_zero import checkpoints
    from lmselfplay.utils.recipe_loader import run_recipe

    monkeypatch.setattr(checkpoints, "load_kept", lambda path: [dict(r) for r in KEPT])
    models_per_servers = {}
    push = VLLMServerEngine.update_weights

    def recorded_push(self, model, version=None):  # which model's weights go to which servers
        models_per_servers.setdefault(tuple(s.url for s in self.pool.servers), set()).add(id(model))
        return push(self, model, version)

    monkeypatch.setattr(VLLMServerEngine, "update_weights", recorded_push)
    vocab = len(tiny_tokenizer())
    with SimServer(vocab=vocab) as a, SimServer(vocab=vocab) as b:
        server, urls = _server_args(a.url) if two_copies else _server_args(a.url, b.url)
        extra = {"two_copies": "true", "challenger_vllm_server_urls": b.url} if two_copies else {}
        run_recipe("r_zero", _argv(_rz_args(model_dir, tmp_path / "run", max_staleness=1, **server, **extra), *urls))
        servers = {(a.url,): "a", (b.url,): "b", (a.url, b.url): "a+b"}
    challenger, solver = _phases(tmp_path / "run")
    for phase in (challenger, solver):
        assert [r["staleness/age"] for r in phase] == [0.0, 1.0, 1.0]
        assert [r["staleness/dropped"] for r in phase] == [0.0, 0.0, 0.0]
    pushed = {servers[k]: len(v) for k, v in models_per_servers.items()}
    assert pushed == ({"a": 1, "b": 1} if two_copies else {"a+b": 1})  # one model per set of servers
    assert len(set().union(*models_per_servers.values())) == (2 if two_copies else 1)


def test_r_zero_max_staleness_0_is_the_loop_without_the_hook(model_dir, tmp_path, monkeypatch):
    from lmselfplay.r_zero import checkpoints, steps
    from lmselfplay.utils.recipe_loader import run_recipe

    runs = []
    for hooked in (True, False):
        monkeypatch.setattr(checkpoints, "load_kept", lambda path: [dict(r) for r in KEPT])
        if not hooked:
            monkeypatch.setattr(steps, "rollouts_for", Inline)
        run_recipe("r_zero", _argv(_rz_args(model_dir, tmp_path / f"run{hooked}", challenger_steps=2, solver_steps=2)))
        runs.append(_metrics(tmp_path / f"run{hooked}"))
    challenger, solver = _phases(tmp_path / "runTrue")
    assert runs[0] == runs[1] and len(challenger) == len(solver) == 2


@pytest.mark.parametrize("args, says", [
    (["--two_copies", "true", "--engine", "vllm-server"], "needs challenger_vllm_server_urls"),
    (["--two_copies", "true", "--engine", "vllm-server", "--vllm_server_urls", "http://a", "http://b",
      "--challenger_vllm_server_urls", "http://b"], "share \\['http://b'\\]"),
    (["--engine", "vllm-server", "--challenger_vllm_server_urls", "http://b"], "one policy uses vllm_server_urls"),
    (["--max_staleness", "1"], "the hf engine shares the trainer's"),
])
def test_r_zero_server_settings_that_cannot_work_are_config_errors(args, says):
    from lmselfplay.r_zero.config import RZeroConfigs

    with pytest.raises(ConfigError, match=says):
        RZeroConfigs.parse(args)


@pytest.mark.parametrize("where", ["cli", "yaml"])
def test_search_selfplay_has_no_max_staleness_and_says_why(where, tmp_path):
    """Search self-play has no engine to overlap: the flag does not exist in it, and giving it (as
    docs/scale.md's older text did) is a one-line error saying why."""
    from lmselfplay.search_selfplay.config import SearchSelfPlayConfigs

    argv = ["--max_staleness", "1"]
    if where == "yaml":
        (tmp_path / "c.yaml").write_text("max_staleness: 0\n")
        argv = ["--config", str(tmp_path / "c.yaml")]
    with pytest.raises(ConfigError, match=r"max_staleness is not used by this recipe: .*replay_window"):
        SearchSelfPlayConfigs.parse(argv)
    assert "max_staleness" not in SearchSelfPlayConfigs.parse([]).as_dict()


def _pushes_and_generations(monkeypatch):
    """Records ("push", version) and "generate" in the order the server engine sees them."""
    from lmselfplay.lm.engines.vllm_server import VLLMServerEngine

    events = []
    push, generate = VLLMServerEngine.update_weights, VLLMServerEngine.generate

    def recorded_push(self, model, version=None):
        events.append(("push", version))
        return push(self, model, version)

    def recorded_generate(self, prompts, sampling):
        events.append("generate")
        return generate(self, prompts, sampling)

    monkeypatch.setattr(VLLMServerEngine, "update_weights", recorded_push)
    monkeypatch.setattr(VLLMServerEngine, "generate", recorded_generate)
    return events


def _first_generation_after_resume(events):
    """The pushes before the resumed run's first generation (its build pushed version 0)."""
    return events[: events.index("generate")]


def test_a_resumed_debate_pushes_the_restored_weights_before_it_samples(model_dir, tmp_path, monkeypatch):
    """The server still holds what it loaded (the build pushes the initial weights): the
    resumed run's first serving must push step 1's weights before any debate is sampled."""
    from sim_server import SimServer

    from lmselfplay.utils.recipe_loader import run_recipe

    args = {"model_name_or_path": model_dir, "output_dir": tmp_path / "run", "eval_tasks": 2, "eval_protocols": "debate",
            "train_tasks": 8, "debates_per_step": 2, "max_new_tokens": 3, "max_prompt_tokens": 240, "num_rounds": 1,
            "checkpoint_every": 1, "eval_every": 0}
    with SimServer(vocab=len(tiny_tokenizer())) as a:
        server, urls = _server_args(a.url)
        run_recipe("debate", _argv({**args, **server, "max_steps": 1}, *urls))
        events = _pushes_and_generations(monkeypatch)
        run_recipe("debate", _argv({**args, **server, "max_steps": 2}, *urls, "--resume", "true"))
    assert _first_generation_after_resume(events) == [("push", 0), ("push", 1)]


def test_a_resumed_r_zero_pushes_the_restored_weights_before_it_samples(model_dir, tmp_path, monkeypatch):
    """Killed after the filter: the resumed run samples (its held-out answers) only after
    pushing the trained policy's weights."""
    import shutil

    from sim_server import SimServer

    from lmselfplay.utils.recipe_loader import run_recipe

    with SimServer(vocab=len(tiny_tokenizer())) as a:
        server, urls = _server_args(a.url)
        args = _rz_args(model_dir, tmp_path / "run", challenger_steps=1, solver_steps=1, **server)
        run_recipe("r_zero", _argv(args, *urls))
        for later in ("phase-0001-2", "final_model"):  # killed in the solver phase
            shutil.rmtree(tmp_path / "run" / later)
        events = _pushes_and_generations(monkeypatch)
        run_recipe("r_zero", _argv(args, *urls, "--resume", "true"))
    assert _first_generation_after_resume(events) == [("push", 0), ("push", 1)]


@pytest.mark.multiprocess
@pytest.mark.slow  # two launched ranks
@pytest.mark.parametrize("config", ["ddp_cpu.yaml", "zero3_cpu.yaml"])
def test_two_gloo_ranks_one_with_only_stale_rollouts(tmp_path, config):
    """Rank 0's rollouts all too old, rank 1's fresh: rank 0 trains on nothing, rank 1 on its
    three. The trainer's padded micro-batches keep the collectives in step (DDP, ZeRO-3: no
    hang, no NaN, the ranks stay equal), and with the ranks' sum both log the run-wide counts."""
    import json
    import subprocess
    import sys

    from mp_helpers import CONFIGS, ROOT, _env

    if config.startswith("zero3"):
        pytest.importorskip("deepspeed")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config),
           str(ROOT / "tests" / "mp_scripts" / "stale_ranks.py"), "--out", str(tmp_path)]
    r = subprocess.run(cmd, cwd=ROOT, env={**_env(), "ACCELERATE_USE_CPU": "1"}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    assert [rk["world"] for rk in ranks] == [2, 2]
    alone, summed = zip(*[rk["steps"] for rk in ranks])
    for step in (alone, summed):
        assert [s["kept"] for s in step] == [0, 3] and all(s["finite"] and s["ranks_equal"] for s in step)
        assert all(s["numel"] > 0 for s in step)  # full parameters compared, not ZeRO-3's placeholders
    assert [s["stale"]["staleness/dropped"] for s in alone] == [3.0, 0.0]  # each rank's own count
    assert [s["stale"] for s in summed] == [{"staleness/dropped": 3.0, "staleness/age": 0.0}] * 2
