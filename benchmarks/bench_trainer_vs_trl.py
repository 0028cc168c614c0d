"""Trainer throughput against TRL's ``GRPOTrainer``, side by side in one run.

Same model (copies of the same weights, fp32, CPU), same prompts in the same order (checked
per batch) as the same token ids (through THE prompt formatter), same batch shape
(``--prompts`` prompts x ``--num-generations`` completions), same max completion length,
sampling (T=1, no top-k/top-p), ``num_iterations`` PPO passes per batch (one optimizer
step each), clip eps, beta (k3 KL to the frozen initial model), AdamW (lr, betas, no
weight decay, constant lr), grad-norm clip 1.0, token-mean loss (TRL ``loss_type="dapo"``),
group-normalized advantages, and the same reward. Tasks:
``games`` (default): positions from random Nim / tic-tac-toe / Kuhn poker playouts, reward 1
if the completion parses to a legal move (``game.parse_action``), else 0 — long prompts,
~4-token answers, training-bound; ``arithmetic``: word problems from
:mod:`lmselfplay.tasks.arithmetic`, reward 1 for the right ``#### N`` — ~17-token answers,
generation weighs more.

How it is timed. TRL runs as users run it, ``trainer.train()``; a callback fires at the
end of each of TRL's batches (every ``num_iterations`` optimizer steps) and runs one
batch of each of OUR variants there, so TRL and ours alternate batch by batch and share
the machine's noise. A TRL batch is the wall time between two such boundaries minus the
time spent in our callback (so it includes TRL's own per-step overhead). The first
``--warmup`` batches of each contender are dropped. Every time is taken twice: wall clock,
and CPU time of the process (torch runs one thread by default here, so CPU time is the
work itself, robust to other jobs on a shared machine; the wall clock is what a user
waits). Both tables are printed.

(a) full step = generation + reward + advantages + training, tokens/s and sec/batch.
(b) training only. Ours: ``PolicyTrainer.step`` on the generated samples (behaviour
    log-probs come from generation, ref log-probs are computed inside ``step``). TRL: the
    batch time minus the time inside ``GRPOTrainer._generate`` (tokenize + HF generate +
    decode) and ``_calculate_rewards``; what remains is TRL's "old" log-prob forward (it
    does not take log-probs from ``generate``), the reference forward, advantages and the
    ``num_iterations`` forward/backward/optimizer steps — the same work as ours' ``step``.

Tokens = completion tokens of the batch (all prompts x generations, EOS included), counted
once per batch (not once per PPO pass). Variants of ours: ``merge_identical`` on (the
default: equal (prompt, answer) turns share one row) and off (one row per completion,
the same rows TRL trains on).

    python benchmarks/bench_trainer_vs_trl.py [--task games|arithmetic] [--model PATH] [--prompts 8]
        [--num-generations 8] [--max-completion-length 16] [--num-iterations 2] [--beta 0.1]
        [--batches 8] [--warmup 2] [--threads 1] [--no-merge-variant]
"""

from __future__ import annotations

import argparse
import copy
import random
import re
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from lmselfplay.games import Invalid, make
from lmselfplay.games.base import random_playout
from lmselfplay.lm.engines import HFEngine, SamplingParams
from lmselfplay.lm.prompt import encode_prompt, text_for_prompt_ids
from lmselfplay.lm.trajectory import Sample
from lmselfplay.models.policy import load_policy
from lmselfplay.rl.advantages import group_advantages
from lmselfplay.rl.trainer import PolicyTrainer, SurrogateConfig, TrainerConfig
from lmselfplay.tasks.arithmetic import arithmetic_problem, arithmetic_prompt
from lmselfplay.utils.results import save_results

GAMES = ("nim", "tictactoe", "kuhn_poker")
FINAL = re.compile(r"####\s*(-?\d+)")


@dataclass
class Position:
    prompt_ids: list[int]
    trl_text: str  # the prompt text TRL gets; tokenizes to exactly `prompt_ids`
    score: Callable[[str], float]  # the reward of a completion text


def game_positions(tok: Any, n: int, seed: int) -> list[Position]:
    """``n`` decision positions from random playouts, games interleaved; reward 1 if the
    completion parses to a legal move (``game.parse_action``), else 0."""
    rng = random.Random(seed)
    out: list[Position] = []
    pools: dict[str, list[Any]] = {name: [] for name in GAMES}
    while len(out) < n:
        name = GAMES[len(out) % len(GAMES)]
        game = make(name)
        while not pools[name]:
            states = random_playout(game, rng.randrange(1 << 30))
            pools[name] = [s for s in states if game.current_player(s) >= 0]
        state = pools[name].pop(rng.randrange(len(pools[name])))
        text = game.observation_text(state, game.current_player(state))

        def legal(completion: str, game: Any = game, state: Any = state) -> float:
            return 0.0 if isinstance(game.parse_action(state, completion), Invalid) else 1.0

        out.append(position(tok, text, legal))
    return out


def arithmetic_positions(tok: Any, n: int, seed: int) -> list[Position]:
    """``n`` arithmetic word problems; reward 1 if the last ``#### N`` is the answer."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        problem = arithmetic_problem(rng)

        def correct(completion: str, final: str = problem["final"]) -> float:
            found = FINAL.findall(completion)
            return 1.0 if found and found[-1] == final else 0.0

        out.append(position(tok, arithmetic_prompt(problem), correct))
    return out


def position(tok: Any, text: str, score: Callable[[str], float]) -> Position:
    """TRL tokenizes a plain-text prompt with ``tokenizer(text)`` (its special-token
    default): the position carries the text that gives exactly our ids (:func:`encode_prompt`)."""
    return Position(encode_prompt(tok, text), text_for_prompt_ids(tok, text), score)


def stamp() -> np.ndarray:
    """(wall seconds, CPU seconds of this process). With one torch thread the CPU time
    is what the work costs, free of waiting for the cores other jobs hold."""
    return np.array([time.perf_counter(), time.process_time()])


@dataclass
class Timing:  # per timed batch; full / train are (wall, cpu) pairs
    full: list[np.ndarray] = field(default_factory=list)
    train: list[np.ndarray] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    completions: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)


class OurRunner:
    """One batch = HFEngine.generate -> rewards -> group advantages -> PolicyTrainer.step."""

    def __init__(self, name: str, model: Any, tok: Any, cfg: TrainerConfig, accelerator: Any,
                 sampling: SamplingParams, G: int, surrogate: SurrogateConfig, seed: int):
        self.name, self.G, self.sampling = name, G, sampling
        self.trainer = PolicyTrainer(model, tok, cfg, accelerator=accelerator, total_steps=10**6, surrogate=surrogate,
                                     seed=seed)
        self.engine = HFEngine(self.trainer.unwrapped, tok)
        self.timing = Timing()

    def run_batch(self, batch: list[Position], record: bool) -> None:
        t0 = stamp()
        prompts = [p.prompt_ids for p in batch for _ in range(self.G)]
        comps = self.engine.generate(prompts, self.sampling)
        owners = [p for p in batch for _ in range(self.G)]
        rewards = np.array([p.score(c.text) for p, c in zip(owners, comps)]).reshape(len(batch), self.G)
        adv = group_advantages(rewards).reshape(-1)
        samples = [Sample(c.prompt_ids, c.token_ids, c.logprobs, float(a), float(r))
                   for c, a, r in zip(comps, adv, rewards.reshape(-1))]
        t1 = stamp()
        self.trainer.step(samples)
        self.engine.update_weights(self.trainer.unwrapped)  # shared module: only the version
        t2 = stamp()
        if record:
            self.timing.full.append(t2 - t0)
            self.timing.train.append(t2 - t1)
            self.timing.tokens.append(sum(len(c.token_ids) for c in comps))
            self.timing.completions.append(len(comps))
            self.timing.reward.append(float(rewards.mean()))


def build_trl(model: Any, tok: Any, data: list[Position], args: argparse.Namespace, out_dir: str):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    by_text = {p.trl_text: p for p in data}

    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return [by_text[p].score(c) for p, c in zip(prompts, completions)]

    total_batches = args.warmup + args.batches
    cfg = GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, gradient_checkpointing=False, seed=args.seed,
        per_device_train_batch_size=args.prompts * args.num_generations, gradient_accumulation_steps=1,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
        num_iterations=args.num_iterations, beta=args.beta, epsilon=args.epsilon, loss_type="dapo",
        scale_rewards="group", temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=args.lr, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
        lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
        max_steps=total_batches * args.num_iterations, shuffle_dataset=False,
        dataloader_num_workers=0, dataloader_pin_memory=False, remove_unused_columns=False)
    ds = Dataset.from_dict({"prompt": [p.trl_text for p in data]})
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=ds,
                          processing_class=tok)
    return trainer


class TRLClock:
    """Wraps the generation / reward methods of a GRPOTrainer instance to time them and
    count completion tokens."""

    def __init__(self, trainer: Any):
        self.gen = np.zeros(2)
        self.tokens = 0
        self.rewards: list[float] = []
        self.prompts: list[str] = []
        gen, calc = trainer._generate, trainer._calculate_rewards

        def timed_generate(prompts):
            self.prompts = list(prompts)
            t = stamp()
            out = gen(prompts)
            self.gen += stamp() - t
            self.tokens += sum(len(ids) for ids in out[1])  # completion_ids
            return out

        def timed_rewards(*a, **k):
            t = stamp()
            out = calc(*a, **k)
            self.gen += stamp() - t
            self.rewards.append(float(torch.nanmean(out).item()))
            return out

        trainer._generate, trainer._calculate_rewards = timed_generate, timed_rewards

    def take(self) -> tuple[np.ndarray, int, float]:
        out = (self.gen, self.tokens, self.rewards[-1] if self.rewards else float("nan"))
        self.gen, self.tokens = np.zeros(2), 0
        return out


def make_callback(trl_trainer: Any, clock: TRLClock, ours: list[OurRunner], batches: list[list[Position]],
                  args: argparse.Namespace, trl_timing: Timing):
    from transformers import TrainerCallback

    bar = tqdm(total=len(batches), desc="batches (TRL + ours, alternating)")

    class Alternate(TrainerCallback):
        def __init__(self):
            self.mark = stamp()
            self.k = 0  # TRL batches done

        def on_train_begin(self, *_, **__):
            self.mark = stamp()

        def on_step_end(self, _args, state, control, **__):
            if state.global_step % args.num_iterations:
                return control
            now = stamp()
            gen, tokens, reward = clock.take()
            ours_prompts = [p.trl_text for p in batches[self.k] for _ in range(args.num_generations)]
            if sorted(clock.prompts) != sorted(ours_prompts):
                raise RuntimeError(f"TRL batch {self.k} saw other prompts than ours would: not comparable")
            record = self.k >= args.warmup
            if record:
                trl_timing.full.append(now - self.mark)
                trl_timing.train.append(now - self.mark - gen)
                trl_timing.tokens.append(tokens)
                trl_timing.completions.append(args.prompts * args.num_generations)
                trl_timing.reward.append(reward)
            # our variants on the same prompts TRL just trained on; alternate their order
            order = ours if self.k % 2 == 0 else ours[::-1]
            for runner in order:
                runner.run_batch(batches[self.k], record)
            self.k += 1
            bar.update(1)
            self.mark = stamp()
            return control

        def on_train_end(self, *_, **__):
            bar.close()

    return Alternate()


def summarize(name: str, t: Timing) -> dict[str, Any]:
    tok = sum(t.tokens)
    full, train = np.array(t.full), np.array(t.train)  # (batches, 2): wall, cpu
    return {"name": name, "full_s": full.mean(0), "train_s": train.mean(0), "full_tps": tok / full.sum(0),
            "train_tps": tok / train.sum(0), "full_sd": full.std(0, ddof=1) if len(full) > 1 else np.zeros(2),
            "len": tok / sum(t.completions), "reward": statistics.mean(t.reward)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model dir; default: the embedded tiny model")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per batch")
    ap.add_argument("--num-generations", type=int, default=8, help="G completions per prompt")
    ap.add_argument("--task", choices=("games", "arithmetic"), default="games",
                    help="games: Nim/tic-tac-toe/Kuhn positions, legal-move reward (short answers); "
                         "arithmetic: word problems, exact-answer reward (longer answers)")
    ap.add_argument("--max-completion-length", type=int, default=None, help="default: 16 games, 40 arithmetic")
    ap.add_argument("--num-iterations", type=int, default=2, help="PPO passes (optimizer steps) per batch")
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--epsilon", type=float, default=0.2)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--batches", type=int, default=8, help="timed batches per contender")
    ap.add_argument("--warmup", type=int, default=2, help="untimed batches per contender first")
    ap.add_argument("--no-merge-variant", action="store_true", help="skip ours with merge_identical=False")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (0: torch's default). 1 by default: this model's ops are too small "
                         "for intra-op threads to pay, and on a shared machine extra threads measure the scheduler")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(args.seed)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    from accelerate import Accelerator

    base, tok = load_policy(model_name_or_path=args.model, device="cpu", dtype="float32")
    n_batches = args.warmup + args.batches
    if args.max_completion_length is None:
        args.max_completion_length = 16 if args.task == "games" else 40
    make_data = game_positions if args.task == "games" else arithmetic_positions
    data = make_data(tok, args.prompts * n_batches, args.seed)
    batches = [data[i * args.prompts : (i + 1) * args.prompts] for i in range(n_batches)]

    with tempfile.TemporaryDirectory() as out_dir:
        trl_trainer = build_trl(copy.deepcopy(base), tok, data, args, out_dir)
        acc = Accelerator(cpu=True)  # the same process state TRL's `use_cpu=True` made
        sampling = SamplingParams(max_new_tokens=args.max_completion_length, temperature=1.0, top_p=1.0)
        variants = [("ours (merge_identical)", True)]
        if not args.no_merge_variant:
            variants.append(("ours (no merge)", False))
        ours = []
        for name, merge in variants:
            cfg = TrainerConfig(learning_rate=args.lr, weight_decay=0.0, max_grad_norm=1.0,
                                lr_scheduler_type="constant", gradient_accumulation_steps=1,
                                num_iterations=args.num_iterations, beta=args.beta, merge_identical=merge)
            ours.append(OurRunner(name, copy.deepcopy(base), tok, cfg, acc, sampling, args.num_generations,
                                  SurrogateConfig(epsilon=args.epsilon), args.seed))
        trl_timing = Timing()
        clock = TRLClock(trl_trainer)
        trl_trainer.add_callback(make_callback(trl_trainer, clock, ours, batches, args, trl_timing))
        trl_trainer.train()

    rows = [summarize("TRL GRPOTrainer", trl_timing)] + [summarize(r.name, r.timing) for r in ours]
    n_params = sum(p.numel() for p in base.parameters())
    print(f"\nmodel {args.model or 'embedded tiny'}: {n_params / 1e6:.2f}M params, fp32 CPU, "
          f"torch threads {torch.get_num_threads()}")
    print(f"task {args.task}; batch: {args.prompts} prompts x G={args.num_generations}, "
          f"max completion {args.max_completion_length}, "
          f"num_iterations {args.num_iterations}, beta {args.beta}, lr {args.lr}; "
          f"{args.batches} timed batches each after {args.warmup} warm-up, alternating; "
          f"one batch = {args.num_iterations} optimizer steps")
    for j, clock_name in enumerate(("wall clock", "CPU time of this process")):
        print(f"\n[{clock_name}]")
        print(f"{'':26s} {'full s/batch':>14s} {'full tok/s':>11s} {'train s/batch':>14s} {'train tok/s':>12s} "
              f"{'mean len':>9s} {'reward':>7s}")
        for r in rows:
            print(f"{r['name']:26s} {r['full_s'][j]:8.3f}±{r['full_sd'][j]:.3f} {r['full_tps'][j]:11.0f} "
                  f"{r['train_s'][j]:14.3f} {r['train_tps'][j]:12.0f} {r['len']:9.1f} {r['reward']:7.2f}")
        trl = rows[0]
        for r in rows[1:]:
            print(f"{r['name']} / TRL: full step tokens/s x{r['full_tps'][j] / trl['full_tps'][j]:.2f} "
                  f"(sec/batch x{trl['full_s'][j] / r['full_s'][j]:.2f}),  training only tokens/s "
                  f"x{r['train_tps'][j] / trl['train_tps'][j]:.2f} "
                  f"(sec/batch x{trl['train_s'][j] / r['train_s'][j]:.2f})"
                  f"  (goal >= 1x)")
    save_results("bench_trainer_vs_trl", {"rows": rows, "params": n_params})


if __name__ == "__main__":
    main()
