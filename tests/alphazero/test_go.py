"""AlphaZero on Go: the conv net, symmetry augmentation, and a short recipe run."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from lmselfplay.alphazero.config import AlphaZeroConfigs
from lmselfplay.alphazero.iteration import make_game_and_network, symmetry
from lmselfplay.alphazero.network import ConvPolicyValueNet, alphazero_loss
from lmselfplay.games import make
from lmselfplay.games.go import Go
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.metrics_logger import read_jsonl
from lmselfplay.utils.recipe_loader import run_recipe

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--game", "go", "--game_args", '{"size": 5}', "--network", "conv", "--hidden", "8",
        "--blocks", "1", "--games_per_iteration", "4", "--n_sims", "2", "--train_steps", "3",
        "--batch_size", "16", "--eval_games", "2", "--eval_budgets", "0", "2",
        "--winrate_games", "2", "--temperature_moves", "4", "--score_weight", "0.5",
        "--tensorboard", "false", "--progress", "false"]


def test_conv_net_masks_illegal_moves_and_learns_a_target():
    g = Go(5)
    states = [g.new_initial_state()]
    for a in (g.point("C3"), g.point("C4"), g.point("D3")):
        states.append(g.apply(states[-1], a))
    x = torch.from_numpy(np.stack([g.encode(s) for s in states]))
    legal = torch.from_numpy(g.legal_masks(states))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = ConvPolicyValueNet(x.shape[1:], g.n_actions, channels=8, blocks=2)
    logp, v = net(x, legal)
    assert logp.shape == (4, 26) and v.shape == (4,)
    assert torch.isinf(logp[~legal]).all() and torch.isfinite(logp[legal]).all()
    pi = torch.zeros(4, 26)
    pi[:, g.pass_action] = 1.0
    z = torch.tensor([1.0, -1.0, 1.0, -1.0])
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(60):
        loss, parts = alphazero_loss(net, x, legal, pi, z)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    logp, v = net(x, legal)
    assert logp[:, g.pass_action].exp().min() > 0.9
    assert torch.allclose(v, z, atol=0.2)


def test_symmetry_augmentation_matches_the_transformed_game():
    g = Go(7)
    rng = random.Random(0)
    s = g.new_initial_state()
    actions = []
    for _ in range(12):
        actions.append(rng.choice(g.legal_actions(s)[:-1]))
        s = g.apply(s, actions[-1])
    a = rng.choice(g.legal_actions(s)[:-1])
    pi = np.zeros((1, g.n_actions), dtype=np.float32)
    pi[0, a] = 1.0
    batch = (g.encode(s)[None], g.legal_masks([s]), pi, np.ones(1, dtype=np.float32))
    for k in range(8):
        perm = g.symmetry_actions(k)
        t = g.new_initial_state()
        for b in actions:
            t = g.apply(t, int(perm[b]))
        x, legal, moved_pi, _ = symmetry(g, batch, k)
        np.testing.assert_array_equal(x[0], g.encode(t))
        np.testing.assert_array_equal(legal[0], g.legal_masks([t])[0])
        assert moved_pi[0, perm[a]] == 1.0 and moved_pi.sum() == 1.0


def test_short_go_run_and_network_checked_on_resume(tmp_path):
    metrics = run_recipe("alphazero", FAST + ["--iterations", "1", "--output_dir", str(tmp_path)])
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[-1]["step"] == 1 and "eval/sims0_vs_random" in metrics
    assert "eval/sims2_vs_exact" not in metrics
    with pytest.raises(ConfigError, match="network"):
        run_recipe("alphazero", FAST + ["--iterations", "2", "--output_dir", str(tmp_path), "--resume",
                                        "--network", "mlp"])


def test_go9_yaml_parses_and_builds_a_conv_net():
    cfg = AlphaZeroConfigs.parse(["--config", str(ROOT / "recipes/configs/alphazero_go9.yaml")]).alphazero
    assert cfg.game == "go9" and cfg.network == "conv" and make(cfg.game).exact_metric == "win_rates"
    game, face, net = make_game_and_network(cfg)
    assert isinstance(net, ConvPolicyValueNet) and net.n_actions == 82
    with pytest.raises(ConfigError, match="conv"):
        AlphaZeroConfigs.parse(["--network", "transformer"])


def test_value_targets_blend_the_score_margin():
    """White wins an empty board by komi: the outcome is +-1, and with score_weight the
    loser's target says by how much it lost (a flat -1 left Black's search indifferent
    between passing at move one and playing, so it learned to pass)."""
    from lmselfplay.alphazero.searched_games import SelfPlaySettings, value_targets

    g = Go(9)
    done = g.apply(g.apply(g.new_initial_state(), g.pass_action), g.pass_action)
    assert g.score_margins(done) == [-7.5, 7.5]
    assert value_targets(g, done, SelfPlaySettings()) == [-1.0, 1.0]
    z = value_targets(g, done, SelfPlaySettings(score_weight=0.5, score_scale=10.0))
    assert z == pytest.approx([-0.5 - 0.5 * np.tanh(0.75), 0.5 + 0.5 * np.tanh(0.75)])
    s = g.new_initial_state()
    for a in (g.point("E5"), g.pass_action, g.pass_action):  # Black's one stone owns the board
        s = g.apply(s, a)
    z2 = value_targets(g, s, SelfPlaySettings(score_weight=0.5, score_scale=10.0))
    assert z2[0] == pytest.approx(0.5 + 0.5 * np.tanh(7.35)) and z2[1] == pytest.approx(-z2[0])


def test_score_weight_needs_a_game_with_margins(tmp_path):
    with pytest.raises(ConfigError, match="score_margins"):
        run_recipe("alphazero", ["--game", "tictactoe", "--score_weight", "0.5", "--output_dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="score_weight"):
        AlphaZeroConfigs.parse(["--score_weight", "1.5"])
    with pytest.raises(ConfigError, match="score_scale"):
        AlphaZeroConfigs.parse(["--score_scale", "0"])


def test_selfplay_actions_drop_only_a_pass_that_hands_over_the_win():
    """A pass while behind (even answering a pass: the net learned to end games it was
    losing whenever a random opponent passed) or a first pass on an unsettled board."""
    g = Go(9)
    s = g.new_initial_state()  # Black is behind by komi on the empty board
    assert g.pass_action not in g.selfplay_actions(s)
    assert g.selfplay_actions(s) == g.legal_actions(s)[:-1]
    ahead = g.apply(s, g.point("E5"))  # White to move, behind: Black's stone owns the board
    assert g.pass_action not in g.selfplay_actions(ahead)
    walls = ["...OX...."] * 9  # settled: Black owns E-J (45), White A-D (36), Black +1.5
    black_ahead = g.from_rows(walls, to_play=0)
    assert g.score_margins(black_ahead) == [1.5, -1.5]
    assert g.selfplay_actions(black_ahead) == g.legal_actions(black_ahead)
    white_behind = g.from_rows(walls, to_play=1)
    assert g.selfplay_actions(white_behind) == g.legal_actions(white_behind)[:-1]
    after_black_pass = g.apply(black_ahead, g.pass_action)  # White, behind, plays on
    assert g.pass_action not in g.selfplay_actions(after_black_pass)
    after_white_pass = g.apply(white_behind, g.pass_action)  # Black, ahead, may end it
    assert g.pass_action in g.selfplay_actions(after_white_pass)
    dame_rows = ["...O.X..."] + ["...OXX..."] * 8  # E9 touches both colours: unsettled
    white_passed = g.apply(g.from_rows(dame_rows, to_play=1), g.pass_action)
    assert g.score_margins(white_passed)[0] == 0.5  # Black, ahead, may end the game
    assert g.pass_action in g.selfplay_actions(white_passed)
    invaded = g.from_rows(["...OX.O.."] + walls[1:], to_play=0)  # an O stone in Black's area
    assert g.score_margins(invaded)[0] == -35.5  # as it stands, E-J is nobody's
    assert g.pass_action not in g.selfplay_actions(invaded)
    dame = g.from_rows(["...O.X..."] + ["...OXX..."] * 8, to_play=0)  # E9 touches both
    assert g.score_margins(dame)[0] > 0 and g.pass_action not in g.selfplay_actions(dame)


def test_selfplay_actions_drop_fills_of_the_movers_own_true_eyes():
    """A point ringed by the mover's stones is pruned unless two diagonals (the edge counts
    as one) belong to the opponent (a false eye); the opponent's eyes are not the mover's;
    with nothing else left the mover passes, even while behind."""
    g = Go(9)
    rows = ["X.X.X.XXX",   # B9, D9: false (C8 is White, plus the edge); F9: true
            "XXOXXXXXX",
            "XX.XXXXXX",
            ".........",
            ".........",
            "OOOOOOOOO",
            "O.OOOOOOO",   # B3: White's true eye
            "OOOOOO.OO",   # G2: White's true eye
            "OOOOOOOOO"]
    black = g.from_rows(rows, to_play=0)
    eyes = lambda s: {g.names[a] for a in g.legal_actions(s)[:-1] if g.is_own_eye(s, a)}  # noqa: E731
    assert eyes(black) == {"F9"}
    assert g.selfplay_actions(black) == [a for a in g.legal_actions(black)[:-1] if g.names[a] != "F9"]
    assert {g.names[a] for a in range(g.n_points) if g.is_own_eye(g.from_rows(rows, to_play=1), a)} == {"B3", "G2"}
    corner = ["........."] * 7
    assert g.is_own_eye(g.from_rows(corner + ["XX.......", ".X......."]), g.point("A1"))
    assert not g.is_own_eye(g.from_rows(corner + ["XO.......", ".X......."]), g.point("A1"))
    only_eyes = g.from_rows(["X.XXOO.OO"] + ["XXXXOOOOO"] * 7 + ["XX.XOO.OO"], to_play=0)
    assert g.score_margins(only_eyes)[0] == 36 - 45 - 7.5
    assert [g.names[a] for a in g.legal_actions(only_eyes)] == ["C1", "B9", "pass"]
    assert g.selfplay_actions(only_eyes) == [g.pass_action]


def test_pruned_roots_never_pass_while_behind_in_self_play():
    """Self-play with prune_root: every stored pass target was searched where the mover was
    ahead or the opponent had just passed; without it the untrained net passes anywhere."""
    from lmselfplay.alphazero.adapter import CachedGame, SearchGame
    from lmselfplay.alphazero.searched_games import SelfPlaySettings, play_games

    g = Go(5)
    face = CachedGame(SearchGame(g))
    torch.manual_seed(0)
    x = g.encode(g.new_initial_state())
    net = ConvPolicyValueNet(x.shape, g.n_actions, channels=8, blocks=1).eval()
    for prune, expect_bad in ((False, True), (True, False)):
        settings = SelfPlaySettings(n_sims=4, dirichlet_alpha=0.5, temperature_moves=50,
                                    prune_root=prune)
        samples, _ = play_games(face, net, 6, settings, random.Random(1))
        opp_passed = samples.x[:, 8, 0, 0] == 1
        # Recompute the mover's margin from the planes: own stones 0, opponent's 1.
        bad = 0
        for xi, pi, passed, legal in zip(samples.x, samples.pi, opp_passed, samples.legal):
            board = np.where(xi[0] == 1, 1, np.where(xi[1] == 1, 2, 0)).astype(np.uint8)
            black = xi[9, 0, 0] == 1
            if not black:  # stones as Black/White for the scorer
                board = np.where(board == 0, 0, 3 - board).astype(np.uint8)
            s = g.from_rows(["".join(".XO"[v] for v in row) for row in board[::-1]],
                            to_play=0 if black else 1)
            margin = g.score_margins(s)[0 if black else 1]
            bad += bool(pi[g.pass_action] > 0 and margin < 0 and not passed and legal.sum() > 1)
        assert (bad > 0) == expect_bad


def test_max_minutes_stops_after_the_round_that_passes_it(tmp_path):
    """A wall-time limit ends the run early, with that round evaluated and checkpointed."""
    metrics = run_recipe("alphazero", FAST + ["--iterations", "5", "--eval_every", "10", "--max_minutes",
                                              "0.000001", "--output_dir", str(tmp_path)])
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and "eval/sims0_vs_random" in metrics
    assert (tmp_path / "checkpoint-1" / "state.pt").exists()
    with pytest.raises(ConfigError, match="max_minutes"):
        AlphaZeroConfigs.parse(["--max_minutes", "-1"])


def _position_from_planes(g: Go, x: np.ndarray, to_play: int):
    """The board of planes 0/1 (mover's, opponent's stones) with ``to_play`` to move."""
    black_moves = x[9, 0, 0] == 1
    mine, theirs = (1, 2) if black_moves else (2, 1)
    board = np.where(x[0] == 1, mine, np.where(x[1] == 1, theirs, 0))
    return g.from_rows(["".join(".XO"[v] for v in row) for row in board[::-1]], to_play)


@pytest.mark.parametrize("prune", [False, True])
def test_bank_opponents_pass_only_where_self_play_may(prune):
    """Games against a frozen bank network: with prune_root its roots are pruned like the
    learner's, so every pass the learner sees was allowed by selfplay_actions (else the
    learner learns to answer any pass with a pass)."""
    from lmselfplay.alphazero.adapter import CachedGame, SearchGame
    from lmselfplay.alphazero.searched_games import SelfPlaySettings, play_games

    g = Go(5)
    face = CachedGame(SearchGame(g))
    torch.manual_seed(0)
    x = g.encode(g.new_initial_state())
    net = ConvPolicyValueNet(x.shape, g.n_actions, channels=8, blocks=1).eval()
    settings = SelfPlaySettings(n_sims=4, dirichlet_alpha=0.5, temperature_moves=50,
                                prune_root=prune)
    samples, _ = play_games(face, net, 8, settings, random.Random(2), [net], bank_fraction=1.0)
    seen = [_position_from_planes(g, xi, 1 if xi[9, 0, 0] == 1 else 0)  # the opponent to move
            for xi in samples.x if xi[8, 0, 0] == 1]
    disallowed = [s for s in seen if g.pass_action not in g.selfplay_actions(s)]
    assert seen and (len(disallowed) > 0) == (not prune)


def test_pass_injection_plays_passes_that_never_end_the_game():
    """pass_injection: some moves become passes (counted), never the second pass that would
    end a game; off by default, and then none are played. With injection the samples hold
    positions right after an opponent's pass (the encoding's pass plane)."""
    from lmselfplay.alphazero.adapter import CachedGame, SearchGame
    from lmselfplay.alphazero.searched_games import SelfPlaySettings, play_games

    g = Go(5)
    face = CachedGame(SearchGame(g))
    torch.manual_seed(0)
    net = ConvPolicyValueNet(g.encode(g.new_initial_state()).shape, g.n_actions, channels=8, blocks=1).eval()
    seen = {}
    for p in (0.0, 0.3):
        settings = SelfPlaySettings(n_sims=4, dirichlet_alpha=0.5, temperature_moves=50, prune_root=True,
                                    pass_injection=p)
        samples, stats = play_games(face, net, 4, settings, random.Random(2))
        seen[p] = (stats["selfplay/injected_passes"], int((samples.x[:, 8, 0, 0] == 1).sum()))
    assert seen[0.0][0] == 0 and seen[0.3][0] > 0
    assert seen[0.3][1] > seen[0.0][1]


def test_the_old_build_name_is_one_line_naming_make_game_and_network():
    from lmselfplay.alphazero import iteration

    with pytest.raises(AttributeError, match="make_game_and_network"):
        iteration.build  # noqa: B018
