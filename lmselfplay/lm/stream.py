"""Many completions as one stream of batched engine calls (the evaluation and readout path)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from lmselfplay.lm.engines.base import SamplingParams, generate_fitting


def generate_stream(engine: Any, prompts: Sequence[list[int]], sampling: SamplingParams,
                    samples: int = 1, chunk_size: int | None = None,
                    desc: str = "generate") -> list[list[str]]:
    """``samples`` completions per prompt, as ONE stream of batched ``engine.generate``
    calls of ``chunk_size`` rows (default: the engine's ``max_batch_size``), longest
    prompts first so a chunk pads little. Chunk ``c`` is seeded ``seed + c`` (if seeded)."""
    from tqdm.auto import tqdm

    chunk = chunk_size or getattr(engine, "max_batch_size", 64)
    order = sorted(((i, j) for i in range(len(prompts)) for j in range(samples)),
                   key=lambda ij: -len(prompts[ij[0]]))
    texts: list[list[str]] = [[""] * samples for _ in prompts]
    with tqdm(total=len(order), desc=desc, unit="sample", leave=False) as bar:
        for c, start in enumerate(range(0, len(order), chunk)):
            part = order[start:start + chunk]
            sp = sampling if sampling.seed is None else dataclasses.replace(sampling, seed=sampling.seed + c)
            outs = generate_fitting(engine, [prompts[i] for i, _ in part], sp)
            for (i, j), o in zip(part, outs):
                texts[i][j] = o.text
            bar.update(len(part))
    return texts
