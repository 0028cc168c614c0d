"""Self-play on text games with the rules as the referee (SPIRAL-style), one policy.

    python recipes/selfplay_games.py [--config recipes/configs/selfplay_games.yaml] [--key value ...]
    accelerate launch [--config_file recipes/accelerate/ddp_cpu.yaml] recipes/selfplay_games.py ...

The algorithm, in order (every rank plays its own games; gradients are averaged):

    for step = 1..max_steps:
        1. opponents  : per episode (games split by game_weights), mirror self-play / a frozen
                        league snapshot / a random bot
        2. starts     : a fraction of games start from a random legal position (resets)
        3. rollout    : all pending turns of all live games in one engine call per engine
        4. rewards    : the rules' zero-sum returns; an illegal move loses the game's largest
                        stake (max_utility) for its author
        5. advantages : role-conditioned EMA baselines per (game, seat, start) - SPIRAL's RAE
        6. update     : PPO-clipped policy gradient on the learner's tokens + KL (one coefficient
                        per game / role, optionally annealed) to the reference policy: the initial
                        one, or every ref_update_every steps the current one (magnetic mirror
                        descent's moving magnet), num_iterations passes
        7. league     : maybe add a frozen snapshot (nash meta-solver: it plays the ring first)
        8. every eval_every steps: the exact metrics each game supports (optimal-move rates or
           exploitability; win rates vs its reference bots with 95% CIs), JSONL + PNG curves
        9. every checkpoint_every steps: atomic checkpoint (--resume continues from it)
    10. the final evaluation; with average_policy and distill_steps, the average distilled into the
        final model (supervised steps) and evaluated again; the final model saved
    with average_policy (games whose exact metric is exploitability): every average_every steps
    the policy at every information set joins a reach-weighted running average (what fictitious
    self-play drives to Nash while the last iterate cycles); its exploitability is reported at
    every evaluation, and at the end distill_steps supervised steps distil it into the final model.
    With feedback: exact, the games of exact_games (default: the exploitability games; the main
    job: nim,kuhn_poker) are not played: every step the referee (the rules) computes the exact
    expected return of every action at every information set against the policy read off the model, and the magnetic-mirror-descent target built from them joins the
    step's batch as supervised targets (lmselfplay/rl/exact_feedback.py); other games keep playing
"""

from __future__ import annotations

import sys
import time

import torch
from tqdm.auto import tqdm

from lmselfplay.games.text import MOVE_STOP
from lmselfplay.models.policy import policy_weights
from lmselfplay.rl.overlap import rollouts_for
from lmselfplay.selfplay_games.config import SelfPlayConfigs, check_beta, check_bots, check_shaping
from lmselfplay.selfplay_games.metrics import (
    distilled_metrics,
    eval_positions,
    final_metrics,
    log_evaluation,
    log_final,
    print_final,
)
from lmselfplay.selfplay_games.steps import (
    distill_averages,
    episode_plan,
    exact_feedback_step,
    load_state,
    log_iterate_policies,
    make_feedback,
    make_games,
    make_selfplay,
    save_checkpoint,
    shaped_advantages,
    snapshot_score,
    step_row,
    turn_advantages,
)
from lmselfplay.utils.errors import run_main
from lmselfplay.utils.run import Run
from lmselfplay.utils.threads import torch_threads


def main(argv=None):
    cfg = SelfPlayConfigs.parse(argv)  # its own args (cfg.selfplay) and each component's config
    args = cfg.selfplay
    torch.set_num_threads(torch_threads(args.torch_threads, cfg.policy.model_name_or_path))
    games = make_games(args.games, cfg.policy.model_name_or_path)
    check_beta(cfg.trainer.beta, games)
    check_shaping(args, games)
    check_bots(cfg.league, games)
    feedback = make_feedback(cfg.feedback, games)
    # after the config checks: a bad config never waits on a busy folder
    with Run(cfg.run, cfg.as_dict(), resume_fixed=cfg.fixed_on_resume(),
             gradient_accumulation_steps=cfg.trainer.gradient_accumulation_steps,
             checkpoint_every=cfg.checkpoints.checkpoint_every) as run:
        sp = make_selfplay(cfg, run, games, feedback, eval_positions(cfg, games))
        start_step = run.resume_trainer(sp.trainer, lambda extra: load_state(sp, extra))
        run.report_start(start_step)
        run.open_log(start_step if run.checkpoint else None)
        trainer, engine, acc = sp.trainer, sp.engine, run.acc
        sampling = cfg.sampling.params(args.max_new_tokens, stop=MOVE_STOP)
        rollouts = rollouts_for(cfg.overlap.max_staleness, trainer, engine,
                                episode_plan(cfg, sp.step_games, sp.league, sp.me, sp.tok, sampling, acc.process_index))
        t0 = time.time()
        bar = tqdm(range(start_step, args.max_steps), initial=start_step, total=args.max_steps, desc="self-play",
                   disable=not run.is_main)
        for step in bar:
            resumed_here = run.checkpoint is not None and step == start_step  # evaluated before the kill
            if sp.averages and cfg.average.averaged_at(step):
                log_iterate_policies(cfg, run, sp, step)
            if args.eval_every and step % args.eval_every == 0 and not resumed_here:  # 8: evaluate
                with trainer.serving(engine):
                    log_evaluation(cfg, run, sp, step, t0)
            exact = exact_feedback_step(run, sp, step)
            # 1-4: play (max_staleness >= 1: played while the previous step trained)
            finished, stats = rollouts.next(step, args.max_steps - 1)
            # 5: advantages (SPIRAL's RAE): every learner turn's A = G_seat - b[game, seat, start], b an
            # EMA of that role's returns; then SPAG's shaping or the illegal-answer penalty if set
            trajs = [t for f in finished for t in f.trajectories]
            adv = shaped_advantages(args, finished, turn_advantages(args.baseline_key, sp.baselines, trajs))
            samples = [s for t in trajs for s in t.samples(adv[id(t)])] + exact
            samples, stale = rollouts.keep(samples, trainer.step_count)  # drops games older than max_staleness
            # 6: update, num_iterations passes; per learner token, r = pi / pi_behaviour and
            #    loss = -min(r A, clip(r, 1 - eps, 1 + eps) A) + beta[game, role] * KL(pi || pi_ref)
            #    (lmselfplay/rl/losses.py); the engine's weight-sync check warns, or stops with
            #    strict_sync, when its weights are not the trainer's; it serves the updated ones next step
            metrics = trainer.step(samples, engine=engine)
            # 7: league
            if sp.league.due(step + 1):
                # every rank copies the snapshot it plays against (ZeRO-3: gathered a bucket at a time)
                snap = sp.league.add(step + 1, policy_weights(trainer.model))
                sp.league.play_in(snap, snapshot_score(cfg, games, sp.league, sp.tok, step))
            row = step_row(sp, metrics, stats, finished, stale, t0)
            run.log(step + 1, row)
            bar.set_postfix(loss=f"{metrics.get('loss', 0):.3f}", invalid=f"{row['rollout/invalid_rate']:.2f}")
            if run.checkpoint_due(step + 1):  # 9: checkpoint
                save_checkpoint(run, sp)
        with trainer.serving(engine):  # 8: the final evaluation
            final = final_metrics(cfg, sp)
        if sp.averages and cfg.average.distill_steps:  # 10: the final model becomes the average policy
            distilled = distill_averages(trainer, sp.averages, sp.tok, cfg.average.distill_steps, run.logger, engine)
            with trainer.serving(engine):
                final.update(distilled_metrics(cfg, sp, distilled))
        png = log_final(cfg, run, sp, final, t0)
        model_dir = run.save_final_model(trainer.model, trainer.unwrapped, sp.tok)
        print_final(run, final, png, model_dir)


if __name__ == "__main__":
    sys.exit(run_main(main))
