"""Judges of debate / consultancy transcripts, and the judge as a referee.

A judge gives ``P(A)``: the probability that the answer labelled A is the correct one,
for a transcript shown with its options in the given order or reversed. Every judgment
asks both orders and averages (:func:`judge_transcripts`):

    p_fwd = P(A | options as given)        p_swp = P(A | options reversed)
    P(options[0]) = (p_fwd + 1 - p_swp) / 2           (position effects cancel)
    position bias = (p_fwd + p_swp) / 2 - 1/2         (> 0: the judge favours label A)

A judge that adds a constant b to P(A) whatever the content gets the same averaged
probability as without it, and a bias of exactly b.

* :class:`LLMJudge` — any causal LM (by path, or the frozen initial policy): P(A) from
  the teacher-forced log-probs of the two label completions ``A`` and ``B`` after the
  judge prompt (``engine.score``), normalized over the two. No text is generated, so
  there is no judge output to parse; a non-finite score (a broken model) gives 1/2 and is
  counted in ``invalid``.
* :class:`RuleJudge` — no model: believes the side with more verified quotes (minus
  unverified ones); for tests and as a rules baseline.
* :class:`JudgeReferee` — the referee interface, ``score(tasks, answers) -> list[Verdict]``
  with provenance ``"judge"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from lmselfplay.debate.protocols import (
    LABELS,
    Transcript,
    fit_prompt,
    judge_prompt,
    new_transcripts,
)
from lmselfplay.debate.tasks import DebateTask
from lmselfplay.lm.engines.base import score_fitting
from lmselfplay.lm.prompt import encode_completion
from lmselfplay.verifiers.referees import Verdict


class Judge(Protocol):
    def prob_a(self, transcripts: list[Transcript], swapped: list[bool]) -> list[float]:
        """P(label A is correct) per transcript, options reversed where ``swapped``."""
        ...


@dataclass
class Judgment:
    p_forward: float  # P(A), options as given
    p_swapped: float  # P(A), options reversed
    p_first: float  # P(options[0]), both orders averaged
    p_correct: float  # P(the correct option), both orders averaged
    position_bias: float  # (p_forward + p_swapped) / 2 - 1/2
    correct_index: int  # which of the transcript's options (0 = A as given) is correct

    @property
    def correct(self) -> float:
        """1 right, 0 wrong, 1/2 a tie (an undecided judge is right half the time)."""
        return 1.0 if self.p_correct > 0.5 else 0.5 if self.p_correct == 0.5 else 0.0

    @property
    def correct_one_order(self) -> float:
        """The same from the forward order alone (what a judge without swapping decides)."""
        p = self.p_forward if self.correct_index == 0 else 1.0 - self.p_forward
        return 1.0 if p > 0.5 else 0.5 if p == 0.5 else 0.0


def judge_transcripts(judge: Judge, transcripts: list[Transcript]) -> list[Judgment]:
    """Both orders of every transcript in one batch, combined as in the module doc."""
    n = len(transcripts)
    p = judge.prob_a(transcripts + transcripts, [False] * n + [True] * n)
    out = []
    for tr, fwd, swp in zip(transcripts, p[:n], p[n:]):
        first = (fwd + 1.0 - swp) / 2
        pc = first if tr.correct_index == 0 else 1.0 - first
        out.append(Judgment(fwd, swp, first, pc, (fwd + swp) / 2 - 0.5, tr.correct_index))
    return out


def side_rewards(tr: Transcript, j: Judgment) -> list[float]:
    """Zero-sum reward per speaker: 2 P(its option) - 1 (the debaters defend opposite options)."""
    return [2.0 * (j.p_first if side == 0 else 1.0 - j.p_first) - 1.0 for side in tr.sides]


class LLMJudge:
    def __init__(self, engine: Any, tokenizer: Any, hidden_context: bool = True, max_prompt_tokens: int = 320):
        self.engine, self.tokenizer = engine, tokenizer
        self.hidden_context = hidden_context
        self.labels = [encode_completion(tokenizer, label, eos=False) for label in LABELS]
        self.max_prompt_tokens = max_prompt_tokens - max(len(x) for x in self.labels)
        self.invalid = 0  # non-finite scores replaced by 1/2
        self.prompt_cuts = 0

    def prompt_ids(self, tr: Transcript, swapped: bool) -> list[int]:
        ids, cut = fit_prompt(
            self.tokenizer, lambda om, ctx: judge_prompt(tr, swapped, self.hidden_context, om, ctx),
            len(tr.speeches), tr.task.context, self.max_prompt_tokens)
        self.prompt_cuts += int(cut)
        return ids

    def prob_a(self, transcripts: list[Transcript], swapped: list[bool]) -> list[float]:
        prompts = [self.prompt_ids(tr, s) for tr, s in zip(transcripts, swapped)]
        n = len(prompts)
        lps = score_fitting(self.engine, prompts + prompts, [self.labels[0]] * n + [self.labels[1]] * n)
        out = []
        for a, b in zip(lps[:n], lps[n:]):
            d = sum(a) - sum(b)
            if not math.isfinite(d):
                self.invalid += 1
                out.append(0.5)
                continue
            out.append(1.0 / (1.0 + math.exp(-max(min(d, 60.0), -60.0))))
        return out


class RuleJudge:
    """P(A) = sigmoid(scale * (evidence(A) - evidence(B))), evidence = verified quotes minus
    unverified quotes of the speeches defending that option. No speeches: 1/2."""

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def prob_a(self, transcripts: list[Transcript], swapped: list[bool]) -> list[float]:
        out = []
        for tr, s in zip(transcripts, swapped):
            ev = [0.0, 0.0]
            for sp in tr.speeches:
                label = tr.sides[sp.speaker] ^ int(s)
                ev[label] += sp.flags.get("verified", 0) - (sp.flags.get("quotes", 0) - sp.flags.get("verified", 0))
            out.append(1.0 / (1.0 + math.exp(-self.scale * (ev[0] - ev[1]))))
        return out


class JudgeReferee:
    """The judge behind the referee interface. A task is a :class:`DebateTask` (the judge
    alone reads the question) or a :class:`Transcript` (it also reads the speeches); the
    answer is one of the task's two options. Verdict: reward = P(answer is correct)
    (both orders averaged), label = the option the judge prefers (ties: the first listed);
    an answer that is neither option gets reward 0 and ``detail['reason']``."""

    provenance = "judge"

    def __init__(self, judge: Judge, seed: int = 0):
        self.judge, self.seed = judge, seed

    def score(self, tasks: list[DebateTask | Transcript], answers: list[str]) -> list[Verdict]:
        if len(tasks) != len(answers):
            raise ValueError(f"{len(tasks)} tasks but {len(answers)} answers")
        trs = [t if isinstance(t, Transcript) else new_transcripts([t], "none", self.seed)[0] for t in tasks]
        out = []
        for tr, ans, j in zip(trs, answers, judge_transcripts(self.judge, trs)):
            label = tr.options[0] if j.p_first >= 0.5 else tr.options[1]
            detail = {"p_forward": j.p_forward, "p_swapped": j.p_swapped, "position_bias": j.position_bias}
            a = str(ans).strip()
            if a == tr.options[0].strip():
                reward = j.p_first
            elif a == tr.options[1].strip():
                reward = 1.0 - j.p_first
            else:
                reward, detail["reason"] = 0.0, "the answer is not one of the task's two options"
            out.append(Verdict(reward, label, self.provenance, detail))
        return out


def load_llm_judge(model_name_or_path: str | None, device: str = "auto", dtype: str = "auto",
                   **kwargs: Any) -> LLMJudge:
    """A frozen judge from any causal LM (a hub name or local path; None: the embedded
    model); ``kwargs`` go to :class:`LLMJudge`. Loading the policy's own path again gives
    a frozen copy of the initial policy. ``device`` / ``dtype`` are the ``judge_device`` /
    ``judge_dtype`` fields: a dtype error names ``judge_dtype``."""
    from lmselfplay.lm.engines import HFEngine
    from lmselfplay.models.policy import PolicyConfig, check_dtype, load_policy

    check_dtype(dtype, "judge_dtype")  # before PolicyConfig's own check, which would name its dtype
    model, tok = load_policy(PolicyConfig(model_name_or_path=model_name_or_path, dtype=dtype), device=device,
                             dtype_field="judge_dtype")
    model.requires_grad_(False).eval()
    return LLMJudge(HFEngine(model, tok), tok, **kwargs)
