"""The steps of one AlphaZero iteration after self-play (``recipes/alphazero.py``'s box):

* :func:`make_game_and_network` — the game, its cached search face and a fresh network of the configured kind;
* :func:`train` — step 3: ``train_steps`` minibatches from the replay window, each under a random
  board symmetry where the game has them, loss (z - v)^2 - pi^T log p + c_reg ||theta||^2;
* :func:`gate` — step 4: the candidate replaces the self-play network (with ``gate``: only if it
  scores >= ``gate_threshold`` against it);
* :func:`evaluate_strength` — step 6: strength per search budget, raw-policy optimal-move rates
  where the solver labels moves, and a new row of the win-rate matrix.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from lmselfplay.alphazero.adapter import CachedGame, SearchGame
from lmselfplay.alphazero.config import AlphaZeroArgs, SearchConfig, fpu
from lmselfplay.alphazero.net_strength import (
    match,
    net_agent,
    optimal_argmax_fraction,
    strength,
    winrate_row,
)
from lmselfplay.alphazero.network import ConvPolicyValueNet, PolicyValueNet, alphazero_loss
from lmselfplay.alphazero.progress import Progress, frozen, snapshot
from lmselfplay.alphazero.searched_games import Samples
from lmselfplay.games import make
from lmselfplay.utils.config import ConfigError


def make_game_and_network(cfg: AlphaZeroArgs) -> tuple[Any, Any, PolicyValueNet]:
    """The game, its search face (rule table of ``table_entries`` states) and a fresh network;
    ConfigError when the game lacks what the config asks of it (encode, selfplay_actions,
    score_margins, board planes for ``network conv``)."""
    game = make(cfg.game, **json.loads(cfg.game_args))
    if not hasattr(game, "encode"):
        raise ConfigError(f"game {cfg.game!r} has no encode(state): AlphaZero needs one")
    if cfg.prune_root and not hasattr(game, "selfplay_actions"):
        raise ConfigError(f"prune_root needs {cfg.game!r} to have selfplay_actions(state)")
    if cfg.score_weight > 0 and not hasattr(game, "score_margins"):
        raise ConfigError(f"score_weight needs final score margins; {cfg.game!r} has no "
                          "score_margins(state)")
    face = CachedGame(SearchGame(game), max_entries=cfg.table_entries)
    x = face.encode(face.position(game.new_initial_state()))
    if cfg.network == "conv":
        if np.ndim(x) != 3:
            raise ConfigError(f"network conv needs board planes [C, N, N], {cfg.game} encodes "
                              f"{np.shape(x)}")
        return game, face, ConvPolicyValueNet(np.shape(x), face.n_actions, cfg.hidden, cfg.blocks)
    net = PolicyValueNet(int(np.prod(x.shape)), face.n_actions, cfg.hidden, cfg.blocks)
    return game, face, net


def symmetry(game: Any, batch: tuple[np.ndarray, ...], k: int) -> tuple[np.ndarray, ...]:
    """Board symmetry k of (planes, legal, pi, z): planes turn, action columns permute."""
    x, legal, pi, z = batch
    perm = game.symmetry_actions(k)
    moved_legal, moved_pi = np.empty_like(legal), np.empty_like(pi)
    moved_legal[:, perm], moved_pi[:, perm] = legal, pi
    return game.transform_planes(x, k), moved_legal, moved_pi, z


def train(net: PolicyValueNet, opt: torch.optim.Optimizer, data: Samples, cfg: AlphaZeroArgs,
          np_rng: np.random.Generator, game: Any = None) -> dict[str, float]:
    """Step 3: ``train_steps`` Adam steps on minibatches drawn with replacement from ``data``;
    the mean of each loss part as ``train/<part>``. The network is left in eval mode."""
    net.train()
    augment = cfg.augment and hasattr(game, "symmetry_actions")
    totals: dict[str, float] = {}
    for _ in tqdm(range(cfg.train_steps), desc="train", leave=False, disable=not cfg.progress):
        idx = np_rng.integers(0, len(data), size=cfg.batch_size)
        batch = (data.x[idx], data.legal[idx], data.pi[idx], data.z[idx])
        if augment:
            batch = symmetry(game, batch, int(np_rng.integers(8)))
        x, legal, pi, z = (torch.from_numpy(np.ascontiguousarray(b)) for b in batch)
        loss, parts = alphazero_loss(net, x, legal, pi, z, cfg.c_reg)
        opt.zero_grad()
        loss.backward()
        opt.step()
        for k, v in parts.items():
            totals[k] = totals.get(k, 0.0) + v / cfg.train_steps
    net.eval()
    return {f"train/{k}": v for k, v in totals.items()}


def gate(cfg: AlphaZeroArgs, puct: SearchConfig, face: Any, net: Any, p: Progress, it: int) -> dict[str, float]:
    """Keep the new network as the self-play one (with ``gate``: only if it beats the best)."""
    if not cfg.gate:
        p.best = snapshot(net)
        return {}
    r = match(face, net_agent(face, net, puct.n_sims, puct.c_puct, fpu(cfg)),
              net_agent(face, frozen(net, p.best), puct.n_sims, puct.c_puct, fpu(cfg)),
              cfg.gate_games, seed=it, opening_plies=2)
    if r["all"] >= cfg.gate_threshold:
        p.best = snapshot(net)
    return {"gate/score": r["all"]}


def evaluate_strength(cfg: AlphaZeroArgs, puct: SearchConfig, face: Any, net: Any, p: Progress, it: int,
                      exact: bool) -> dict:
    """Strength per search budget (and optimal-move rates where the solver labels moves),
    and the win rates against every earlier evaluated network (a row of the matrix)."""
    metrics = strength(face, net, cfg.eval_budgets, cfg.eval_games, seed=it, c_puct=puct.c_puct, exact=exact,
                       fpu_reduction=fpu(cfg))
    if exact:
        metrics.update(optimal_argmax_fraction(face, net))
    row = winrate_row(face, net, [frozen(net, s) for s in p.history], cfg.winrate_games, seed=it)
    p.matrix.append(row)
    p.history.append(snapshot(net))
    if row:
        metrics["eval/winrate_vs_past_mean"] = float(np.mean(row))
        metrics["eval/winrate_vs_previous"] = row[-1]
    return metrics


def __getattr__(name: str):
    if name == "build":
        raise AttributeError("alphazero.iteration.build is make_game_and_network(cfg)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
