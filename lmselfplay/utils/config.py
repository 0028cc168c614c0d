"""Recipe configs: a dataclass, filled from ``--config file.yaml`` then command-line flags.

``parse_config(MyConfig)`` follows TRL's ``TrlParser`` convention (YAML + CLI overrides,
CLI wins) but rejects unknown keys in the YAML *and* on the command line by name, which
TrlParser does not do for YAML. Booleans accept ``--flag``, ``--flag true/false``; lists
are given as YAML lists or space-separated on the command line.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from transformers import HfArgumentParser

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or flag that cannot be used; the message says which and why."""


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    return data


def check_keys(cls: type, data: dict[str, Any], where: str) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) in {where}: {', '.join(unknown)} "
                          f"(known keys of {cls.__name__}: {', '.join(sorted(known))})")


def parse_config(cls: type[T], argv: Sequence[str] | None = None) -> T:
    """Build ``cls`` from ``--config FILE`` (optional) and ``--key value`` overrides."""
    argv = list(sys.argv[1:] if argv is None else argv)
    data: dict[str, Any] = {}
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ConfigError("--config needs a file name")
        data = load_yaml(argv[i + 1])
        check_keys(cls, data, argv[i + 1])
        del argv[i : i + 2]
    parser = HfArgumentParser(cls)
    parser.set_defaults(**data)
    try:
        (cfg, rest) = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    except SystemExit as e:  # argparse already printed the reason
        raise ConfigError(f"bad command-line arguments: {' '.join(argv)}") from e
    if rest:
        raise ConfigError(f"unknown command-line argument(s): {' '.join(rest)} "
                          f"(see --help for the keys of {cls.__name__})")
    return cfg


def parse_weights(spec: str, defaults: dict[str, float], what: str,
                  ignore: Sequence[str] = ()) -> dict[str, float]:
    """``"a=2,b=0.5"`` over ``defaults`` (the names allowed, with their weights when not
    listed). Names in ``ignore`` are accepted and skipped. ValueError names ``what`` and the
    entry: an unknown name, a value that is not a number or is negative, all weights zero."""
    out = dict(defaults)
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, sep, value = (x.strip() for x in item.partition("="))
        if not sep or (name not in out and name not in ignore):
            raise ValueError(f"bad {what} entry {item!r}: expected NAME=NUMBER with NAME one of "
                             f"{sorted(out) + sorted(set(ignore) - set(out))}")
        try:
            w = float(value)
        except ValueError:
            raise ValueError(f"{what} entry {item!r} is not a number") from None
        if not w >= 0:
            raise ValueError(f"{what} entry {item!r} must be >= 0")
        if name in out:
            out[name] = w
    if sum(out.values()) <= 0:
        raise ValueError(f"{what} are all zero")
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
