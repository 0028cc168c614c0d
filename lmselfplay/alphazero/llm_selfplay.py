"""Search self-play's games and targets are :mod:`lmselfplay.search_selfplay.search_targets`."""

raise ImportError("lmselfplay.alphazero.llm_selfplay is now lmselfplay.search_selfplay.search_targets (collect, "
                  "plan_games, Record, distill_samples, blended_q_target, q_loss; search_agent and play_match: "
                  "lmselfplay.search_selfplay.metrics)")
