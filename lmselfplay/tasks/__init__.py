"""Offline task generators that referees, learning algorithms and the embedded model's corpus
all draw on: arithmetic word problems (arithmetic.py) and tiny Python programs (programs.py).
Deterministic from a ``random.Random`` seed."""
