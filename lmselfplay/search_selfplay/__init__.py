"""Search self-play (``recipes/search_selfplay.py``): AlphaZero's ratchet with the language model as
the network. Its configs (:mod:`.config`), its steps (:mod:`.steps`), its searched games and the
targets they make (:mod:`.search_targets`) and its evaluation (:mod:`.metrics`), over the library
(trainer, league, the PUCT search, games, evaluation)."""
