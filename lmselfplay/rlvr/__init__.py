"""RL with verifiable rewards on a fixed task set (``recipes/rlvr.py``), the positive control of
every language recipe: its configs (:mod:`.config`), its steps (:mod:`.steps`) and its held-out
evaluation (:mod:`.metrics`), over the library (trainer, advantages, engines, task sets and their
referee)."""
