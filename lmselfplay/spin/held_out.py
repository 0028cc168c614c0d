"""SPIN's measure on the held-out prompts, per iteration: log p(y|x) of the data answer, log
p(y'|x) of the iteration opponent's answer, their margin, and the greedy answer's exact-answer
accuracy (95% Wilson); the per-prompt rows are saved (``eval/step-<t>.jsonl``) so iterations
can be compared prompt by prompt (paired), and every iteration's row goes to the log and the
curves (``spin_metrics.png``)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from accelerate import PartialState

from lmselfplay.lm.engines.base import SamplingParams, score_fitting
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.spin.config import SpinConfigs
from lmselfplay.spin.data import answers_match
from lmselfplay.spin.sampling import generate, sharded
from lmselfplay.utils.checkpoint import atomic_write_text
from lmselfplay.utils.run import Run
from lmselfplay.utils.stats import wilson


def sequence_logliks(engine: HFEngine, prompts: list[list[int]], completions: list[list[int]]
                     ) -> list[float]:
    """log p(completion | prompt) under the model in ``engine``, summed over the tokens."""
    return [float(sum(lp)) for lp in score_fitting(engine, prompts, completions, batch_size=32)]


def held_out_scores(engine: HFEngine, state: PartialState, held: list[dict[str, Any]],
                    prompts: list[list[int]], chosen: list[list[int]], rejected: list[list[int]],
                    gen_len: int, cfg: SpinConfigs) -> list[dict[str, Any]]:
    """Per held-out prompt, under the model in ``engine``: log p(y|x) of the data answer,
    log p(y'|x) of the iteration opponent's answer, the answer length, the greedy answer and
    whether its final answer is right. Every process takes its share; all get every row."""

    def shard(ii: list[int]) -> list[dict[str, Any]]:
        ll_y = sequence_logliks(engine, [prompts[i] for i in ii], [chosen[i] for i in ii])
        ll_r = sequence_logliks(engine, [prompts[i] for i in ii], [rejected[i] for i in ii])
        greedy = generate(engine, [prompts[i] for i in ii], SamplingParams(gen_len, temperature=0.0),
                          cfg.spin.generation_batch_size, False, "eval")
        return [{"loglik": a, "loglik_rejected": b, "answer_tokens": len(chosen[i]), "greedy": g.text,
                 "correct": answers_match(g.text, held[i]["answer"], held[i]["final"])}
                for i, a, b, g in zip(ii, ll_y, ll_r, greedy)]

    return sharded(state, list(range(len(held))), shard)


def summarize(scores: list[dict[str, Any]]) -> dict[str, float]:
    """Mean margin log p(y|x) - log p(y'|x), data-answer log-likelihood (with its 95%
    half-width), per-token log-likelihood and greedy exact-answer accuracy (95% Wilson)."""
    n = len(scores)
    ll = [s["loglik"] for s in scores]
    correct = sum(s["correct"] for s in scores)
    lo, hi = wilson(correct, n)
    return {"eval/margin": sum(s["loglik"] - s["loglik_rejected"] for s in scores) / n,
            "eval/answer_loglik": sum(ll) / n,
            "eval/answer_loglik_ci": mean_ci_half_width(ll),
            "eval/answer_loglik_per_token": sum(ll) / sum(s["answer_tokens"] for s in scores),
            "eval/accuracy": correct / n, "eval/accuracy_ci_low": lo, "eval/accuracy_ci_high": hi}


def held_out_metrics(engine: HFEngine, state: PartialState, held: list[dict[str, Any]],
             prompts: list[list[int]], chosen: list[list[int]], rejected: list[list[int]],
             gen_len: int, cfg: SpinConfigs, save_to: Path | None = None) -> dict[str, float]:
    """:func:`summarize` of :func:`held_out_scores`; the per-prompt rows also go to ``save_to``
    (JSON lines, main process, atomic) so runs can be compared prompt by prompt (paired)."""
    scores = held_out_scores(engine, state, held, prompts, chosen, rejected, gen_len, cfg)
    if save_to is not None and state.is_main_process:
        atomic_write_text(save_to, "".join(json.dumps(s) + "\n" for s in scores))
    return summarize(scores)


def mean_ci_half_width(xs: list[float], z: float = 1.96) -> float:
    """Half-width of the normal-approximation 95% interval of the mean of ``xs``."""
    if len(xs) < 2:
        return float("nan")
    m = sum(xs) / len(xs)
    return z * math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


PLOT_KEYS = ["eval/accuracy", "eval/margin", "eval/answer_loglik", "eval/answer_loglik_per_token",
             "train/loss", "train/reward_accuracy"]


def log_iteration(run: Run, t: int, row: dict[str, Any]) -> None:
    """The iteration's row in the log, the curves and a one-line summary (main process)."""
    run.log(t + 1, row)
    if run.is_main:
        run.logger.plot(PLOT_KEYS, "spin_metrics.png", title="SPIN on held-out prompts")
        print(json.dumps({"iteration": t + 1, **{k: round(v, 4) if isinstance(v, float) else v
                                                   for k, v in row.items()}}), file=sys.stderr)
