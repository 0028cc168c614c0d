"""The language-model layer: the loaded model at work: THE prompt formatter, trajectories, batched rollouts, engines, readout (loading is models/)."""
