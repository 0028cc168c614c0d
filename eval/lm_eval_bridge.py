"""lm-evaluation-harness over the project's engine: ``--model lmselfplay``.

    lmselfplay lm-eval --model lmselfplay --model_args pretrained=runs/x/checkpoint-200 \\
        --tasks gsm8k --include_path my_tasks/          # the harness's own CLI, model registered
    # or from Python:
    import lmselfplay.eval.lm_eval_bridge                 # registers "lmselfplay"
    lm_eval.simple_evaluate(model=LMSelfPlay(engine=engine, tokenizer=tok), tasks=[...])

lm-eval (0.4) has no plugin entry point for models, so the registration happens on import
of this module; ``lmselfplay lm-eval ARGS`` imports it and hands ARGS to lm-eval's CLI.

How requests map onto the engine (:class:`lmselfplay.lm.engines.base.Engine`):

* ``loglikelihood(context, continuation)``: tokens as in lm-eval's HF model (trailing
  spaces of the context move to the continuation; continuation tokens = tokens of
  context+continuation past the context's), BOS in front as the project's formatter puts
  it, the context cut from the left to ``max_length``; the value is ``sum(engine.score)``,
  and ``is_greedy`` asks the engine for a greedy continuation of the same length.
* ``loglikelihood_rolling``: lm-eval's disjoint rolling windows of ``max_length`` tokens,
  each scored by ``engine.score``; the first token is conditioned on BOS (else EOS).
* ``generate_until``: ``engine.generate`` per group of equal generation settings, the
  output cut before the first stop string.

Task text goes to the model as the task wrote it; with ``--apply_chat_template`` a single
user turn is wrapped by the project's formatter (``lmselfplay.lm.prompt.format_prompt``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from lmselfplay.lm.engines.base import SamplingParams, generate_fitting, prompt_limit, score_fitting

log = logging.getLogger(__name__)


@register_model("lmselfplay")
class LMSelfPlay(LM):
    def __init__(self, pretrained: str | None = None, engine: Any = None, tokenizer: Any = None,
                 device: str = "auto", dtype: str = "auto", batch_size: int | str = 64,
                 max_length: int | None = None, greedy_check: bool = True, **unused: Any):
        super().__init__()
        if unused:
            log.warning("lmselfplay model ignores arguments %s", sorted(unused))
        if engine is None:
            from lmselfplay.lm.engines.hf import HFEngine
            from lmselfplay.models.policy import load_policy

            from .arena import model_dir  # a run's checkpoint-N dir works too

            path = None if pretrained is None else model_dir(pretrained)
            model, tokenizer = load_policy(model_name_or_path=path, device=device, dtype=dtype)
            bs = 64 if str(batch_size).startswith("auto") else int(batch_size)
            engine = HFEngine(model, tokenizer, max_batch_size=bs)
        elif tokenizer is None:
            raise ValueError("LMSelfPlay(engine=...) needs tokenizer= too")
        self.engine, self.tok = engine, tokenizer
        # A rolling window scores max_length + 1 tokens as one sequence (its first token is context
        # only), and a scored sequence must fit the engine's prompt limit (score_fitting).
        self.max_length = int(max_length or (prompt_limit(engine) or 2048) - 1)
        self.greedy_check = str(greedy_check).lower() not in ("false", "0")

    # --- tokens -------------------------------------------------------------------------
    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tok, "name_or_path", "lmselfplay")).replace("/", "__")

    def _prefix(self) -> list[int]:
        """BOS where the project's formatter puts one (no chat template), else nothing."""
        bos = self.tok.bos_token_id
        return [bos] if bos is not None and not getattr(self.tok, "chat_template", None) else []

    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole = self._encode(context + continuation)
        ctx = self._encode(context)
        cont = whole[len(ctx):]
        first = self._prefix() or [self.tok.eos_token_id]
        return first + ctx, cont

    def _fit(self, ctx: list[int], cont: list[int]) -> list[int]:
        """The context cut from the left so context + continuation fit in max_length."""
        room = max(1, self.max_length - len(cont))
        return ctx[-room:]

    # --- lm-eval API --------------------------------------------------------------------
    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        pairs = [self.encode_pair(*r.args) for r in requests]
        ctxs = [self._fit(c, k) for c, k in pairs]
        conts = [k for _, k in pairs]
        scores = score_fitting(self.engine, ctxs, conts)
        greedy = self._is_greedy(ctxs, conts) if self.greedy_check else [False] * len(pairs)
        return [(float(sum(s)), g) for s, g in zip(scores, greedy)]

    def _is_greedy(self, ctxs: list[list[int]], conts: list[list[int]]) -> list[bool]:
        out = [False] * len(ctxs)
        by_len: dict[int, list[int]] = {}
        for i, k in enumerate(conts):
            by_len.setdefault(len(k), []).append(i)
        for n, idx in by_len.items():
            if n == 0:
                for i in idx:
                    out[i] = True
                continue
            gens = self.engine.generate([ctxs[i] for i in idx], SamplingParams(max_new_tokens=n, temperature=0.0))
            for i, g in zip(idx, gens):
                out[i] = list(g.token_ids[:n]) == list(conts[i])
        return out

    def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
        first = (self._prefix() or [self.tok.eos_token_id])[0]
        windows, owner = [], []
        for r, req in enumerate(requests):
            toks = self._encode(req.args[0])
            for w in get_rolling_token_windows(toks, first, self.max_length, 1):
                windows.append(make_disjoint_window(w))
                owner.append(r)
        scores = score_fitting(self.engine, [c for c, _ in windows], [k for _, k in windows])
        totals = [0.0] * len(requests)
        for r, s in zip(owner, scores):
            totals[r] += float(sum(s))
        return totals

    def generate_until(self, requests: list[Any]) -> list[str]:
        groups: dict[tuple, list[int]] = {}
        settings = []
        for i, req in enumerate(requests):
            _, kw = req.args
            kw = dict(kw or {})
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kw.pop("max_gen_toks", 256))
            temp = float(kw.pop("temperature", 0.0)) if kw.pop("do_sample", False) else 0.0
            key = (tuple(until), max_new, temp, float(kw.pop("top_p", 1.0)))
            settings.append(key)
            groups.setdefault(key, []).append(i)
        out = [""] * len(requests)
        for (until, max_new, temp, top_p), idx in groups.items():
            prompts = []
            for i in idx:
                ctx = self._prefix() + self._encode(requests[i].args[0])
                prompts.append(ctx[-max(1, self.max_length - max_new):])
            sp = SamplingParams(max_new_tokens=max_new, temperature=temp, top_p=top_p, stop=list(until))
            for i, c in zip(idx, generate_fitting(self.engine, prompts, sp)):
                out[i] = cut_at_stop(c.text, until)
        return out

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        from lmselfplay.lm.prompt import format_prompt

        if len(chat_history) == 1 and chat_history[0].get("role") == "user":
            return format_prompt(self.tok, chat_history[0]["content"])
        if getattr(self.tok, "chat_template", None):
            return self.tok.apply_chat_template(chat_history, tokenize=False,
                                                add_generation_prompt=add_generation_prompt)
        raise ValueError("multi-turn chat needs a tokenizer with a chat template")


def cut_at_stop(text: str, stops: Any) -> str:
    """``text`` up to (not including) the earliest stop string."""
    cut = len(text)
    for s in stops:
        if s:
            k = text.find(s)
            if 0 <= k < cut:
                cut = k
    return text[:cut]


def main(argv: list[str] | None = None) -> int:
    """lm-eval's own CLI, with ``--model lmselfplay`` registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()
    return 0
