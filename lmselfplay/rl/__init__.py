"""Reinforcement learning: the one policy-gradient trainer, advantages, rewards, the league of frozen snapshots."""
