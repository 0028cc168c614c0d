"""Absolute Zero (``recipes/absolute_zero.py``): one policy proposes and solves code tasks, the
sandboxed executor is the referee. Its configs (:mod:`.config`), its steps (:mod:`.steps`) and its
held-out evaluation (:mod:`.metrics`), over the library (trainer, advantages, overlap, engines,
code tasks and their referee).
"""
