"""The language model as a PUCT evaluator: ``evaluate(states) -> (prior_weights, values)``.

For a batch of search states (:class:`lmselfplay.alphazero.adapter.Pos`):

* **prior** — the LLM's distribution over the legal move answers. When every move answer
  is ``<move>`` + ONE token + ``</move>`` (the embedded tokenizer: digits and move names
  are single tokens), one forward of prompt + ``<move>`` gives it: the next-token
  probabilities of the legal move tokens (the search renormalizes over legal moves). Any
  other tokenizer falls back to the teacher-forced score of each legal answer
  (:func:`lmselfplay.lm.readout.answer_distribution`), one sequence per move.
* **value** — :class:`ValueHead` on the last hidden state at the end of the prompt (the
  token before ``<move>``), for the player to move, in [-1, 1]. In the fast path it comes
  from the same forward as the prior. With a :class:`QHead` instead (optional), the head
  gives a bounded Q(s, a) in [-1, 1] for every action and the value is
  ``V(s) = sum_a pi(a|s) Q(s, a)`` with pi the prior above (renormalized over legal moves).

States are right-padded (causal attention: padding after the last real token changes
nothing before it) and evaluated in chunks of ``batch_size``; identical states are
evaluated once and cached until :meth:`LLMEvaluator.clear` (call it whenever the weights
change: within one weights version every position's prior and value are fixed).

Either head is separate from the language model's weights (a few KB, saved beside the
model as ``value_head.pt`` or ``q_head.pt``; :func:`load_head` reads whichever is there), so
it works the same under LoRA, where only adapters change.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmselfplay.games.text import CLOSE, OPEN, format_answer
from lmselfplay.lm.batching import pad_batch
from lmselfplay.lm.prompt import encode_completion, encode_prompt
from lmselfplay.lm.readout import answer_distribution

VALUE_HEAD_FILE = "value_head.pt"
Q_HEAD_FILE = "q_head.pt"


class _Head(torch.nn.Module):
    """``tanh(W2 tanh(W1 h + b1) + b2)`` on a hidden state: ``outputs`` numbers in [-1, 1]."""

    FILE = ""

    def __init__(self, hidden_size: int, width: int, outputs: int):
        super().__init__()
        self.hidden_size, self.width = int(hidden_size), int(width)
        self.net = torch.nn.Sequential(torch.nn.Linear(self.hidden_size, self.width), torch.nn.Tanh(),
                                       torch.nn.Linear(self.width, int(outputs)), torch.nn.Tanh())

    def shape(self) -> dict[str, int]:
        return {"hidden_size": self.hidden_size, "width": self.width}

    def save(self, folder: str | Path) -> Path:
        """Write ``folder/FILE`` atomically (a temp file renamed: never half a head)."""
        path = Path(folder) / self.FILE
        tmp = path.with_name(path.name + ".tmp")
        torch.save({**self.shape(), "state_dict": self.state_dict()}, tmp)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, folder: str | Path) -> _Head:
        blob = torch.load(Path(folder) / cls.FILE, weights_only=True)
        head = cls(**{k: v for k, v in blob.items() if k != "state_dict"})
        head.load_state_dict(blob["state_dict"])
        return head


class ValueHead(_Head):
    """The value of a position for the player to move, in [-1, 1]."""

    FILE = VALUE_HEAD_FILE

    def __init__(self, hidden_size: int, width: int = 64):
        super().__init__(hidden_size, width, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden.float()).squeeze(-1)


class QHead(_Head):
    """Q(s, a) for every action a, for the player to move, in [-1, 1] (bounded: a game's
    results are in [-1, 1]); entries of illegal actions are meaningless and never read."""

    FILE = Q_HEAD_FILE

    def __init__(self, hidden_size: int, n_actions: int, width: int = 64):
        super().__init__(hidden_size, width, n_actions)
        self.n_actions = int(n_actions)

    def shape(self) -> dict[str, int]:
        return {**super().shape(), "n_actions": self.n_actions}

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden.float())


def q_value(q: torch.Tensor, prior: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """``V(s) = sum_a pi(a|s) Q(s, a)`` with pi = ``prior`` renormalized over the ``legal``
    mask (rows: positions; columns: actions)."""
    p = prior * legal
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
    return (p * q).sum(-1)


def load_head(folder: str | Path) -> ValueHead | QHead | None:
    """The head saved beside a model: its Q head, else its value head, else None."""
    for cls in (QHead, ValueHead):
        if (Path(folder) / cls.FILE).exists():
            return cls.load(folder)
    return None


def hidden_size(model: Any) -> int:
    return int(model.config.hidden_size)


def move_tokens(tokenizer: Any, game: Any) -> list[int] | None:
    """Per action, its one move token when every answer is ``<move>`` + 1 token + ``</move>``
    and the tokens differ; else None (then the evaluator scores whole answers)."""
    open_ids = encode_completion(tokenizer, OPEN, eos=False)
    close_ids = encode_completion(tokenizer, CLOSE, eos=False)
    out = []
    for a in range(game.n_actions):
        ids = encode_completion(tokenizer, format_answer(game.action_text(a)), eos=False)
        if len(ids) != len(open_ids) + 1 + len(close_ids) or ids[: len(open_ids)] != open_ids \
                or ids[len(open_ids) + 1 :] != close_ids:
            return None
        out.append(ids[len(open_ids)])
    return out if len(set(out)) == len(out) else None


class LLMEvaluator:
    """PUCT evaluator backed by a causal LM (+ value head or Q head); see the module docstring."""

    def __init__(self, model: Any, tokenizer: Any, game: Any, value_head: ValueHead | QHead | None = None,
                 batch_size: int = 256, temperature: float = 1.0, engine: Any = None):
        self.model, self.tokenizer, self.game = model, tokenizer, game
        self.value_head = value_head
        self.batch_size, self.temperature = int(batch_size), float(temperature)
        self.A = int(game.n_actions)
        self.tokens = move_tokens(tokenizer, game)
        self.prefix = encode_completion(tokenizer, OPEN, eos=False)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.engine = engine  # only the fallback needs one (teacher-forced scores)
        self.cache: dict[Any, tuple[np.ndarray, float, np.ndarray | None]] = {}  # prior, value, Q
        self.forwards = 0  # positions evaluated by the model (cache misses)
        self.forward_seconds = 0.0

    def clear(self) -> None:
        """Forget cached evaluations (the weights or the value head changed)."""
        self.cache.clear()

    def prompt_ids(self, state: Any) -> list[int]:
        return encode_prompt(self.tokenizer, self.game.observation_text(state, self.game.current_player(state)))

    def __call__(self, states: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        """(prior weights [L, n_actions], values [L]) for search states (``Pos``)."""
        import time

        todo = list(dict.fromkeys(s for s in states if s not in self.cache))
        if todo:
            t0 = time.perf_counter()
            for i in range(0, len(todo), self.batch_size):
                part = todo[i : i + self.batch_size]
                for s, p, v, q in zip(part, *self._evaluate([s.state for s in part])):
                    self.cache[s] = (p, v, q)
            self.forwards += len(todo)
            self.forward_seconds += time.perf_counter() - t0
        prior = np.stack([self.cache[s][0] for s in states]) if states else np.zeros((0, self.A))
        return prior, np.array([self.cache[s][1] for s in states], dtype=np.float64)

    @property
    def has_q(self) -> bool:
        return isinstance(self.value_head, QHead)

    def q_values(self, states: list[Any]) -> np.ndarray:
        """The Q head's Q(s, a) [L, n_actions] for search states (cached like the prior)."""
        if not self.has_q:
            raise ValueError("this evaluator has no Q head")
        self(states)
        return np.stack([self.cache[s][2] for s in states]) if states else np.zeros((0, self.A))

    @torch.no_grad()
    def _evaluate(self, states: list[Any]) -> tuple[list[np.ndarray], list[float], list[np.ndarray | None]]:
        logits, hidden = self.forward([self.prompt_ids(s) for s in states])
        if self.tokens is not None:
            probs = list(torch.softmax(logits / self.temperature, dim=-1)[:, self.tokens].double().cpu().numpy())
        else:
            probs = self._teacher_forced(states)
        if self.has_q:
            q = self.value_head(hidden).clamp(-1, 1).double().cpu()
            legal = torch.zeros(len(states), self.A, dtype=torch.float64)
            for row, s in enumerate(states):
                legal[row, self.game.legal_actions(s)] = 1.0
            values = q_value(q, torch.from_numpy(np.stack(probs)), legal).tolist()
            return probs, values, list(q.numpy())
        values = self.value_head(hidden).clamp(-1, 1).tolist() if self.value_head is not None \
            else [0.0] * len(states)
        return probs, values, [None] * len(states)

    def forward(self, prompts: list[list[int]], grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward of each prompt + ``<move>``: (logits at the move position [B, V],
        last hidden state at the end of the prompt [B, H])."""
        seqs = [p + self.prefix for p in prompts]
        device = next(self.model.parameters()).device
        ids, att = pad_batch(seqs, self.pad_id)
        was_training = self.model.training
        self.model.train(grad)
        try:
            with torch.set_grad_enabled(grad):
                out = self.model(input_ids=ids.to(device), attention_mask=att.to(device),
                                 output_hidden_states=True)
        finally:
            self.model.train(was_training)
        rows = torch.arange(len(seqs), device=device)
        last = torch.tensor([len(s) - 1 for s in seqs], device=device)
        end_of_prompt = torch.tensor([len(p) - 1 for p in prompts], device=device)
        return out.logits[rows, last].float(), out.hidden_states[-1][rows, end_of_prompt]

    def _teacher_forced(self, states: list[Any]) -> list[np.ndarray]:
        from lmselfplay.lm.engines.hf import HFEngine

        engine = self.engine or HFEngine(self.model, self.tokenizer)
        out = []
        for d in answer_distribution(engine, self.tokenizer, self.game, states, self.temperature):
            w = np.zeros(self.A)
            for a, p in d.items():
                w[a] = p
            out.append(w)
        return out
