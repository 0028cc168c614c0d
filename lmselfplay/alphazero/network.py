"""Policy + value network over ``game.encode(state)`` and the AlphaZero loss.

A small residual MLP: the encoding is flattened, so any game with an ``encode`` works
(Nim's one-hot pile, tic-tac-toe's 3x3x3 planes, Go's planes later). Illegal moves are
masked to -inf before the softmax, so the policy never puts mass on them.

Loss (AlphaGo Zero / AlphaZero): ``(z - v)^2 - pi^T log p + c_reg * ||theta||^2``, averaged
over the batch for the first two terms; ``c_reg = 1e-4``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn


class PolicyValueNet(nn.Module):
    def __init__(self, input_size: int, n_actions: int, hidden: int = 128, blocks: int = 2):
        super().__init__()
        self.input_size, self.n_actions = int(input_size), int(n_actions)
        self.hidden, self.blocks = int(hidden), int(blocks)
        self.stem = nn.Sequential(nn.Linear(self.input_size, hidden), nn.ReLU())
        self.res = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
            for _ in range(self.blocks))
        self.policy = nn.Linear(hidden, self.n_actions)
        self.value = nn.Sequential(nn.Linear(hidden, hidden // 2), nn.ReLU(),
                                   nn.Linear(hidden // 2, 1), nn.Tanh())

    def spec(self) -> dict[str, int]:
        """Constructor arguments, stored in checkpoints."""
        return {"input_size": self.input_size, "n_actions": self.n_actions,
                "hidden": self.hidden, "blocks": self.blocks}

    def forward(self, x: torch.Tensor, legal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (log-probabilities with illegal moves at -inf, value in [-1, 1])."""
        h = self.stem(x.flatten(1))
        for block in self.res:
            h = torch.relu(h + block(h))
        logits = self.policy(h).masked_fill(~legal, float("-inf"))
        return torch.log_softmax(logits, dim=-1), self.value(h).squeeze(-1)


class ConvPolicyValueNet(nn.Module):
    """A small AlphaGo Zero tower for board planes ``[planes, N, N]`` (e.g. Go's encode):
    3x3 conv stem, ``blocks`` residual blocks (conv-BN-ReLU-conv-BN + skip, ReLU), a policy
    head (1x1 conv to 2 planes, linear to ``n_actions``: points and pass) and a value head
    (1x1 conv to 1 plane, linear, ReLU, linear, tanh). Same interface as PolicyValueNet."""

    def __init__(self, input_shape: tuple[int, int, int], n_actions: int, channels: int = 32,
                 blocks: int = 3):
        super().__init__()
        self.input_shape = tuple(int(d) for d in input_shape)
        self.n_actions, self.channels, self.blocks = int(n_actions), int(channels), int(blocks)
        c_in, h, w = self.input_shape

        def conv_bn(c_from: int, c_to: int, k: int) -> list[nn.Module]:
            return [nn.Conv2d(c_from, c_to, k, padding=k // 2, bias=False), nn.BatchNorm2d(c_to)]

        self.stem = nn.Sequential(*conv_bn(c_in, channels, 3), nn.ReLU())
        self.res = nn.ModuleList(
            nn.Sequential(*conv_bn(channels, channels, 3), nn.ReLU(), *conv_bn(channels, channels, 3))
            for _ in range(self.blocks))
        self.policy_conv = nn.Sequential(*conv_bn(channels, 2, 1), nn.ReLU())
        self.policy = nn.Linear(2 * h * w, self.n_actions)
        self.value_conv = nn.Sequential(*conv_bn(channels, 1, 1), nn.ReLU())
        self.value = nn.Sequential(nn.Linear(h * w, channels), nn.ReLU(), nn.Linear(channels, 1),
                                   nn.Tanh())

    def spec(self) -> dict[str, Any]:
        """Constructor arguments, stored in checkpoints."""
        return {"input_shape": list(self.input_shape), "n_actions": self.n_actions,
                "channels": self.channels, "blocks": self.blocks}

    def forward(self, x: torch.Tensor, legal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (log-probabilities with illegal moves at -inf, value in [-1, 1])."""
        h = self.stem(x.reshape(-1, *self.input_shape))
        for block in self.res:
            h = torch.relu(h + block(h))
        logits = self.policy(self.policy_conv(h).flatten(1)).masked_fill(~legal, float("-inf"))
        return torch.log_softmax(logits, dim=-1), self.value(self.value_conv(h).flatten(1)).squeeze(-1)


def alphazero_loss(net: PolicyValueNet, x: torch.Tensor, legal: torch.Tensor, pi: torch.Tensor,
                   z: torch.Tensor, c_reg: float = 1e-4,
                   weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """(z - v)^2 - pi^T log p + c_reg ||theta||^2; ``weight`` (0/1) drops rows from the mean
    (used to train only on the learner's moves in games against frozen checkpoints)."""
    logp, v = net(x, legal)
    # pi is exactly 0 on illegal moves, where logp is -inf: take 0 * -inf as 0.
    ce = -(pi * logp.masked_fill(~legal, 0.0)).sum(-1)
    mse = (z - v) ** 2
    w = torch.ones_like(z) if weight is None else weight
    denom = w.sum().clamp_min(1.0)
    value_loss = (w * mse).sum() / denom
    policy_loss = (w * ce).sum() / denom
    l2 = sum((p ** 2).sum() for p in net.parameters())
    loss = value_loss + policy_loss + c_reg * l2
    return loss, {"loss": loss.item(), "value_loss": value_loss.item(),
                  "policy_loss": policy_loss.item(), "l2": l2.item()}


class NetEvaluator:
    """``evaluate(states) -> (priors, values)`` for the searches, one forward per call."""

    def __init__(self, net: PolicyValueNet, face: Any):
        self.net, self.face = net, face
        self.calls = 0

    def __call__(self, states: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        x = np.stack([self.face.encode(s) for s in states])
        return self.forward(x, np.stack([self.face.legal(s) for s in states]))

    def evaluate_ids(self, table: Any, sids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Batched-search fast path: encodings cached in the search's state table."""
        return self.forward(table.encoded(sids), table.legal[sids])

    @torch.no_grad()
    def forward(self, x: np.ndarray, legal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        logp, v = self.net(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
                           torch.from_numpy(np.ascontiguousarray(legal, dtype=bool)))
        return logp.exp().double().numpy(), v.double().numpy()


@torch.no_grad()
def raw_policy(net: PolicyValueNet, face: Any, states: list[Any]) -> np.ndarray:
    """Network move probabilities (no search) for search states, [len(states), n_actions]."""
    return NetEvaluator(net, face)(states)[0]
