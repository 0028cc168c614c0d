"""Reading a policy off a language model: what it would play at a game position.

Training (exact feedback, the average policy, search distillation's prior) and evaluation
(the exact game metrics) read the policy the same way, so it lives here, in the lm layer:

* ``bare``: the teacher-forced probability of every legal answer written right after the
  assistant header (``<move>X</move>``), normalized over the legal moves
  (:func:`answer_distribution`). Exact and cheap, but it is the policy only of a model that
  answers at once;
* ``sampled``: ``samples`` answers per position, generated as the policy plays (its
  temperature, budget and stop rule, thinking included) and parsed (:func:`sampled_answers`);
  a position's policy is the frequency of each legal move among the legal answers
  (:func:`sampled_distribution`). This is the readout of a model that thinks (``auto`` picks
  it exactly then, :func:`resolve_readout`).
"""

from __future__ import annotations

import math
import random
from typing import Any

from lmselfplay.games import Invalid
from lmselfplay.games.base import all_states, move_text
from lmselfplay.games.text import MOVE_STOP, format_answer
from lmselfplay.lm.engines.base import SamplingParams, generate_fitting, score_fitting
from lmselfplay.lm.prompt import encode_completion, encode_prompt
from lmselfplay.lm.stream import generate_stream
from lmselfplay.utils.config import ConfigError

READOUTS = ("auto", "bare", "sampled")
MOVE_BUDGET = 16  # tokens of a bare "<move>X</move>" answer, with room for a word or two


def resolve_readout(readout: str, thinking: bool) -> str:
    """``auto`` -> ``sampled`` for a policy that thinks (a bare answer is not what it plays),
    ``bare`` otherwise; ``bare`` / ``sampled`` as given. ConfigError for anything else."""
    if readout not in READOUTS:
        raise ConfigError(f"readout must be one of {READOUTS}, got {readout!r}")
    if readout == "auto":
        return "sampled" if thinking else "bare"
    return readout


def decision_states(game: Any) -> list[Any]:
    """Every reachable non-terminal, non-chance position."""
    return [s for s in all_states(game) if not game.is_terminal(s) and game.current_player(s) >= 0]


def sampled_decision_states(game: Any, n: int, seed: Any) -> list[Any]:
    """Every decision position when ``n`` is 0 or covers them all; else ``n`` of them drawn
    with ``random.Random(seed)`` (the same set for every model measured with that seed)."""
    states = decision_states(game)
    return random.Random(seed).sample(states, n) if 0 < n < len(states) else states


def answer_distribution(engine: Any, tokenizer: Any, game: Any, states: list[Any],
                        temperature: float = 1.0) -> list[dict[int, float]]:
    """P(legal move) per state: each legal answer's teacher-forced sequence probability,
    normalized over the legal moves (what the policy would play if it answered legally). A move
    the engine could not score (prompt and answer longer than its context: NaN) gets probability
    0; a state with no scorable move gets the uniform distribution (nothing read, no preference)."""
    prompts, completions, index = [], [], []
    for i, s in enumerate(states):
        p = encode_prompt(tokenizer, game.observation_text(s, game.current_player(s)))
        for a in game.legal_actions(s):
            prompts.append(p)
            completions.append(encode_completion(tokenizer, format_answer(move_text(game, s, a)), eos=False))
            index.append((i, a))
    scores = score_fitting(engine, prompts, completions, temperature=temperature)
    logits: list[dict[int, float]] = [{} for _ in states]
    for (i, a), lp in zip(index, scores):
        logits[i][a] = sum(lp)
    return [normalized(d) for d in logits]


def normalized(logits: dict[int, float]) -> dict[int, float]:
    """The softmax of the finite log-probs; a NaN one gets 0; none finite: uniform."""
    finite = {a: v for a, v in logits.items() if math.isfinite(v)}
    if not finite:
        return {a: 1.0 / len(logits) for a in logits}
    m = max(finite.values())
    z = sum(math.exp(v - m) for v in finite.values())
    return {a: math.exp(finite[a] - m) / z if a in finite else 0.0 for a in logits}


def greedy_actions(engine: Any, tokenizer: Any, game: Any, states: list[Any],
                   max_new_tokens: int = MOVE_BUDGET) -> list[int | Invalid]:
    prompts = [encode_prompt(tokenizer, game.observation_text(s, game.current_player(s))) for s in states]
    outs = generate_fitting(engine, prompts, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=MOVE_STOP))
    return [game.parse_action(s, o.text) for s, o in zip(states, outs)]


def sampled_answers(engine: Any, tokenizer: Any, game: Any, states: list[Any], samples: int,
                    sampling: SamplingParams) -> list[list[int | Invalid]]:
    """``samples`` parsed answers per state, generated with ``sampling`` (the policy as it
    plays: its temperature, budget and stop rule) in one batched stream."""
    if samples < 1:
        raise ConfigError(f"readout_samples must be >= 1, got {samples}")
    prompts = [encode_prompt(tokenizer, game.observation_text(s, game.current_player(s))) for s in states]
    texts = generate_stream(engine, prompts, sampling, samples, desc=f"{game.name} readout")
    return [[game.parse_action(s, t) for t in row] for s, row in zip(states, texts)]


def sampled_distribution(answers: list[int | Invalid], legal: list[int]) -> dict[int, float]:
    """The frequency of each legal move among the legal answers; uniform when none is legal."""
    counts = {a: 0 for a in legal}
    for x in answers:
        if not isinstance(x, Invalid) and x in counts:
            counts[x] += 1
    total = sum(counts.values())
    return {a: (c / total if total else 1.0 / len(legal)) for a, c in counts.items()}


def tabular_policy(engine: Any, tokenizer: Any, game: Any, readout: str = "bare", samples: int = 32,
                   sampling: SamplingParams | None = None, legal_counts: list[int] | None = None
                   ) -> dict[str, list[float]]:
    """The LLM's action probabilities at every information state of a small
    imperfect-information game (one representative position per information state), by
    ``readout`` (``bare``: teacher-forced legal answers; ``sampled``: ``samples`` generated
    answers with ``sampling``, the legal moves' frequencies). With ``legal_counts`` (a list)
    the sampled readout appends [legal answers, answers] to it."""
    reps: dict[str, Any] = {}
    for s in decision_states(game):
        reps.setdefault(game.information_state(s, game.current_player(s)), s)
    keys = sorted(reps)
    states = [reps[k] for k in keys]
    if readout == "bare":
        dist = answer_distribution(engine, tokenizer, game, states)
    elif readout == "sampled":
        sampling = sampling or SamplingParams(max_new_tokens=MOVE_BUDGET, temperature=1.0, stop=MOVE_STOP)
        answers = sampled_answers(engine, tokenizer, game, states, samples, sampling)
        dist = [sampled_distribution(row, game.legal_actions(s)) for row, s in zip(answers, states)]
        if legal_counts is not None:
            legal_counts += [sum(not isinstance(x, Invalid) for row in answers for x in row), samples * len(states)]
    else:
        raise ConfigError(f"readout must be 'bare' or 'sampled' here, got {readout!r}")
    return {k: [d.get(a, 0.0) for a in range(game.n_actions)] for k, d in zip(keys, dist)}
