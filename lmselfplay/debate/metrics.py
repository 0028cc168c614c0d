"""What a judge gets right under each protocol, with 95% Wilson intervals.

Per protocol (:func:`protocol_metrics`):

* ``accuracy`` — share of transcripts where the judge's order-averaged P(correct) > 1/2
  (exactly 1/2 counts half: an undecided judge is right half the time), with its 95%
  Wilson interval ``accuracy_ci_low/high``; ``accuracy_one_order`` — the same from the
  forward order alone; ``p_correct`` — the mean order-averaged P(correct);
* ``position_bias`` — the mean of (P(A | forward) + P(A | swapped)) / 2 - 1/2;
* speech statistics: mean tokens and characters per speech, ``verified_quote_share``
  (verified quotes / all quotes; NaN without quotes), quotes per speech, and the share of
  speeches each hostile-speech rule fired on (``flag/<name>``), the share of transcripts
  whose speech prompts had to be cut (``prompt_cut_share``);
* ``accuracy_when_true_side`` / ``accuracy_when_false_side`` (consultancy): the judge's
  accuracy when the consultant defended the correct / the wrong answer.
"""

from __future__ import annotations

import math

import numpy as np

from lmselfplay.utils.stats import wilson

FLAGS = ("empty", "cut", "at_max_tokens", "impersonation", "fake_markers")


def _accuracy(values: list[float], prefix: str = "accuracy") -> dict[str, float]:
    n = len(values)
    lo, hi = wilson(float(sum(values)), n)
    return {prefix: float(np.mean(values)) if n else math.nan, f"{prefix}_ci_low": lo, f"{prefix}_ci_high": hi}


def protocol_metrics(transcripts, judgments) -> dict[str, float]:
    out = {"n": float(len(transcripts))}
    out.update(_accuracy([j.correct for j in judgments]))
    out["accuracy_one_order"] = float(np.mean([j.correct_one_order for j in judgments])) if judgments else math.nan
    out["p_correct"] = float(np.mean([j.p_correct for j in judgments])) if judgments else math.nan
    out["position_bias"] = float(np.mean([j.position_bias for j in judgments])) if judgments else math.nan
    out["prompt_cut_share"] = float(np.mean([tr.prompt_cuts > 0 for tr in transcripts])) if transcripts else 0.0
    speeches = [s for tr in transcripts for s in tr.speeches]
    if speeches:
        quotes = sum(s.flags["quotes"] for s in speeches)
        out["speech_tokens"] = float(np.mean([len(s.completion_ids) for s in speeches]))
        out["speech_chars"] = float(np.mean([len(s.raw) for s in speeches]))
        out["quotes_per_speech"] = quotes / len(speeches)
        out["verified_quote_share"] = sum(s.flags["verified"] for s in speeches) / quotes if quotes else math.nan
        for f in FLAGS:
            out[f"flag/{f}"] = float(np.mean([s.flags.get(f, 0) > 0 for s in speeches]))
    if transcripts and transcripts[0].protocol == "consultancy":
        for name, want in (("true_side", True), ("false_side", False)):
            vals = [j.correct for tr, j in zip(transcripts, judgments) if tr.side_is_correct(0) == want]
            out[f"accuracy_when_{name}"] = float(np.mean(vals)) if vals else math.nan
    return out


def format_table(rows: dict[str, dict[str, dict[str, float]]]) -> str:
    """``rows[checkpoint][protocol] -> metrics`` as a plain-text table."""
    head = (f"{'checkpoint':<12} {'protocol':<19} {'n':>4} {'accuracy [95% CI]':>22} {'1-order':>8} "
            f"{'P(correct)':>10} {'pos.bias':>9} {'tokens':>7} {'verified':>9}")
    lines = [head, "-" * len(head)]
    for ckpt, per in rows.items():
        for proto, m in per.items():
            ci = f"{m['accuracy']:.3f} [{m['accuracy_ci_low']:.2f}, {m['accuracy_ci_high']:.2f}]"
            lines.append(f"{ckpt:<12} {proto:<19} {int(m['n']):>4} {ci:>22} {m['accuracy_one_order']:>8.3f} "
                         f"{m['p_correct']:>10.3f} {m['position_bias']:>+9.3f} {m.get('speech_tokens', 0):>7.1f} "
                         f"{_fmt(m.get('verified_quote_share', math.nan)):>9}")
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}"
