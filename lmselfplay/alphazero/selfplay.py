"""AlphaZero's batched searched games are :mod:`lmselfplay.alphazero.searched_games`."""

raise ImportError("lmselfplay.alphazero.selfplay is now lmselfplay.alphazero.searched_games (play_games, "
                  "play_searched, SelfPlaySettings, Samples, SearchedGame, alpha_for, value_targets)")
