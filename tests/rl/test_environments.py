"""This project's games as environments for other trainers (lmselfplay/rl/environments.py,
lmselfplay/rl/openenv_env.py): the core against fixed opponents, TRL's GRPOTrainer with the
environment class, an OpenEnv client against the served environment."""

import random
import socket
import threading
import time

import pytest

from lmselfplay.games import make
from lmselfplay.games.base import move_text
from lmselfplay.games.solve import optimal_actions
from lmselfplay.games.text import format_answer
from lmselfplay.rl.environments import GameEnvironment, trl_environment


def _play_random(env, rng):
    obs, total, steps = env.reset(seed=rng.randrange(10**6)), 0.0, 0
    assert obs == env.game.observation_text(env.state, env.seat)
    while True:
        legal = env.game.legal_actions(env.state)
        out = env.step(format_answer(move_text(env.game, env.state, rng.choice(legal))))
        steps += 1
        total += out.reward
        if out.done:
            return out, total, steps
        assert out.reward == 0.0 and out.observation == env.game.observation_text(env.state, env.seat)


@pytest.mark.parametrize("game", ["kuhn_poker", "tictactoe", "nim"])
def test_games_end_with_zero_sum_returns(game):
    env, rng = GameEnvironment(game, "random", seed=0), random.Random(0)
    seats = set()
    for _ in range(40):
        out, total, _ = _play_random(env, rng)
        seats.add(env.seat)
        assert sum(env.returns) == pytest.approx(0.0)
        assert total == env.returns[env.seat] and out.observation == ""
    assert seats == {0, 1}


def test_an_illegal_answer_forfeits_the_largest_stake():
    env = GameEnvironment("kuhn_poker", "random", seat=0)
    assert "Your card" in env.reset(seed=1)
    out = env.step("I fold, I guess")
    assert out.done and out.reward == -2.0 and env.returns == [-2.0, 2.0]
    assert "no <move>" in out.info["invalid"]
    with pytest.raises(RuntimeError):
        env.step("<move>bet</move>")


def test_the_exact_opponent_never_loses_to_the_exact_learner():
    env, rng = GameEnvironment("tictactoe", "exact", seed=0), random.Random(1)
    for _ in range(10):
        env.reset()
        out = None
        while out is None or not out.done:
            a = rng.choice(optimal_actions(env.game, env.state))
            out = env.step(format_answer(env.game.action_text(a)))
        assert out.reward == 0.0  # optimal play against optimal play draws


def test_openspiel_games_and_bad_names():
    pytest.importorskip("pyspiel")
    env = GameEnvironment("openspiel:leduc_poker", "random", seed=0)
    out, _, _ = _play_random(env, random.Random(0))
    assert out.done and abs(out.reward) <= env.game.max_utility
    with pytest.raises(ValueError, match="neither a bot"):
        GameEnvironment("kuhn_poker", "no_such_bot")
    with pytest.raises(KeyError):
        GameEnvironment("no_such_game")


@pytest.mark.slow
def test_a_frozen_checkpoint_opponent():
    """The embedded model as the opponent: it answers at its turns; its illegal answer is its forfeit."""
    from lmselfplay.models.cache import ensure_tiny_model

    env = GameEnvironment("kuhn_poker", str(ensure_tiny_model()), seat=1, seed=0)
    rng = random.Random(0)
    for _ in range(6):
        out, _, _ = _play_random(env, rng)
        assert out.done and sum(env.returns) == 0 and out.info["invalid"] is None
        assert env.moves  # the checkpoint moved first (or forfeited its first answer: +2 to the learner)
        assert len(env.moves) >= 2 or out.reward == 2.0


def test_trl_environment_class_contract():
    """What TRL reads of the class (trl/trainer/grpo_trainer.py): public functions other than reset and
    get_reward are the tools: here only `move`."""
    import inspect

    cls = trl_environment("tictactoe", "random", seat=0)
    tools = [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
             if not n.startswith("_") and n not in ("reset", "get_reward")]
    assert tools == ["move"]
    env = cls()
    assert "You play X" in env.reset(prompt="ignored")
    reply = env.move("5")
    assert "You play X" in reply or "Game over" in reply
    assert env.get_reward() in (-1.0, 0.0, 1.0)  # an unfinished game is forfeited: -1
    env.reset()
    assert "Illegal move" in env.move("10") and env.get_reward() == -1.0
    with pytest.raises(ValueError):
        trl_environment("kuhn_poker", "nobody")


@pytest.mark.slow
def test_trl_grpo_trainer_runs_two_steps_with_the_environment(tmp_path):
    """TRL's GRPOTrainer, unchanged, on the embedded model with the Kuhn poker environment: two steps,
    the rewards from the environment (a chat template that renders tool calls: TRL's Qwen2.5 one)."""
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from lmselfplay.models.cache import ensure_tiny_model

    folder = ensure_tiny_model()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    tok.chat_template = qwen2_5_chat_template
    tok.padding_side = "left"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    cfg = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], save_strategy="no", logging_steps=1,
                     disable_tqdm=True, per_device_train_batch_size=4, num_generations=4, max_completion_length=24,
                     max_steps=2, learning_rate=1e-5, dataloader_num_workers=0, max_tool_calling_iterations=2)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Play Kuhn poker. "}]] * 8})
    env_cls = trl_environment("kuhn_poker", "random")
    trainer = GRPOTrainer(model=model, args=cfg, processing_class=tok, train_dataset=data,
                          environment_factory=env_cls)
    trainer.train()
    logged = [r for r in trainer.state.log_history if f"rewards/{env_cls.__name__}/mean" in r]
    assert trainer.state.global_step == 2 and len(logged) == 2
    assert all(-2.0 <= r[f"rewards/{env_cls.__name__}/mean"] <= 2.0 for r in logged)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_openenv_client_plays_a_served_game():
    pytest.importorskip("openenv")
    uvicorn = pytest.importorskip("uvicorn")
    from lmselfplay.rl.openenv_env import GameAction, GameClient, app

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app("tictactoe", "random"), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.1)
        game = make("tictactoe")
        with GameClient(base_url=f"http://127.0.0.1:{port}").sync() as client:
            for seed in range(3):
                result = client.reset(seed=seed)
                assert "Get three in a row" in result.observation.text
                while not result.done:
                    legal = [n for n in result.observation.text.split("Legal moves: ")[1].split("\n")[0].split()]
                    result = client.step(GameAction(answer=f"thinking... <move>{legal[0]}</move>"))
                state = client.state()
                assert state.done and sum(state.returns) == 0 and result.reward == state.returns[state.seat]
                assert all(m in {game.action_text(a) for a in range(9)} for m in state.moves)
            result = client.reset(seed=9)
            result = client.step(GameAction(answer="<move>0</move>"))
            assert result.done and result.reward == -1.0 and result.observation.invalid
    finally:
        server.should_exit = True
        thread.join(timeout=10)
