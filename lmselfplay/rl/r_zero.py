"""R-Zero is its own package, :mod:`lmselfplay.r_zero` (config, steps, checkpoints, metrics)."""

raise ImportError("lmselfplay.rl.r_zero is now lmselfplay.r_zero (config: RZeroConfigs, steps, checkpoints, "
                  "metrics; the loop is recipes/r_zero.py's train)")
