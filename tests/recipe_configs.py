"""Each recipe script's configs, by recipe name (``recipes/NAME.py`` parses them in ``main``):
a :class:`~lmselfplay.utils.config.Configs` container holding the recipe's own arguments and
each component's config.

The classes live in the package; tests that need a recipe's configs import them from here
rather than loading the script (only the runner, lmselfplay.utils.recipe_loader, loads recipes).
"""

from __future__ import annotations

from lmselfplay.absolute_zero.config import AbsoluteZeroConfigs
from lmselfplay.alphazero.config import AlphaZeroConfigs
from lmselfplay.debate.config import DebateConfigs
from lmselfplay.r_zero.config import RZeroConfigs
from lmselfplay.rlvr.config import RLVRConfigs
from lmselfplay.search_selfplay.config import SearchSelfPlayConfigs
from lmselfplay.selfplay_games.config import SelfPlayConfigs
from lmselfplay.spin.config import SpinConfigs
from lmselfplay.utils.config import ConfigError, Configs, check_keys, load_yaml

RECIPE_CONFIGS: dict[str, type[Configs]] = {
    "selfplay_games": SelfPlayConfigs, "debate": DebateConfigs, "r_zero": RZeroConfigs,
    "absolute_zero": AbsoluteZeroConfigs, "spin": SpinConfigs, "search_selfplay": SearchSelfPlayConfigs,
    "alphazero": AlphaZeroConfigs, "rlvr": RLVRConfigs,
}


def parse_recipe(name: str, argv: list[str]) -> Configs:
    """The recipe's configs from ``argv``, as its ``main`` parses them."""
    return RECIPE_CONFIGS[name].parse(argv)


def fits(name: str, path) -> bool:
    """Whether a YAML's keys are all the recipe's fields."""
    try:
        check_keys(RECIPE_CONFIGS[name].classes(), load_yaml(path), str(path))
    except ConfigError:
        return False
    return True
