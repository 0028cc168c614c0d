"""Evaluation. This top-level folder ``eval/`` installs as ``lmselfplay.eval`` (pyproject
``package-dir``): ``eval`` alone would shadow a builtin's name and is too generic to install.

Exact game metrics of any LLM (:mod:`lmselfplay.eval.game_metrics`), benchmarks, ratings and
studies; the statistics they share with training live in :mod:`lmselfplay.utils.stats`.
"""
