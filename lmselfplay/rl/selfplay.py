"""Self-play on text games with the rules as the referee (SPIRAL-style): the algorithm of
``recipes/selfplay_games.py``, whose docstring is its box (steps 1-9).

What the loop works on is one :class:`SelfPlay` (made by :func:`build`, restored by
:func:`load_state`, saved by :func:`save_checkpoint`); the steps are functions of it:

* steps 1-2, who plays whom from where: :func:`episode_games` (each episode's game),
  :func:`make_episodes` (opponents and starts, seeded by seed, step and rank), :func:`episode_plan`;
* step 5, advantages: :func:`turn_advantages` (role or observation baselines) and
  :func:`training_samples` (SPAG's shaping, the illegal-answer penalty);
* step 7, the league: :func:`snapshot_engines` (its engine factory), :func:`snapshot_score`
  (a new snapshot's play-in games);
* exact feedback (``feedback: exact``): :func:`make_feedback`, :func:`exact_feedback_step`;
* the average policy (``average_policy``): :func:`make_averages`, :func:`fold_averages`,
  :func:`average_metrics`, :func:`distill_averages`;
* the step's log row: :func:`step_row`.

Its evaluation (step 8 and the end of the run) is :mod:`lmselfplay.eval.selfplay_metrics`:
training never imports evaluation.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from lmselfplay.games.base import has_enumerable_actions, random_legal_reset
from lmselfplay.games.bots import league_bot
from lmselfplay.games.gtp import find_gnugo, plays_gtp
from lmselfplay.games.text import MOVE_STOP
from lmselfplay.lm import readout as policy_readout
from lmselfplay.lm.engines import (
    HFEngine,
    SamplingParams,
    make_engine,
)
from lmselfplay.lm.prompt import thinks
from lmselfplay.lm.rollout import Episode, LLMPlayer, RolloutStats, play_episodes
from lmselfplay.models.policy import frozen_policy, load_policy
from lmselfplay.models.tiny import make_game_for
from lmselfplay.rl.advantages import RoleBaselines, observation_key
from lmselfplay.rl.average_policy import AverageConfig, AveragePolicy, averageable, distill_samples
from lmselfplay.rl.configs import PolicyGradientConfigs
from lmselfplay.rl.exact_feedback import ExactFeedback, FeedbackConfig, exact_feedback_games
from lmselfplay.rl.league import League, LeagueConfig, PlayInConfig
from lmselfplay.rl.trainer import PolicyTrainer, TargetLossConfig, beta_for, reference_policy
from lmselfplay.utils.config import (
    Config,
    ConfigError,
    non_negative,
    parse_weights,
    positive,
)
from lmselfplay.utils.run import PeriodicCheckpoints


@dataclass
class SelfPlayArgs(Config):
    """The self-play recipe's own fields (the loop, its games, its evaluation); the components'
    fields are in their own configs (:class:`SelfPlayConfigs`)."""

    _argument_group_name = "self-play (lmselfplay.rl.selfplay.SelfPlayArgs)"
    games: str = field(default="nim,tictactoe,kuhn_poker", metadata={"help": "comma-separated registry names"})
    game_weights: str = field(default="", metadata={
        "help": "share of each step's episodes per game, e.g. 'kuhn_poker=4' (unlisted games weigh 1)"})
    torch_threads: int = field(default=0, metadata={
        "help": "torch CPU threads; 0: auto = 1 for the embedded model, else the cores other processes leave free "
                "(lmselfplay/utils/threads.py)"})
    max_steps: int = field(default=60, metadata={
        "help": "self-play steps (each one trainer.step(); the learning-rate and beta schedules span them)"})
    episodes_per_step: int = field(default=48, metadata={"help": "games played per step (split across games by game_weights)"})
    concurrency: int = field(default=128, metadata={"help": "games live at once (their pending turns share one engine call)"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling for rollouts (behaviour log-probs are before top-p)"})
    max_new_tokens: int = field(default=12, metadata={"help": "answer budget of a move (tokens)"})
    text_max_new_tokens: int = field(default=64, metadata={
        "help": "answer budget in games whose moves are free text (Taboo)"})
    reward_shaping: str = field(default="none", metadata={
        "help": "none: every turn gets its seat's baseline advantage | spag: SPAG's per-turn weights for games "
                "that define turn_weights (Taboo): only the winner's turns, later ones more, roles rebalanced"})
    shaping_decay: float = field(default=0.8, metadata={"help": "SPAG's per-turn decay (turn k weighs decay**-k)"})
    retries: int = field(default=0, metadata={"help": "extra tries after an illegal answer before it forfeits the game"})
    illegal_penalty: float = field(default=0.0, metadata={
        "help": "> 0: an illegal answer's own turn gets advantage -illegal_penalty instead of its game's "
                "(with retries the game goes on, so the answer itself must carry the blame)"})
    max_turns: int = field(default=40, metadata={"help": "moves after which a game is cut as a draw"})
    reset_fraction: float = field(default=0.0, metadata={"help": "games started from random legal positions"})
    reset_max_plies: int = field(default=6, metadata={"help": "random moves at most before a reset game starts"})
    baseline_decay: float = field(default=0.9, metadata={"help": "EMA decay of the role baselines (per game, seat, start)"})
    baseline_key: str = field(default="role", metadata={
        "help": "role: one EMA baseline per (game, seat, start), every turn of a game gets its return minus it "
                "(SPIRAL's RAE); observation: one per (role, exact prompt), each turn gets its return minus the "
                "mean return seen from that observation (a tabular critic: for small games; the role's baseline "
                "until the observation has one)"})
    eval_every: int = field(default=10, metadata={"help": "steps between evaluations (0: only at the end)"})
    eval_suite: str = field(default="", metadata={
        "help": "a reasoning benchmark suite (e.g. 'tiny', 'default' or a YAML path) also run every eval_every steps"})
    eval_max_new_tokens: int = field(default=0, metadata={
        "help": "answer budget of the eval_suite problems (0: the suite's own max_new_tokens)"})
    readout: str = field(default="auto", metadata={
        "help": "how the exact metrics (and the average policy) read the policy: bare = teacher-forced answers "
                "right after the assistant header; sampled = readout_samples answers per position / information "
                "set, generated as played (thinking included), parsed; auto = sampled iff enable_thinking"})
    readout_samples: int = field(default=32, metadata={"help": "answers per position of the sampled readout"})
    eval_games: int = field(default=100, metadata={"help": "games per reference bot at each evaluation"})
    gnugo_level: int = field(default=0, metadata={
        "help": "also evaluate Go against GnuGo at this level (0: off; skipped with a note when gnugo is missing)"})
    gnugo_games: int = field(default=20, metadata={"help": "games against GnuGo per evaluation"})
    eval_positions: int = field(default=400, metadata={"help": "positions sampled for optimal-move rates (0: all)"})

    def validate(self) -> None:
        positive(self, "max_steps", "episodes_per_step", "concurrency", "max_new_tokens", "text_max_new_tokens", "max_turns",
                 "top_p")
        non_negative(self, "retries", "illegal_penalty", "reset_max_plies", "eval_every", "eval_games",
                     "gnugo_level", "gnugo_games", "eval_positions", "torch_threads")
        if self.baseline_key not in ("role", "observation"):
            raise ConfigError(f"baseline_key must be 'role' or 'observation', got {self.baseline_key!r}")
        policy_readout.resolve_readout(self.readout, False)  # a valid name; auto resolves with the model
        positive(self, "readout_samples")
        non_negative(self, "eval_max_new_tokens")

    def answer_budget(self) -> int:
        """The engine's answer budget (its KV cache is sized for it): the largest of a move's, a text turn's and an evaluation's."""
        return max(self.max_new_tokens, self.text_max_new_tokens, self.eval_max_new_tokens)


@dataclass(frozen=True)
class SelfPlayConfigs(PolicyGradientConfigs):
    """What ``recipes/selfplay_games.py`` parses: the trainer's, policy's, engine's and run's
    configs, its own arguments, and the target loss's (exact feedback and the average's
    distillation make target samples), average policy's, feedback's, league's, play-in's and
    checkpoints'."""

    selfplay: SelfPlayArgs
    target_loss: TargetLossConfig
    average: AverageConfig
    feedback: FeedbackConfig
    league: LeagueConfig
    play_in: PlayInConfig
    checkpoints: PeriodicCheckpoints

    defaults = {"output_dir": "runs/selfplay_games"}

    def validate(self) -> None:
        """Exact feedback and the average's distillation teach bare answers (a thinking policy
        would learn to stop thinking); the distillation runs past the loop's steps, where a
        decaying schedule has ended."""
        if self.feedback.feedback == "exact" and self.policy.enable_thinking:
            raise ConfigError("feedback: exact reads and distils a bare answer (<move> right after the assistant "
                              "header), which is not what a thinking policy plays and would train it to stop "
                              "thinking: use feedback: sampled, or enable_thinking: false")
        distils = self.average.average_policy and self.average.distill_steps
        if distils and self.policy.enable_thinking:
            raise ConfigError("distill_steps teach bare answers (<move> right after the assistant header), which "
                              "would train a thinking policy to stop thinking: use distill_steps 0 (the average is "
                              "still read by sampling and reported) or enable_thinking: false")
        schedule = self.trainer.lr_scheduler_type
        if distils and schedule not in ("constant", "constant_with_warmup"):
            raise ConfigError(f"distill_steps run past max_steps, where lr_scheduler_type {schedule!r} has "
                              "decayed: use a constant schedule or distill_steps 0")


def resolved_readout(args: SelfPlayArgs, tok) -> str:
    """The readout of the exact metrics and the average policy: ``bare``, or ``sampled`` when
    ``readout: auto`` and the policy thinks (its prompt style, on the tokenizer)."""
    return policy_readout.resolve_readout(args.readout, thinks(tok))


def check_thinking(average: AverageConfig, feedback, tok) -> None:
    """Exact feedback and the average's distillation teach bare answers: ConfigError when the
    policy thinks (also when the template thinks by default, which the config alone cannot tell)."""
    if not thinks(tok):
        return
    if feedback:
        raise ConfigError("feedback: exact reads and distils bare answers, but this policy thinks (its chat "
                          "template opens a think block): use feedback: sampled, or enable_thinking: false")
    if average.average_policy and average.distill_steps:
        raise ConfigError("distill_steps teach bare answers, but this policy thinks (its chat template opens a "
                          "think block): use distill_steps 0, or enable_thinking: false")


def make_games(names: str, model_name_or_path: str | None = None):
    """The games of this run, by registry name, with the texts the policy ``model_name_or_path``
    was built to read (:func:`~lmselfplay.models.tiny.make_game_for`); a ConfigError names an
    unknown one."""
    try:
        return [make_game_for(name.strip(), model_name_or_path) for name in names.split(",") if name.strip()]
    except (KeyError, ValueError) as e:
        raise ConfigError(f"games: {e.args[0] if e.args else e}") from None


def episode_games(games, weights: str, n: int):
    """The game of each of a step's ``n`` episodes: counts proportional to the weights
    (largest remainder; every game with weight > 0 gets at least one episode when n allows).
    A registered game that this run does not play may be named (a shared YAML): ignored."""
    from lmselfplay.games import REGISTRY

    w = parse_weights(weights, {g.name: 1.0 for g in games}, "game_weights", ignore=list(REGISTRY))
    total = sum(w.values())
    exact = [n * w[g.name] / total for g in games]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(games)), key=lambda i: counts[i] - exact[i])[: n - sum(counts)]:
        counts[i] += 1
    for i, g in enumerate(games):  # a weighted game never vanishes from a step
        if w[g.name] > 0 and counts[i] == 0 and max(counts) > 1:
            counts[counts.index(max(counts))] -= 1
            counts[i] = 1
    return [g for g, c in zip(games, counts) for _ in range(c)]


def check_beta(beta, games):
    """A per-game ``beta`` must name registered games (a shared YAML may list games this run
    does not play) and cover every seat of every game played; ConfigError otherwise."""
    from lmselfplay.games import REGISTRY

    if not isinstance(beta, dict):
        return
    bad = [k for k in beta if k != "default" and k.split("/")[0] not in REGISTRY]
    if bad:
        raise ConfigError(f"beta names unknown game(s) {bad}; games: {sorted(REGISTRY)} (or 'default')")
    for game in games:
        for seat in range(2):
            try:
                beta_for(beta, f"{game.name}/p{seat}/initial", game.name)
            except KeyError as e:
                raise ConfigError(str(e)) from None


def check_shaping(args: SelfPlayArgs, games):
    """``reward_shaping: spag`` needs a game that defines ``turn_weights``; ConfigError otherwise."""
    if args.reward_shaping not in ("none", "spag"):
        raise ConfigError(f"reward_shaping must be 'none' or 'spag', got {args.reward_shaping!r}")
    if args.reward_shaping == "spag" and not any(hasattr(g, "turn_weights") for g in games):
        raise ConfigError(f"reward_shaping: spag shapes games with turn_weights (taboo); none in {args.games!r}")


def turn_advantages(baseline_key, baselines, trajs):
    """Each learner turn's return minus its baseline (``id(trajectory)`` -> one per turn): the
    role's (game, seat, start) for every turn (``baseline_key`` "role"), or with "observation"
    the baseline of the exact observation the turn answered (the role's until it has one)."""
    if baseline_key == "role":
        roles = baselines.advantages([t.role for t in trajs], [t.reward for t in trajs])
        return {id(t): [float(a)] * len(t.turns) for t, a in zip(trajs, roles)}
    keys = [observation_key(t.role, turn.prompt_ids) for t in trajs for turn in t.turns]
    flat = iter(baselines.advantages(keys, [t.reward for t in trajs for _ in t.turns],
                                     fallback=[t.role for t in trajs for _ in t.turns]))
    baselines.advantages([t.role for t in trajs], [t.reward for t in trajs])  # the fallbacks learn too
    return {id(t): [float(next(flat)) for _ in t.turns] for t in trajs}


def training_samples(args: SelfPlayArgs, finished, baselines):
    """Step 5: advantages. Every learner turn gets its seat's return minus the role baseline;
    with ``reward_shaping: spag``, turns of games that define ``turn_weights`` get SPAG's
    weights instead (per game kind, over this step's games, as SPAG balances per batch).
    A turn with no utterance in the final state (an illegal answer) keeps the plain
    advantage, so breaking the rules is still punished; with ``illegal_penalty`` > 0 every
    illegal answer's turn gets ``-illegal_penalty`` instead."""
    trajs = [t for f in finished for t in f.trajectories]
    adv = turn_advantages(args.baseline_key, baselines, trajs)
    shaped: dict[int, list[float]] = {}
    if args.reward_shaping == "spag":
        kinds: dict[str, list] = {}
        for f in finished:
            if hasattr(f.episode.game, "turn_weights"):
                kinds.setdefault(f.episode.game.name, []).append(f)
        for group in kinds.values():
            weights = group[0].episode.game.turn_weights([f.final_state for f in group], args.shaping_decay)
            for f, w in zip(group, weights):
                for t in f.trajectories:
                    mine = iter(w[t.seat::2])
                    shaped[id(t)] = [a if turn.invalid else next(mine, a) for turn, a in zip(t.turns, adv[id(t)])]
    if args.illegal_penalty > 0:
        for t in trajs:
            per_turn = shaped.get(id(t), adv[id(t)])
            shaped[id(t)] = [-args.illegal_penalty if turn.invalid else a for turn, a in zip(t.turns, per_turn)]
    return [s for t in trajs for s in t.samples(shaped.get(id(t), adv[id(t)]))]


def make_episodes(cfg, step_games, league, me, tok, step, rank):
    """Step 1-2: who plays whom (``step_games``: each episode's game, from :func:`episode_games`),
    from where. Seeded by (seed, step, rank): resumable."""
    rng = random.Random(f"{cfg.trainer.seed}/{step}/{rank}")
    episodes = []
    for game in step_games:
        kind, snap = league.sample_opponent(rng)
        if kind == "mirror":
            players = (me, me)
        else:
            opp = league_bot(game) if kind == "bot" else \
                LLMPlayer(league.engine_for(snap), tok, learner=False, name=snap.name)
            players = (me, opp) if rng.random() < 0.5 else (opp, me)
        start, state = "initial", None
        if rng.random() < cfg.selfplay.reset_fraction and has_enumerable_actions(game):
            start, state = "reset", random_legal_reset(game, rng, cfg.selfplay.reset_max_plies)
        episodes.append(Episode(game, players, state, start, seed=rng.randrange(2**31),
                                sampling=text_sampling(cfg, game)))
    return episodes


def text_sampling(cfg, game):
    """Free-text games (Taboo) answer in sentences, not move names: their own answer budget.
    ``None`` (the step's sampling) for every other game."""
    if has_enumerable_actions(game):
        return None
    return SamplingParams(max_new_tokens=cfg.selfplay.text_max_new_tokens, temperature=cfg.trainer.temperature, top_p=cfg.selfplay.top_p,
                          stop=MOVE_STOP)


def snapshot_score(cfg, games, league, tok, step):
    """score(a, b) for :meth:`League.play_in`: a's mean result (win 1, draw 0, loss -1) over
    ``league_eval_games`` games against b, seats alternating, games cycling. Seeded by the
    pair, so every rank plays the same games and keeps the same table."""
    sampling = SamplingParams(max_new_tokens=cfg.selfplay.max_new_tokens, temperature=cfg.trainer.temperature, top_p=cfg.selfplay.top_p,
                              stop=MOVE_STOP, seed=hash((cfg.trainer.seed, step)) % (2**31))

    def score(a, b):
        pa = LLMPlayer(league.engine_for(a), tok, learner=False, name=a.name)
        pb = LLMPlayer(league.engine_for(b), tok, learner=False, name=b.name)
        eps = [Episode(games[i % len(games)], (pa, pb) if i % 2 == 0 else (pb, pa), seed=cfg.trainer.seed * 7919 + i,
                       sampling=text_sampling(cfg, games[i % len(games)]))
               for i in range(cfg.play_in.league_eval_games)]
        results = [float(np.sign(f.returns[0 if f.episode.players[0] is pa else 1]))
                   for f in play_episodes(eps, sampling, concurrency=cfg.selfplay.concurrency, max_turns=cfg.selfplay.max_turns)]
        return float(np.mean(results))

    return score


def make_averages(average: AverageConfig, games):
    """One running average policy per game that supports it (``average_policy``), else none."""
    if not average.average_policy:
        return {}
    avg = {g.name: AveragePolicy(g) for g in games if averageable(g)}
    if not avg:
        raise ConfigError("average_policy needs a game whose exact_metric is 'exploitability' "
                          f"(games: {[g.name for g in games]})")
    return avg


def make_feedback(feedback: FeedbackConfig, games):
    """Step 1-6 for the games learning from exact feedback (``feedback: exact``): one
    :class:`ExactFeedback` per game of ``exact_games`` (default: the exploitability games);
    none with sampled feedback."""
    if feedback.feedback != "exact":
        return {}
    chosen = exact_feedback_games(games, feedback.exact_games)
    if not chosen:
        raise ConfigError("feedback: exact needs a played game whose exact_metric is 'exploitability' "
                          f"(kuhn_poker) or one named in exact_games ({feedback.exact_games!r}); games: "
                          f"{[g.name for g in games]}; --feedback sampled plays them all")
    return {g.name: ExactFeedback(g, feedback.mmd_eta, feedback.mmd_alpha, feedback.mmd_magnet_every) for g in chosen}


def exact_targets(feedback, engine, tok, step):
    """Every exact-feedback game's MMD target samples for this step, and its metrics
    (``GAME/mmd_step``, ``GAME/distill_gap``, ``GAME/read_exploitability``)."""
    samples, metrics = [], {}
    for name, fb in feedback.items():
        part, m = fb.targets(engine, tok, step)
        samples += part
        metrics.update({f"{name}/{'read_exploitability' if k == 'exploitability' else k}": v for k, v in m.items()})
    return samples, metrics


def fold_averages(cfg, averages, engine, tok, step):
    """Read the current policy off every information set and fold it into each game's
    average (weight per ``average_weighting``); returns the policies read (for the log)."""
    out = {}
    sampling = SamplingParams(max_new_tokens=cfg.selfplay.max_new_tokens, temperature=cfg.trainer.temperature, top_p=cfg.selfplay.top_p,
                              stop=MOVE_STOP, seed=cfg.trainer.seed + step)
    for name, avg in averages.items():
        out[name] = policy_readout.tabular_policy(engine, tok, avg.game, resolved_readout(cfg.selfplay, tok), cfg.selfplay.readout_samples, sampling)
        avg.add(out[name], cfg.average.weight_at(step))
    return out


def average_metrics(averages):
    """``game/avg_exploitability`` of each non-empty average."""
    from lmselfplay.games.exploitability import exploitability

    return {f"{name}/avg_exploitability": exploitability(avg.game, avg.policy())
            for name, avg in averages.items() if avg.count}


def distill_averages(trainer, averages, tok, steps, logger=None):
    """``steps`` trainer steps of pure target cross-entropy toward every average policy
    (no completion tokens: no policy-gradient or KL term); the last step's metrics. The
    cross-entropy of every 10th step goes to the log as ``distill/target_ce``."""
    samples = [s for avg in averages.values() for s in distill_samples(avg.game, tok, avg.policy())]
    metrics = {}
    for i in tqdm(range(steps), desc="distil average", disable=not trainer.accelerator.is_main_process):
        metrics = trainer.step(samples)
        if logger is not None and (i % 10 == 0 or i == steps - 1):
            logger.log(trainer.step_count, {"distill/step": i + 1, "distill/target_ce": metrics["target_ce"]})
    return metrics


def episode_plan(cfg, step_games, league, me, tok, sampling, process_index):
    """``step -> play``: the step's episodes and seed are made in the caller (they read the
    league); ``play()`` plays them, returning (finished episodes, stats)."""
    def at(step):
        episodes = make_episodes(cfg, step_games, league, me, tok, step, process_index)
        sp, stats = dataclasses.replace(sampling, seed=hash((cfg.trainer.seed, step, process_index)) % (2**31)), RolloutStats()
        return lambda: (list(play_episodes(episodes, sp, concurrency=cfg.selfplay.concurrency, retries=cfg.selfplay.retries,
                                           max_turns=cfg.selfplay.max_turns, stats=stats)), stats)
    return at


def snapshot_engines(trainer, tok):
    """The league's engine factory: a frozen HF engine serving a snapshot's weights."""
    return lambda weights, version: HFEngine(frozen_policy(trainer.unwrapped, weights), tok, version=version)


@dataclass
class SelfPlay:
    """What the loop works on, built once by :func:`build` (a resume then restores it)."""

    games: list
    feedback: dict
    step_games: list  # each episode's game, the same every step (the games with exact feedback left out)
    positions: dict
    tok: object
    trainer: PolicyTrainer
    engine: object
    baselines: RoleBaselines
    league: League
    averages: dict
    me: LLMPlayer


def build(cfg: SelfPlayConfigs, run, games, feedback, positions) -> SelfPlay:
    """The policy, its trainer and engine, and the loop's state, fresh, each component from its
    own config. ``positions`` are the evaluation's fixed positions per game
    (``eval.selfplay_metrics.eval_positions``), computed once and reused by every evaluation."""
    if cfg.selfplay.gnugo_level > 0 and any(plays_gtp(g) for g in games) and find_gnugo() is None:
        run.acc.print("gnugo_level is set but gnugo is not installed (apt-get install gnugo): no GnuGo games")
    # the same every step; games with exact feedback learn without playing
    args = cfg.selfplay
    step_games = [g for g in episode_games(games, args.game_weights, args.episodes_per_step) if g.name not in feedback]
    device = str(run.acc.device)
    model, tok = load_policy(cfg.policy, device=device)
    check_thinking(cfg.average, feedback, tok)
    trainer = PolicyTrainer(model, tok, cfg.trainer, accelerator=run.acc, total_steps=args.max_steps,
                            ref_model=reference_policy(cfg.policy, cfg.trainer.beta, model, device),
                            surrogate=cfg.surrogate, target_loss=cfg.target_loss)
    engine = run.closing(make_engine(cfg.engine, trainer.unwrapped, tok, answer_budget=args.answer_budget(),  # hf | vllm | ...
                                     temperature=cfg.trainer.temperature, top_p=args.top_p, seed=cfg.trainer.seed))
    league = League(cfg.league, snapshot_engines(trainer, tok), play_in=cfg.play_in)
    return SelfPlay(games, feedback, step_games, positions, tok, trainer, engine, RoleBaselines(args.baseline_decay), league,
                    make_averages(cfg.average, games), LLMPlayer(engine, tok, learner=True))


def load_state(sp: SelfPlay, extra: dict) -> None:
    """What :func:`save_checkpoint` saved besides the trainer: baselines, league, averages, feedback."""
    sp.baselines.load_state_dict(extra["baselines"])
    sp.league.load_state_dict(extra["league"])
    for key, parts in (("averages", sp.averages), ("feedback", sp.feedback)):
        for name, state in extra.get(key, {}).items():
            parts[name].load_state_dict(state)


def save_checkpoint(run, sp: SelfPlay) -> None:
    """Step 9: the trainer's atomic checkpoint carries the loop's state as ``extra``."""
    sp.trainer.save_checkpoint(run.out, {"baselines": sp.baselines.state_dict(), "league": sp.league.state_dict(),
                                         "averages": {k: a.state_dict() for k, a in sp.averages.items()},
                                         "feedback": {k: f.state_dict() for k, f in sp.feedback.items()}})


def log_iterate_policies(cfg, run, sp: SelfPlay, step) -> None:
    """Fold the current policy into the averages (the checkpoint holds them up to step - 1)."""
    with sp.trainer.serving(sp.engine):
        read = fold_averages(cfg, sp.averages, sp.engine, sp.tok, step)
    run.log(step, {f"{name}/iterate_policy": pol for name, pol in read.items()})


def exact_feedback_step(run, sp: SelfPlay, step) -> list:
    """The referee's exact values, read off the policy before this step's update (logged)."""
    if not sp.feedback:
        return []
    with sp.trainer.serving(sp.engine):
        exact, exact_metrics = exact_targets(sp.feedback, sp.engine, sp.tok, step)
    run.log(step, exact_metrics)
    return exact


def step_row(sp: SelfPlay, metrics, stats, finished, stale, t0) -> dict:
    """The step's log row: trainer (its weight-sync check included), rollout, league, dropped-rollout
    and role-baseline metrics."""
    trajs = [t for f in finished for t in f.trajectories]
    mirror = [f for f in finished if f.episode.players[0] is f.episode.players[1]]
    return {**{f"train/{k}": v for k, v in metrics.items()},
            "rollout/invalid_rate": stats.as_dict()["invalid_rate"],
            "rollout/over_long_prompts": stats.over_long_prompts,  # forfeited: longer than the engine takes
            "rollout/mean_return": float(np.mean([t.reward for t in trajs])) if trajs else 0.0,
            "rollout/selfplay_first_seat_win_rate":
                float(np.mean([f.returns[0] > 0 for f in mirror])) if mirror else float("nan"),
            "rollout/tokens": stats.generated_tokens, "league/size": len(sp.league.ring), **stale,
            **{f"baseline/{k}": v for k, v in sp.baselines.values.items() if "|" not in k},  # roles only
            "wall_s": time.time() - t0}

