"""RL with verifiable rewards is its own package, :mod:`lmselfplay.rlvr` (config, steps, metrics)."""

raise ImportError("lmselfplay.rl.rlvr is now lmselfplay.rlvr (config: RLVRConfigs, steps, metrics)")
