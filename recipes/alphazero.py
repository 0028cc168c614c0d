"""AlphaZero from the rules alone: PUCT self-play -> replay window -> train -> evaluate.

    python recipes/alphazero.py --config recipes/configs/alphazero_nim.yaml
    python recipes/alphazero.py --config recipes/configs/alphazero_tictactoe.yaml --iterations 20
    python recipes/alphazero.py --config ... --resume      # continue a killed run

One iteration, in the order of the algorithm box (Silver et al. 2017/2018):

1. self-play: batched PUCT search with root Dirichlet noise (eps, alpha ~ 1 / typical
   number of legal moves), tau = 1 for the first ``temperature_moves`` plies then greedy;
   a fraction of games starts from a random legal reset, a fraction is played against a
   bank of frozen checkpoints (only the learner's moves are stored);
2. store (position, search policy, outcome for the player to move) in a replay window;
3. train on minibatches: (z - v)^2 - pi^T log p + c_reg ||theta||^2;
4. optional gate (AlphaGo Zero): the candidate replaces the self-play network only if it
   scores >= ``gate_threshold`` against it; off by default (AlphaZero);
5. every ``bank_every`` iterations a frozen copy joins the bank (the oldest leaves);
6. evaluate: strength at each search budget vs random and exact players, raw-policy optimal
   move rate, and the win-rate matrix against every earlier checkpoint.

Metrics go to ``output_dir/metrics.jsonl``, TensorBoard and PNG plots; checkpoints are
atomic ``output_dir/checkpoint-<iteration>`` directories holding everything to resume
exactly (networks, optimizer, replay window, bank, history, RNG states).
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from lmselfplay.alphazero.config import AlphaZeroConfigs, selfplay_settings
from lmselfplay.alphazero.iteration import evaluate_strength, gate, make_game_and_network, train
from lmselfplay.alphazero.plots import plot_run
from lmselfplay.alphazero.progress import (
    Progress,
    checkpoint_state,
    frozen,
    restore,
    save,
    snapshot,
)
from lmselfplay.alphazero.searched_games import Samples, alpha_for, play_games
from lmselfplay.eval.game_metrics import reference_lines
from lmselfplay.games.base import OPTIMAL_MOVES
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import Run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = AlphaZeroConfigs.parse(argv)  # its own args (cfg.alphazero), the search's (cfg.puct) and the run's
    args = cfg.alphazero
    torch.set_num_threads(args.torch_threads)
    with Run(cfg.run, cfg.as_dict(), resume_fixed=cfg.fixed_on_resume(),
             checkpoint_every=cfg.checkpoints.checkpoint_every, trains_with="state") as run:
        torch.manual_seed(cfg.run.seed)
        game, face, net = make_game_and_network(args)
        exact = game.exact_metric == OPTIMAL_MOVES  # the solver labels every move: exact opponent and rates
        opt = torch.optim.Adam(net.parameters(), lr=args.learning_rate)
        alpha = cfg.puct.dirichlet_alpha or alpha_for(face, game, seed=cfg.run.seed)
        settings = selfplay_settings(args, cfg.puct, alpha)
        p = Progress(random.Random(cfg.run.seed), np.random.default_rng(cfg.run.seed), snapshot(net))
        start = restore(run, args, net, opt, p)
        run.report_start(start, "iteration")
        run.open_log(start - 1 if run.checkpoint is not None else None)
        metrics: dict[str, Any] = {}
        started = time.time()
        for it in tqdm(range(start, args.iterations + 1), desc="alphazero", disable=not args.progress,
                       initial=start - 1, total=args.iterations):
            t0 = time.time()
            # 1. self-play: the self-play network (gating: the best one) against itself and the bank
            player = frozen(net, p.best) if args.gate else net
            opponents = [frozen(net, s) for s in p.bank]
            samples, metrics = play_games(face, player, args.games_per_iteration, settings, p.rng,
                                          opponents, args.bank_fraction)
            # 2. the replay window: the last replay_window iterations' positions
            p.replay = (p.replay + [samples])[-args.replay_window:]
            # 3. train on minibatches of the window
            metrics.update(train(net, opt, Samples.concat(p.replay), args, p.np_rng, game))
            # 4. the candidate becomes the self-play network (gate: only if it beats it)
            metrics.update(gate(args, cfg.puct, face, net, p, it))
            # 5. every bank_every iterations a frozen copy joins the bank (the oldest leaves)
            if it % args.bank_every == 0:
                p.bank = (p.bank + [snapshot(net)])[-args.bank_size:]
            metrics["bank/size"] = len(p.bank)
            out_of_time = args.max_minutes > 0 and time.time() - started >= 60 * args.max_minutes
            last = it == args.iterations or out_of_time
            if it % args.eval_every == 0 or last:  # 6. strength, optimal-move rates, win-rate matrix
                metrics.update(evaluate_strength(args, cfg.puct, face, net, p, it, exact))
            metrics["time/iteration_s"] = time.time() - t0
            run.log(it, metrics)
            if run.checkpoint_due(it, last):  # everything to resume exactly
                save(cfg, it, checkpoint_state(cfg, it, net, opt, p))
            if out_of_time:
                print(f"max_minutes={args.max_minutes:g} reached after iteration {it}", file=sys.stderr)
                break
        plot_run(args, run, p, reference_lines(game).get("greedy_optimal_rate", []))
    return metrics


if __name__ == "__main__":
    sys.exit(run_main(main))
