"""Game-theory solvers: matrix-game dynamics, CFR / CFR+, PSRO, and their plots."""
