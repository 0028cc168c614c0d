"""AlphaZero for the language model: PUCT self-play with the LLM as the network, distilled back.

    python recipes/search_selfplay.py --config recipes/configs/search_selfplay_nim.yaml
    python recipes/search_selfplay.py --config recipes/configs/search_selfplay_tictactoe.yaml
    python recipes/search_selfplay.py --config ... --resume      # continue a killed run

The ratchet (AlphaGo Zero -> MuZero): network -> PUCT search -> better policy / value
targets -> distillation -> stronger network; here the LLM IS the network. Its prior is the
next-token distribution over the legal move tokens after ``<move>`` (one forward of prompt
+ ``<move>``; teacher-forced answer scores for tokenizers that split move names), its value
a small head on the hidden state at the end of the prompt
(:class:`lmselfplay.lm.search_eval.LLMEvaluator`). One round, in order:

1. opponents : per game, 40% mirror play (the learner on both seats), 40% a recent frozen
               league snapshot, 20% a hall-of-fame snapshot (the first snapshot, the initial
               policy, is permanent); frozen seats search with their own weights and never
               give labels;
2. self-play : batched PUCT (``n_sims`` per move, one LLM batch per simulation wave, states
               cached within a weights version), Dirichlet root noise, tau = 1 for the first
               ``temperature_moves`` plies then the most visited move; a fraction of games
               starts from a random legal reset;
3. replay    : only the learner's searched turns (prompt, visit distribution pi, z = final
               result for the mover) enter a window of the last ``replay_window`` rounds;
4. distill   : ``distill_steps`` trainer steps on minibatches from the window: cross-entropy
               from pi to the LLM's move-token distribution (over the whole vocabulary, so
               illegal answers are pushed down, not renormalized away) + KL to the initial
               policy on the answer tokens (``beta``, the trainer's collapse guard);
5. value     : ``value_steps`` Adam steps of (z - v)^2 for the value head on the LLM's
               (frozen) hidden state at the end of the prompt; with ``q_head`` instead a Q
               head (a bounded Q per move; the search's value is V(s) = sum_a pi(a|s) Q(s, a))
               learns the blended target c(a) Q_PUCT(a) + (1 - c(a)) Q_prior(a),
               c(a) = N(a) / (N(a) + q_lambda), plus (z - V)^2
               (:func:`lmselfplay.search_selfplay.search_targets.blended_q_target`, ``q_loss``);
6. league    : every ``league_add_every`` rounds the learner joins the ring of frozen
               snapshots; every ``league_promote_every``-th one also the hall of fame;
7. evaluate  : every ``eval_every`` rounds, deterministic (no noise): at budget 0 the
               raw LLM (greedy answer; illegal = loss) and the exact metrics the game
               declares (``eval/game_metrics.policy_metrics``); at budgets 16/32/64 the search
               agent from fixed openings vs a random player and vs the exact solver
               (win / draw / loss, 95% Wilson intervals);
8. checkpoint: atomic, with model, value head, optimizer, scheduler, replay, league, RNG.

Game-agnostic: any perfect-information game with a search face works (Nim, tic-tac-toe;
Go 9x9 without edits here). Games with hidden information or chance (Kuhn poker) are out
of scope: PUCT searches perfect-information trees only.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from lmselfplay.alphazero.searched_games import alpha_for
from lmselfplay.search_selfplay.config import SearchSelfPlayConfigs
from lmselfplay.search_selfplay.metrics import plot_run, strength_per_budget
from lmselfplay.search_selfplay.search_targets import collect, plan_games
from lmselfplay.search_selfplay.steps import (
    distill,
    make_search_selfplay,
    opponent_evaluators,
    opponent_name,
    restore,
    save,
    snapshot,
    train_head,
)
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import Run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = SearchSelfPlayConfigs.parse(argv)  # its own args (cfg.search) and each component's config
    args = cfg.search
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(cfg.run.seed)
    with Run(cfg.run, cfg.as_dict(), resume_fixed=cfg.fixed_on_resume(),
             gradient_accumulation_steps=cfg.trainer.gradient_accumulation_steps,
             checkpoint_every=cfg.checkpoints.checkpoint_every) as run:
        s = make_search_selfplay(cfg, run)
        evaluator, face, rng = s.evaluator, s.face, s.rng
        alpha = cfg.puct.dirichlet_alpha or alpha_for(face, s.game, seed=cfg.run.seed)
        start = restore(run, s)
        run.report_start(start, "iteration")
        run.open_log(start - 1 if run.checkpoint is not None else None)
        t_start, metrics = time.time(), {}
        if start == 1 and args.eval_every > 0:  # the starting point of every curve
            run.log(0, {**strength_per_budget(face, evaluator, s.trainer.unwrapped, s.tok, cfg, 0),
                        "time/wall_s": 0.0})
        for it in tqdm(range(start, args.rounds + 1), desc="search self-play", disable=not args.progress,
                       initial=start - 1, total=args.rounds):
            t0, forwards = time.time(), evaluator.forwards
            evaluator.clear()  # new weights since the last search
            # 1. opponents
            games = plan_games(face, args.games_per_round, rng, lambda r: opponent_name(s.league, r),
                               cfg.puct.reset_fraction, cfg.puct.reset_max_plies)
            # 2. self-play with search
            with tqdm(desc="self-play turns", disable=not args.progress, leave=False) as bar:
                records, metrics = collect(face, games, opponent_evaluators(s, games), cfg.puct.n_sims, rng,
                                           cfg.puct.c_puct, cfg.puct.dirichlet_eps, alpha, cfg.puct.temperature_moves,
                                           progress=bar,
                                           target_tau=args.target_tau, q_lambda=args.q_lambda)
            metrics["time/selfplay_s"] = time.time() - t0
            metrics["selfplay/llm_positions"] = float(evaluator.forwards - forwards)  # cache misses
            # 3. replay window (learner turns only)
            s.replay = (s.replay + [records])[-args.replay_window:]
            window = [r for part in s.replay for r in part]
            # 4. distill the search into the policy: per searched turn, loss = -sum_a pi(a) log p_LLM(a | s)
            #    over the vocabulary at <move> + beta KL(pi_LLM || pi_initial) on the answer tokens;
            # 5. the value head: (z - v(s))^2 (q_head: the blended Q target, search_targets.q_loss)
            t1 = time.time()
            if window:
                metrics.update(distill(s.trainer, window, s.tok, s.game, evaluator.tokens, args, rng))
                evaluator.clear()
                metrics.update(train_head(s.head, s.head_opt, evaluator, window, args, rng))
            metrics["time/train_s"] = time.time() - t1
            evaluator.clear()
            # 6. league
            if s.league.due(it):
                s.league.add(it, snapshot(s.trainer, s.head))
            # 7. evaluate
            if args.eval_every > 0 and (it % args.eval_every == 0 or it == args.rounds):
                metrics.update(strength_per_budget(face, evaluator, s.trainer.unwrapped, s.tok, cfg, it))
            metrics["time/iteration_s"] = time.time() - t0
            metrics["time/wall_s"] = time.time() - t_start
            run.log(it, metrics)
            # 8. checkpoint
            if run.checkpoint_due(it, last=it == args.rounds):
                save(s, cfg, it)
        plot_run(args, run.logger)
    return metrics


if __name__ == "__main__":
    sys.exit(run_main(main))
