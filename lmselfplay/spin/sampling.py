"""Generation across processes: each process samples its contiguous share of the prompts, in
chunks of ``generation_batch_size`` (chunk i seeded ``seed + i``: a resumed or re-sharded run
draws the same answers), and every process gets every answer back in order."""

from __future__ import annotations

import dataclasses
from typing import Any

from accelerate import PartialState
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from lmselfplay.lm.engines.base import SamplingParams, generate_fitting
from lmselfplay.lm.engines.hf import HFEngine
from lmselfplay.spin.config import SpinConfigs


def sharded(state: PartialState, items: list[Any], fn: Any) -> list[Any]:
    """``fn(my contiguous share of items)`` on every process, gathered back in order."""
    with state.split_between_processes(list(items)) as mine:
        out = fn(list(mine)) if len(mine) else []
    return gather_object(out) if state.num_processes > 1 else out


def generate(engine: HFEngine, prompts: list[list[int]], sp: SamplingParams, batch: int,
             progress: bool, desc: str) -> list[Any]:
    """Completions of ``prompts`` in chunks of ``batch`` (chunk at offset i seeded ``sp.seed + i``),
    each cut to what the engine fits."""
    out = []
    for i in tqdm(range(0, len(prompts), batch), desc=desc, disable=not progress, leave=False):
        chunk_sp = dataclasses.replace(sp, seed=None if sp.seed is None else sp.seed + i)
        out += generate_fitting(engine, prompts[i : i + batch], chunk_sp)
    return out


def opponent_answers(engine: HFEngine, prompts: list[list[int]], sp: SamplingParams,
                     cfg: SpinConfigs, desc: str) -> list[tuple[list[int], str, str]]:
    """y' for each prompt: (sampled token ids exactly as sampled, their text, finish reason)."""
    return [(c.token_ids, c.text, c.finish_reason)
            for c in generate(engine, prompts, sp, cfg.spin.generation_batch_size, cfg.spin.progress, desc)]
