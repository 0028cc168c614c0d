"""The game-theory solvers are :mod:`lmselfplay.game_theory` ("solver" is R-Zero's role)."""

raise ImportError("lmselfplay.solvers is now lmselfplay.game_theory (CFR, PSRO, matrix games)")
