"""SPIN: the objective's maths (objective.py), the supervised data loading (data.py), and what
``recipes/spin.py``'s loop calls: its config (config.py), the pairs in tokens and on disk
(pairs.py), generation across processes (sampling.py), TRL's trainers (trainers.py), one
iteration (round.py) and the held-out measure (held_out.py)."""
