"""AlphaZero on Go: the conv net, symmetry augmentation, and a short recipe run."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from lmselfplay.alphazero.network import ConvPolicyValueNet, alphazero_loss
from lmselfplay.games import make
from lmselfplay.games.go import Go
from lmselfplay.utils.config import ConfigError, parse_config
from lmselfplay.utils.metrics_logger import read_jsonl
from lmselfplay.utils.recipe_loader import load_recipe

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--game", "go", "--game_args", '{"size": 5}', "--network", "conv", "--hidden", "8",
        "--blocks", "1", "--games_per_iteration", "4", "--n_sims", "2", "--train_steps", "3",
        "--batch_size", "16", "--eval_games", "2", "--eval_budgets", "0", "2",
        "--winrate_games", "2", "--temperature_moves", "4",
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
    recipe = load_recipe("alphazero")
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
        x, legal, moved_pi, _ = recipe.symmetry(g, batch, k)
        np.testing.assert_array_equal(x[0], g.encode(t))
        np.testing.assert_array_equal(legal[0], g.legal_masks([t])[0])
        assert moved_pi[0, perm[a]] == 1.0 and moved_pi.sum() == 1.0


def test_short_go_run_and_network_checked_on_resume(tmp_path):
    recipe = load_recipe("alphazero")
    metrics = recipe.main(FAST + ["--iterations", "1", "--output_dir", str(tmp_path)])
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[-1]["step"] == 1 and "eval/sims0_vs_random" in metrics
    assert "eval/sims2_vs_exact" not in metrics
    with pytest.raises(ConfigError, match="network"):
        recipe.main(FAST + ["--iterations", "2", "--output_dir", str(tmp_path), "--resume",
                            "--network", "mlp"])


def test_go9_yaml_parses_and_builds_a_conv_net():
    recipe = load_recipe("alphazero")
    cfg = parse_config(recipe.AlphaZeroConfig,
                       ["--config", str(ROOT / "recipes/configs/alphazero_go9.yaml")])
    assert cfg.game == "go9" and cfg.network == "conv" and make(cfg.game).exact_metric == "win_rates"
    game, face, net = recipe.build(cfg)
    assert isinstance(net, ConvPolicyValueNet) and net.n_actions == 82
    with pytest.raises(ConfigError, match="conv"):
        parse_config(recipe.AlphaZeroConfig, ["--network", "transformer"])
