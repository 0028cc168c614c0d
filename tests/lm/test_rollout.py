"""Policy formatter, HF engine, rollouts and exact game metrics on tiny models."""

import json
import re

import pytest
from fake_engine import ScriptedEngine
from lm_fixtures import save_tiny, tiny_model, tiny_tokenizer

from lmselfplay.eval.game_metrics import optimal_move_rates, win_rates
from lmselfplay.games import make
from lmselfplay.games.bots import random_bot, solver_bot
from lmselfplay.games.text import format_answer
from lmselfplay.lm.engines import HFEngine, SamplingParams
from lmselfplay.lm.prompt import PLAIN_TEMPLATE, encode_completion, encode_prompt, format_prompt
from lmselfplay.lm.readout import answer_distribution, tabular_policy
from lmselfplay.lm.rollout import Episode, LLMPlayer, RolloutStats, collect_episodes
from lmselfplay.lm.trajectory import merge_identical
from lmselfplay.utils.stats import wilson


def _legal_moves(prompt_text: str) -> list[str]:
    line = [s for s in prompt_text.splitlines() if s.startswith("Legal moves:")][0]
    return line.split(":", 1)[1].split()


# --- the one formatter ---------------------------------------------------------------
def test_plain_format_and_bos():
    tok = tiny_tokenizer()
    ids = encode_prompt(tok, "hello")
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids[1:]) == PLAIN_TEMPLATE.format(prompt="hello")
    c = encode_completion(tok, "<move>3</move>")
    assert c[-1] == tok.eos_token_id and tok.decode(c[:-1]) == "<move>3</move>"


def test_chat_template_is_used_when_asked_for():
    """prompt_format chat uses the template; auto does not for a template whose turns do not
    end with the model's eos (the rule for base models that ship a template)."""
    import copy

    from lmselfplay.lm.prompt import PromptStyle, set_prompt_style

    tok = copy.deepcopy(tiny_tokenizer())
    tok.chat_template = "{% for m in messages %}<s>[U]{{ m['content'] }}[/U]{% endfor %}[A]"
    assert format_prompt(tok, "hi") == PLAIN_TEMPLATE.format(prompt="hi")
    set_prompt_style(tok, PromptStyle("chat"))
    assert format_prompt(tok, "hi") == "<s>[U]hi[/U][A]"
    assert tok.decode(encode_prompt(tok, "hi")) == "<s>[U]hi[/U][A]"


def test_rollout_tokens_are_the_training_tokens():
    """Token-level: what the engine was prompted with == encode_prompt(observation)."""
    tok = tiny_tokenizer()
    game = make("tictactoe")
    eng = ScriptedEngine(tok, lambda p: format_answer(_legal_moves(p)[0]))
    fin = collect_episodes([Episode(game, (LLMPlayer(eng, tok), LLMPlayer(eng, tok)))], SamplingParams())
    state = game.new_initial_state()
    for t in fin[0].trajectories[0].turns:
        assert t.prompt_ids == encode_prompt(tok, game.observation_text(state, 0))
        assert t.completion_ids == encode_completion(tok, t.text)
        state = game.apply(game.apply(state, t.action), t.action + 1) if not game.is_terminal(
            game.apply(state, t.action)) else state


# --- HF engine -----------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_teacher_forcing(temperature):
    tok = tiny_tokenizer()
    engine = HFEngine(tiny_model(seed=1), tok)
    game = make("nim")
    prompts = [encode_prompt(tok, game.observation_text(game.state_with(n), 0)) for n in range(1, 9)]
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=temperature, seed=3))
    scored = engine.score([o.prompt_ids for o in outs], [o.token_ids for o in outs], temperature=temperature)
    assert any(len(o.token_ids) > 3 for o in outs)
    for o, s in zip(outs, scored):
        assert len(o.logprobs) == len(o.token_ids) == len(s)
        assert o.logprobs == pytest.approx(s, abs=1e-4)


def test_generation_is_seeded_and_respects_limits():
    tok = tiny_tokenizer()
    engine = HFEngine(tiny_model(seed=2), tok, max_batch_size=3)  # forces several chunks
    p = [encode_prompt(tok, "Game: nim.")] * 7
    a = engine.generate(p, SamplingParams(max_new_tokens=5, seed=11))
    b = engine.generate(p, SamplingParams(max_new_tokens=5, seed=11))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert all(len(x.token_ids) <= 5 for x in a)
    assert all(x.finish_reason in ("eos", "stop", "length") for x in a)
    g1 = engine.generate(p[:2], SamplingParams(max_new_tokens=5, temperature=0))
    g2 = engine.generate(p[:2], SamplingParams(max_new_tokens=5, temperature=0))
    assert [x.token_ids for x in g1] == [x.token_ids for x in g2]


def test_update_weights_serves_new_parameters():
    tok = tiny_tokenizer()
    served, trained = tiny_model(seed=0), tiny_model(seed=5)
    engine = HFEngine(served, tok)
    p = [encode_prompt(tok, "x")]
    before = engine.score(p, [[5, 6, 7]])
    engine.update_weights(trained)
    assert engine.version == 1
    after = engine.score(p, [[5, 6, 7]])
    assert after[0] != pytest.approx(before[0])
    assert after[0] == pytest.approx(HFEngine(trained, tok).score(p, [[5, 6, 7]])[0], abs=1e-6)


# --- rollouts ------------------------------------------------------------------------
def test_scripted_selfplay_nim_trajectories_exact():
    """Both seats always take 1 from 5 stones: p0 takes the last stone and wins."""
    tok = tiny_tokenizer()
    eng = ScriptedEngine(tok, lambda p: "thinking... <move>1</move>", logprob=-0.25)
    me = LLMPlayer(eng, tok)
    game = make("nim", start=5)
    fin = collect_episodes([Episode(game, (me, me))], SamplingParams())
    (f,) = fin
    assert f.returns == [1.0, -1.0]
    t0, t1 = sorted(f.trajectories, key=lambda t: t.seat)
    assert (len(t0.turns), len(t1.turns)) == (3, 2)
    assert (t0.reward, t1.reward) == (1.0, -1.0)
    assert t0.role == "nim/p0/initial" and t0.opponent == "self"
    stones = [5, 3, 1]
    for turn, n in zip(t0.turns, stones):
        assert turn.prompt_ids == encode_prompt(tok, game.observation_text(game.state_with(n, 0), 0))
        assert turn.action == 0 and not turn.invalid
        assert turn.logprobs == [-0.25] * len(turn.completion_ids)
    s = t0.samples(advantage=0.5)[0]
    assert s.input_ids == s.prompt_ids + s.completion_ids
    assert s.action_mask == [0] * len(s.prompt_ids) + [1] * len(s.completion_ids)
    assert s.advantage == 0.5 and s.reward == 1.0
    assert len(eng.calls) == 5  # one engine call per ply (one game)


def test_all_pending_turns_share_one_engine_call():
    tok = tiny_tokenizer()
    eng = ScriptedEngine(tok, lambda p: format_answer(_legal_moves(p)[0]))
    me = LLMPlayer(eng, tok)
    eps = [Episode(make(n), (me, me), seed=i) for i, n in enumerate(["nim", "tictactoe", "kuhn_poker"] * 4)]
    stats = RolloutStats()
    fin = collect_episodes(eps, SamplingParams(), concurrency=12, stats=stats)
    assert len(fin) == 12
    # nim from 15 taking 1 lasts 15 plies: the longest game bounds the number of calls
    assert len(eng.calls) == 15
    assert len(eng.calls[0]) == 12  # first call: every game's first turn together
    assert stats.llm_turns == sum(len(c) for c in eng.calls)


def test_invalid_answer_forfeits_zero_sum_with_retries():
    tok = tiny_tokenizer()
    answers = iter(["no idea", "<move>9</move>", "<move>2</move>"] + ["<move>1</move>"] * 50)
    eng = ScriptedEngine(tok, lambda p: next(answers))
    me = LLMPlayer(eng, tok)
    game = make("nim", start=4)
    stats = RolloutStats()
    (f,) = collect_episodes([Episode(game, (me, random_bot()))], SamplingParams(), retries=2, stats=stats)
    # two bad answers, then a legal one on the last retry
    assert stats.invalid_answers == 2 and stats.forfeits == 0
    assert [t.invalid for t in f.trajectories[0].turns[:3]] == [True, True, False]
    eng2 = ScriptedEngine(tok, lambda p: "pass")
    stats2 = RolloutStats()
    (f2,) = collect_episodes([Episode(game, (random_bot(), LLMPlayer(eng2, tok)), seed=1)], SamplingParams(),
                     retries=0, stats=stats2)
    assert f2.returns == [1.0, -1.0] and stats2.forfeits == 1
    assert f2.trajectories[0].invalid and f2.trajectories[0].reward == -1.0


def test_max_turns_truncates_as_draw():
    tok = tiny_tokenizer()
    eng = ScriptedEngine(tok, lambda p: "<move>1</move>")
    me = LLMPlayer(eng, tok)
    (f,) = collect_episodes([Episode(make("nim", start=15), (me, me))], SamplingParams(), max_turns=4)
    assert f.returns == [0.0, 0.0] and f.trajectories[0].truncated


def test_merge_identical_sums_advantages():
    tok = tiny_tokenizer()
    eng = ScriptedEngine(tok, lambda p: "<move>1</move>")
    me = LLMPlayer(eng, tok)
    fin = collect_episodes([Episode(make("nim", start=3), (me, me), seed=i) for i in range(10)], SamplingParams())
    samples = [s for f in fin for t in f.trajectories for s in t.samples(advantage=float(t.reward))]
    merged = merge_identical(samples)
    assert len(samples) == 30 and len(merged) == 3
    assert sum(m.weight for m in merged) == 30
    assert sum(m.advantage for m in merged) == sum(s.advantage for s in samples)


# --- exact metrics -------------------------------------------------------------------
def test_optimal_move_rates_with_a_perfect_scripted_policy():
    tok = tiny_tokenizer()
    game = make("nim", start=9)

    def best(prompt):
        n = int(re.search(r"Stones: (\d+)", prompt).group(1))
        return format_answer(str(n % 4 or 1))

    def score(prompt, completion):
        return 0.0 if completion.strip() == best(prompt) else -50.0

    eng = ScriptedEngine(tok, best, score_fn=score)
    r = optimal_move_rates(eng, tok, game)
    assert r["greedy_optimal_rate"] == 1.0 and r["greedy_legal_rate"] == 1.0
    assert r["expected_optimal_prob"] == pytest.approx(1.0)
    reach, frontier = {(9, 0)}, [(9, 0)]
    while frontier:
        n, p = frontier.pop()
        for k in (1, 2, 3):
            if n - k > 0 and (n - k, 1 - p) not in reach:
                reach.add((n - k, 1 - p))
                frontier.append((n - k, 1 - p))
    assert r["positions"] == len(reach) == 16

    uniform = ScriptedEngine(tok, lambda p: "<move>1</move>", score_fn=lambda p, c: 0.0)
    dist = answer_distribution(uniform, tok, game, [game.state_with(9)])
    assert dist == [pytest.approx({0: 1 / 3, 1: 1 / 3, 2: 1 / 3})]


def test_kuhn_policy_reads_all_12_information_sets():
    tok = tiny_tokenizer()
    eng = ScriptedEngine(tok, lambda p: "<move>bet</move>", score_fn=lambda p, c: 0.0)
    pol = tabular_policy(eng, tok, make("kuhn_poker"))
    assert len(pol) == 12 and all(v == pytest.approx([0.5, 0.5]) for v in pol.values())
    from lmselfplay.games.exploitability import exploitability

    assert exploitability(make("kuhn_poker"), pol) == pytest.approx(0.4583333333, abs=1e-9)


def test_wilson_interval_known_values():
    """Wilson score intervals at z = 1.96, computed by hand."""
    assert wilson(10, 20) == pytest.approx((0.29930, 0.70070), abs=1e-4)
    assert wilson(0, 20) == pytest.approx((0.0, 0.16113), abs=1e-4)
    assert wilson(20, 20) == pytest.approx((0.83887, 1.0), abs=1e-4)


def test_win_rates_against_exact_and_random():
    tok = tiny_tokenizer()
    always_first_legal = ScriptedEngine(tok, lambda p: format_answer(_legal_moves(p)[0]))
    game = make("tictactoe")
    r = win_rates(always_first_legal, tok, game, solver_bot(), n_games=20)
    assert r["win"] == 0.0 and r["loss"] > 0.5  # the solver never loses
    assert r["loss_ci"] == wilson(round(r["loss"] * 20), 20)
    r2 = win_rates(always_first_legal, tok, make("nim"), random_bot(), n_games=40)
    assert r2["draw"] == 0.0 and r2["mean_return"] == pytest.approx(r2["win"] - r2["loss"])


def test_play_cli_person_vs_model(tmp_path):
    from lmselfplay.human_play import main

    save_tiny(tmp_path, seed=4)
    moves = iter(["banana", "3", "3", "3", "3", "3"])
    lines = []
    assert main(["nim", "--model", str(tmp_path)], input_fn=lambda _: next(moves), out=lines.append) == 0
    text = "\n".join(lines)
    assert "not a legal move" in text  # "banana" was refused with the reason
    assert "Stones: 15" in text and ("you win" in text or "you lose" in text)


def test_play_cli_prompts_the_model_in_its_text_and_the_person_in_the_games(tmp_path, monkeypatch):
    from lmselfplay import human_play
    from lmselfplay.games.model_texts import GAME_PARAMS_ATTR

    save_tiny(tmp_path, seed=4)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {GAME_PARAMS_ATTR: "tictactoe.board=cells"}))
    prompts = []

    def engine(model, tok):
        return ScriptedEngine(tok, lambda prompt: prompts.append(prompt) or "<move>5</move>")

    monkeypatch.setattr(human_play, "HFEngine", engine)
    lines = []
    assert human_play.main(["tictactoe", "--model", str(tmp_path), "--seat", "2"],
                           input_fn=lambda _: "quit", out=lines.append) == 0
    assert "5_" in prompts[0] and "Legal moves" not in prompts[0]  # the model's cells text
    assert "4 X 6" in "\n".join(lines) and "Legal moves" in "\n".join(lines)  # the person's view


def test_stop_strings_cut_the_completion_with_no_padding_after():
    tok = tiny_tokenizer()
    engine = HFEngine(tiny_model(seed=6), tok)
    p = [encode_prompt(tok, "Game: nim.")] * 6
    free = engine.generate(p, SamplingParams(max_new_tokens=8, seed=2))
    stops = sorted({o.text[:2] for o in free if len(o.text) >= 2})  # strings the model does produce
    outs = engine.generate(p, SamplingParams(max_new_tokens=8, seed=2, stop=stops))
    assert any(o.finish_reason == "stop" for o in outs)
    for o, f in zip(outs, free):
        if o.finish_reason == "stop":
            assert any(s in o.text for s in stops)
            assert not any(s in tok.decode(o.token_ids[:-1]) for s in stops)  # cut at the first
            assert o.token_ids == f.token_ids[: len(o.token_ids)]  # same sample, just cut
            assert tok.pad_token_id not in o.token_ids
        assert len(o.logprobs) == len(o.token_ids)
    scored = engine.score([o.prompt_ids for o in outs], [o.token_ids for o in outs])
    for o, s in zip(outs, scored):
        assert o.logprobs == pytest.approx(s, abs=1e-4)


def test_a_forfeit_costs_the_largest_stake_so_no_legal_line_is_worse():
    """Kuhn: folding costs 1 chip, so a forfeit must cost 2 (else nonsense = folding)."""
    from lmselfplay.games.base import all_states

    for name in ("nim", "tictactoe", "kuhn_poker"):
        game = make(name)
        worst = max(abs(r) for s in all_states(game) if game.is_terminal(s) for r in game.returns(s))
        assert game.max_utility == worst, name
    tok = tiny_tokenizer()
    eng = ScriptedEngine(tok, lambda p: "fold!")
    (f,) = collect_episodes([Episode(make("kuhn_poker"), (LLMPlayer(eng, tok), random_bot()), seed=3)], SamplingParams())
    assert f.returns == [-2.0, 2.0] and f.trajectories[0].reward == -2.0


def test_games_with_their_own_sampling_share_one_engine_call_per_ply():
    """Episodes that bring equal sampling settings are batched together (one call), apart
    from the episodes that use the call's default; the override's budget is honoured."""
    tok = tiny_tokenizer()
    seen = []
    eng = ScriptedEngine(tok, lambda p: format_answer(_legal_moves(p)[0]))
    orig = eng.generate

    def generate(prompts, sampling):
        seen.append((len(prompts), sampling.max_new_tokens))
        return orig(prompts, sampling)

    eng.generate = generate
    me = LLMPlayer(eng, tok)
    long = [SamplingParams(max_new_tokens=40) for _ in range(3)]  # equal values, distinct objects
    eps = [Episode(make("nim", start=1), (me, me), seed=i, sampling=long[i]) for i in range(3)]
    eps += [Episode(make("nim", start=1), (me, me), seed=10 + i) for i in range(2)]
    done = collect_episodes(eps, SamplingParams(max_new_tokens=6, seed=1))
    assert len(done) == 5
    assert sorted(seen) == [(2, 6), (3, 40)]
