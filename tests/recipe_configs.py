"""Each recipe script's configs, by recipe name (``recipes/NAME.py`` parses them in ``main``).

A converted recipe parses a :class:`~lmselfplay.utils.config.Configs` container (its own
arguments and each component's config); the others still parse one flat config class. The
classes live in the package; tests that need a recipe's config import them from here rather
than loading the script (only the runner, lmselfplay.utils.recipe_loader, loads recipes).
"""

from __future__ import annotations

from typing import Any

from lmselfplay.alphazero.config import AlphaZeroConfigs
from lmselfplay.debate.config import DebateConfig
from lmselfplay.rl.absolute_zero import AbsoluteZeroConfig
from lmselfplay.rl.r_zero import RZeroConfig
from lmselfplay.rl.search_selfplay import SearchSelfPlayConfigs
from lmselfplay.rl.selfplay import SelfPlayConfigs
from lmselfplay.spin.config import SpinConfigs
from lmselfplay.utils.config import Configs, check_keys, load_yaml, parse_config

RECIPE_CONFIGS: dict[str, type] = {
    "selfplay_games": SelfPlayConfigs, "debate": DebateConfig, "r_zero": RZeroConfig,
    "absolute_zero": AbsoluteZeroConfig, "spin": SpinConfigs, "search_selfplay": SearchSelfPlayConfigs,
    "alphazero": AlphaZeroConfigs,
}


def is_split(name: str) -> bool:
    """Whether the recipe parses a tuple of configs (a Configs container)."""
    return issubclass(RECIPE_CONFIGS[name], Configs)


def recipe_classes(name: str) -> tuple[type, ...]:
    """The config classes the recipe's parser fills (one for a flat config)."""
    cls = RECIPE_CONFIGS[name]
    return cls.classes() if is_split(name) else (cls,)


def parse_recipe(name: str, argv: list[str]) -> Any:
    """The recipe's configs from ``argv``, as its ``main`` parses them."""
    cls = RECIPE_CONFIGS[name]
    return cls.parse(argv) if is_split(name) else parse_config(cls, argv)


def flat(cfg: Any) -> dict[str, Any]:
    """Every field of a parsed recipe config, by name."""
    import dataclasses

    return cfg.as_dict() if isinstance(cfg, Configs) else dataclasses.asdict(cfg)


def fits(name: str, path) -> bool:
    """Whether a YAML's keys are all the recipe's fields."""
    try:
        check_keys(recipe_classes(name), load_yaml(path), str(path))
    except Exception:
        return False
    return True
