"""Shared plumbing: config parsing, atomic checkpoints, the metrics logger, the recipe loader."""
