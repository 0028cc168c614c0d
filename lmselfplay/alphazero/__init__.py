"""The exact-reward reference: PUCT search, batched self-play, a policy/value net, the loop.

* :mod:`.mcts` — the search exactly as specified (``mcts``, ``search_policy``, ``NimPosition``,
  ``MisereNimPosition``, ``uniform_prior``, ``zero_value``);
* :mod:`.adapter` — the search face for every project game (``SearchGame``, ``CachedGame``);
* :mod:`.batched_mcts` — many trees at once, one network batch per simulation wave;
* :mod:`.network` — policy + value network and the AlphaZero loss;
* :mod:`.searched_games` — batched searched self-play with resets and a bank of frozen opponents;
* :mod:`.net_strength` — strength per search budget, exact opponents, win-rate matrix;
* :mod:`.config` — the recipe's config and the self-play settings it gives;
* :mod:`.iteration` — one iteration's steps after self-play: train, gate, evaluate;
* :mod:`.progress` — what a run carries between iterations, its checkpoints and resume;
* :mod:`.plots` — the run's curves and win-rate matrix.

The loop itself is ``recipes/alphazero.py``.
"""

from lmselfplay.alphazero.adapter import CachedGame, SearchGame
from lmselfplay.alphazero.batched_mcts import BatchedMCTS, batched_mcts
from lmselfplay.alphazero.mcts import (
           MisereNimPosition,
           NimPosition,
           mcts,
           search_policy,
           uniform_prior,
           zero_value,
)

__all__ = ["BatchedMCTS", "CachedGame", "MisereNimPosition", "NimPosition", "SearchGame", "batched_mcts", "mcts",
           "search_policy", "uniform_prior", "zero_value"]
