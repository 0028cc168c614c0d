"""The language-model layer: THE prompt formatter, policy loading (+ LoRA), trajectories, batched rollouts, engines."""
