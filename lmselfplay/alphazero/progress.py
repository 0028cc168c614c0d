"""What an AlphaZero run carries from iteration to iteration, and its checkpoints.

:class:`Progress` holds everything besides the network and its optimizer: the RNGs of
self-play and training, the self-play network's weights (``best``: with the gate, the last
network that passed it), the replay window, the bank of frozen opponents, every evaluated
network and the win-rate matrix. A checkpoint (:func:`checkpoint_state`, written by
:func:`save` as an atomic ``checkpoint-<iteration>`` folder) holds all of it plus torch's RNG
state, so ``--resume`` (:func:`restore`) continues exactly; a resume with another game or
network shape is refused.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmselfplay.alphazero.config import AlphaZeroArgs, AlphaZeroConfigs
from lmselfplay.alphazero.network import PolicyValueNet
from lmselfplay.alphazero.searched_games import Samples
from lmselfplay.utils.checkpoint import atomic_dir, prune_checkpoints
from lmselfplay.utils.config import ConfigError
from lmselfplay.utils.run import Run


def frozen(net: PolicyValueNet, state: dict[str, torch.Tensor]) -> PolicyValueNet:
    """A copy of ``net`` holding the weights ``state``, in eval mode (an opponent; never trained)."""
    other = copy.deepcopy(net)
    other.load_state_dict(state)
    return other.eval()


def snapshot(net: PolicyValueNet) -> dict[str, torch.Tensor]:
    """The weights of ``net`` now, detached copies (later training leaves them as they are)."""
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


@dataclass
class Progress:
    """What a checkpoint holds besides the network and its optimizer."""

    rng: random.Random
    np_rng: np.random.Generator
    best: dict[str, torch.Tensor]  # the self-play network when gating
    replay: list[Samples] = field(default_factory=list)
    bank: list[dict[str, torch.Tensor]] = field(default_factory=list)
    history: list[dict[str, torch.Tensor]] = field(default_factory=list)  # every evaluated checkpoint
    matrix: list[list[float]] = field(default_factory=list)


def restore(run: Run, cfg: AlphaZeroArgs, net: Any, opt: Any, p: Progress) -> int:
    """--resume: network, optimizer, replay, bank, matrix and RNGs from ``run.checkpoint``
    (the game and network shape must match); the iteration to go on from."""
    if run.checkpoint is None:
        return 1
    st = torch.load(run.checkpoint / "state.pt", weights_only=False)
    saved = st["config"]
    changed = [f"{k}={saved.get(k)!r}" for k in ("game", "game_args", "hidden", "blocks")
               if saved.get(k) != getattr(cfg, k)]
    if saved.get("network", "mlp") != cfg.network:
        changed.append(f"network={saved.get('network', 'mlp')!r}")
    if changed:
        raise ConfigError(f"--resume: {run.checkpoint} was trained with {', '.join(changed)}; "
                          "use the same values or another output_dir")
    net.load_state_dict(st["net"])
    opt.load_state_dict(st["opt"])
    p.replay = [Samples(**r) for r in st["replay"]]
    p.bank, p.history, p.matrix, p.best = st["bank"], st["history"], st["matrix"], st["best"]
    p.rng.setstate(st["rng"])
    p.np_rng.bit_generator.state = st["np_rng"]
    torch.set_rng_state(st["torch_rng"])
    return st["iteration"] + 1


def checkpoint_state(cfg: AlphaZeroConfigs, it: int, net: Any, opt: Any, p: Progress) -> dict[str, Any]:
    """Everything :func:`restore` needs to continue after iteration ``it`` exactly."""
    return {"iteration": it, "net": net.state_dict(), "opt": opt.state_dict(),
            "replay": [dataclasses.asdict(r) for r in p.replay], "bank": p.bank,
            "history": p.history, "matrix": p.matrix, "best": p.best,
            "rng": p.rng.getstate(), "np_rng": p.np_rng.bit_generator.state,
            "torch_rng": torch.get_rng_state(), "config": cfg.as_dict()}


def save(cfg: AlphaZeroConfigs, it: int, state: dict[str, Any]) -> None:
    """``state`` and the config as ``checkpoint-<it>`` (atomic); only the newest
    ``keep_checkpoints`` stay."""
    with atomic_dir(Path(cfg.run.output_dir) / f"checkpoint-{it}") as tmp:
        torch.save(state, tmp / "state.pt")
        (tmp / "config.json").write_text(json.dumps(cfg.as_dict(), indent=1))
    prune_checkpoints(cfg.run.output_dir, cfg.alphazero.keep_checkpoints)
