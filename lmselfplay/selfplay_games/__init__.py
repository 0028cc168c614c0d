"""Self-play on text games (``recipes/selfplay_games.py``): its configs (:mod:`.config`), its
steps (:mod:`.steps`) and its evaluation (:mod:`.metrics`), over the library (trainer,
advantages, league, rollout and engines, games, evaluation)."""
