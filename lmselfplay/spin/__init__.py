"""SPIN: the objective's maths (objective.py) and the supervised data loading (data.py)."""
