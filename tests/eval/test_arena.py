"""Arena: Bradley-Terry recovers known strengths, agrees with an independent fit, warns
on cycles; the round robin plays both seats through batched rollouts."""

import json
import warnings

import numpy as np
import pytest
from fake_engine import ScriptedEngine
from lm_fixtures import tiny_tokenizer
from scipy.optimize import minimize

from lmselfplay.cli import main as cli_main
from lmselfplay.eval.arena import (
    ELO,
    MEAN_RATING,
    Results,
    find_cycles,
    fit_bradley_terry,
    make_bot,
    rate,
    round_robin,
)
from lmselfplay.games import make
from lmselfplay.games.bots import random_bot
from lmselfplay.lm.rollout import LLMPlayer


def simulate(true_elo, games, seed):
    rng = np.random.default_rng(seed)
    n = len(true_elo)
    wins, draws = np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            p = 1 / (1 + 10 ** ((true_elo[j] - true_elo[i]) / 400))
            k = rng.binomial(games, p)
            wins[i, j], wins[j, i] = k, games - k
    return Results([f"p{i}" for i in range(n)], wins, draws)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bradley_terry_recovers_known_strengths(seed):
    true = np.array([0.0, 100.0, 250.0, 400.0, 700.0])
    res = simulate(true, games=300, seed=seed)
    out = rate(res, n_boot=200, seed=seed)
    want = true - true.mean() + MEAN_RATING
    for i, name in enumerate(res.names):
        r = out["ratings"][name]
        assert r["ci"][0] <= want[i] <= r["ci"][1], (name, r, want[i])
        assert r["ci"][1] - r["ci"][0] < 120  # informative, not vacuous
    assert list(out["ratings"]) == ["p4", "p3", "p2", "p1", "p0"]  # sorted best first
    assert out["cycles"] == []


def test_bradley_terry_matches_an_independent_fit():
    res = simulate(np.array([0.0, 50.0, 300.0, 320.0]), games=80, seed=3)
    res.draws[0, 1] = res.draws[1, 0] = 10
    s = res.wins + 0.5 * res.draws + 0.5  # the fit's one virtual draw per pair

    def nll(r):
        d = r[:, None] - r[None, :]
        return float((s * np.logaddexp(0, -d)).sum())

    ref = minimize(nll, np.zeros(4), method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12,
                                                                    "maxiter": 20000}).x
    ref = (ref - ref.mean()) * ELO + MEAN_RATING
    np.testing.assert_allclose(fit_bradley_terry(res.wins, res.draws), ref, atol=0.05)


def test_perfect_record_gives_a_finite_rating():
    wins = np.array([[0, 50], [0, 0]], dtype=float)
    r = fit_bradley_terry(wins, np.zeros((2, 2)))
    assert np.all(np.isfinite(r)) and r[0] > r[1] + 500


def test_cycle_warning_names_the_cycle():
    # rock > scissors > paper > rock, and a weak fourth player everyone beats
    names = ["rock", "paper", "scissors", "weak"]
    w = np.zeros((4, 4))
    for a, b in [(0, 2), (2, 1), (1, 0)]:
        w[a, b], w[b, a] = 70, 30
    for a in range(3):
        w[a, 3] = 90
        w[3, a] = 10
    with pytest.warns(UserWarning, match="rock > scissors > paper > rock"):
        out = rate(Results(names, w, np.zeros((4, 4))), n_boot=20)
    assert out["cycles"] == [["rock", "scissors", "paper"]]
    # transitive results: no warning
    res = simulate(np.array([0.0, 200.0, 400.0]), 100, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rate(res, n_boot=20)["cycles"] == []


def test_longer_cycle_without_a_triangle():
    share = np.full((4, 4), np.nan)
    for a, b in [(0, 1), (1, 2), (2, 3), (3, 0)]:  # a 4-cycle; other pairs tie
        share[a, b], share[b, a] = 0.6, 0.4
    share[0, 2] = share[2, 0] = share[1, 3] = share[3, 1] = 0.5
    assert find_cycles(list("ABCD"), share) == [["A", "B", "C", "D"]]


def test_round_robin_plays_both_seats_in_batched_calls():
    game = make("tictactoe")
    tok = tiny_tokenizer()
    # a scripted "model" that always answers with an illegal move: it must forfeit every game
    eng = ScriptedEngine(tok, lambda prompt: "<move>zz</move>")
    players = {"junk": LLMPlayer(eng, tok, learner=False, name="junk"), "random": random_bot(),
               "exact": make_bot(game, "exact")}
    res = round_robin(game, players, games=20, seed=0, progress=False)
    g = res.games
    assert g[0, 1] == g[0, 2] == g[1, 2] == 20
    assert res.wins[0].sum() == 0 and res.draws[0].sum() == 0  # junk forfeits all 40 games
    assert res.wins[2, 1] + res.draws[2, 1] == 20  # the exact solver never loses to random
    # every junk turn of all 40 games went through few, batched engine calls
    assert sum(len(c) for c in eng.calls) == 40 and len(eng.calls) <= 2


def test_arena_cli_with_bots(tmp_path, capsys):
    assert cli_main(["arena", "nim", "--bots", "random,exact", "--games", "20", "--bootstrap", "20",
                     "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "arena_nim.json").read_text())
    assert list(data["ratings"]) == ["exact", "random"]
    assert (tmp_path / "arena_nim.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "exact" in capsys.readouterr().out
    assert cli_main(["arena", "nim", "--bots", "random", "--out", str(tmp_path)]) == 2  # one player
    assert cli_main(["arena", "nim", "--bots", "random,oracle", "--out", str(tmp_path)]) == 2


def test_the_arena_game_is_in_the_text_its_models_read(tmp_path):
    from lmselfplay.eval.arena import game_for_models
    from lmselfplay.games.model_texts import GAME_PARAMS_ATTR

    def model(name, params):
        (tmp_path / name).mkdir()
        config = {GAME_PARAMS_ATTR: params} if params else {}
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        return str(tmp_path / name)

    a, b, plain = model("a", "tictactoe.board=cells"), model("b", "tictactoe.board=cells"), model("c", "")
    assert game_for_models("tictactoe", [a, b]).board == "cells"
    assert game_for_models("tictactoe", [plain]).board == game_for_models("tictactoe", []).board == "digits"
    assert game_for_models("nim", [a, plain]).name == "nim"  # they read Nim alike
    with pytest.raises(ValueError, match="different texts"):
        game_for_models("tictactoe", [a, plain])
    assert cli_main(["arena", "tictactoe", "--models", a, plain, "--out", str(tmp_path / "out")]) == 2


def test_two_models_share_the_batched_rollout_and_swap_seats():
    # Nim from 15 stones, both sides always take 1: the first seat takes the last stone.
    # Over both seatings each model wins exactly half; "junk" always answers illegally.
    game = make("nim")
    tok = tiny_tokenizer()
    engines = {n: ScriptedEngine(tok, lambda prompt: "<move>1</move>") for n in ("a", "b")}
    engines["junk"] = ScriptedEngine(tok, lambda prompt: "<move>0</move>")
    players = {n: LLMPlayer(e, tok, learner=False, name=n) for n, e in engines.items()}
    res = round_robin(game, players, games=20, seed=1, progress=False)
    assert res.wins[0, 1] == res.wins[1, 0] == 10
    assert res.wins[0, 2] == res.wins[1, 2] == 20 and res.wins[2].sum() == 0
    # all games were live together: each engine answered in one call per ply, not per game
    assert len(engines["a"].calls) <= 16 and max(len(c) for c in engines["a"].calls) >= 20


def test_checkpoint_dirs_of_a_run_load_as_models(tmp_path, capsys):
    from lm_fixtures import save_tiny

    for step in (1, 2):  # the trainer's layout: checkpoint-N/model/{config.json, ...}
        save_tiny(tmp_path / "run" / f"checkpoint-{step}" / "model", seed=step)
    ckpts = [str(tmp_path / "run" / f"checkpoint-{s}") for s in (1, 2)]
    assert cli_main(["arena", "nim", "--models", *ckpts, "--bots", "random", "--games", "6",
                     "--bootstrap", "10", "--device", "cpu", "--out", str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "arena_nim.json").read_text())
    assert set(data["ratings"]) == {"checkpoint-1", "checkpoint-2", "random"}
    assert all(r["games"] == 12 for r in data["ratings"].values())


def test_a_perfect_record_gets_an_interval_and_is_marked(tmp_path, capsys):
    # exact never loses at Nim against random: the ML rating does not exist, the prior holds it
    assert cli_main(["arena", "nim", "--bots", "random,exact", "--games", "20", "--bootstrap", "50",
                     "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "arena_nim.json").read_text())
    exact = data["ratings"]["exact"]
    assert exact["perfect_record"] and data["ratings"]["random"]["perfect_record"]
    assert exact["ci"][1] - exact["ci"][0] > 10  # an interval, not the point [1961, 1961]
    assert exact["ci"][0] < exact["elo"] <= exact["ci"][1] + 1e-9
    assert "perfect record" in capsys.readouterr().out


def test_heatmap_keeps_its_title_and_labels_inside_the_picture(tmp_path):
    from PIL import Image

    share = np.array([[np.nan, 1.0], [0.0, np.nan]])
    from lmselfplay.eval.arena import heatmap

    png = heatmap(["random", "exact"], share, tmp_path / "h.png",
                        "nim: score share (row vs column)")
    width, height = Image.open(png).size
    assert width >= 400 and height >= 300
