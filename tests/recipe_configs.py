"""Each recipe script's config class, by recipe name (``recipes/NAME.py`` parses it in ``main``).

The classes live in the package; tests that need a recipe's config import them from here
rather than loading the script (only the runner, lmselfplay.utils.recipe_loader, loads recipes).
"""

from __future__ import annotations

from lmselfplay.alphazero.config import AlphaZeroConfig
from lmselfplay.debate.config import DebateConfig
from lmselfplay.rl.absolute_zero import AbsoluteZeroConfig
from lmselfplay.rl.r_zero import RZeroConfig
from lmselfplay.rl.search_selfplay import SearchSelfPlayConfig
from lmselfplay.rl.selfplay import SelfPlayConfig
from lmselfplay.spin.config import SpinConfig

RECIPE_CONFIGS: dict[str, type] = {
    "selfplay_games": SelfPlayConfig, "debate": DebateConfig, "r_zero": RZeroConfig,
    "absolute_zero": AbsoluteZeroConfig, "spin": SpinConfig, "search_selfplay": SearchSelfPlayConfig,
    "alphazero": AlphaZeroConfig,
}
