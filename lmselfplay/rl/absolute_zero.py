"""Absolute Zero is its own package, :mod:`lmselfplay.absolute_zero` (config, steps, metrics)."""

raise ImportError("lmselfplay.rl.absolute_zero is now lmselfplay.absolute_zero "
                  "(config: AbsoluteZeroConfigs, steps, metrics)")
