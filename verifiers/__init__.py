"""Referees. This top-level folder ``verifiers/`` installs as ``lmselfplay.verifiers``
(pyproject ``package-dir``): a top-level ``verifiers`` would collide with a popular PyPI library.

The executor sandbox for model-written code (:mod:`lmselfplay.verifiers.executor`).
"""
