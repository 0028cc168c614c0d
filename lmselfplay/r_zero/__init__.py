"""R-Zero (``recipes/r_zero.py``): a challenger writes questions, a solver learns from its referee.
Its configs (:mod:`.config`), its steps (:mod:`.steps`), what it keeps on disk (:mod:`.checkpoints`)
and its measures (:mod:`.metrics`), over the library (trainer, advantages, overlap, engines, the
BLEU clusters of :mod:`lmselfplay.rl.repetition`, referees and checkable tasks)."""
