"""Recipe configs: a dataclass, filled from ``--config file.yaml`` then command-line flags.

``parse_config(MyConfig)`` follows TRL's ``TrlParser`` convention (YAML + CLI overrides,
CLI wins) but rejects unknown keys in the YAML *and* on the command line by name, which
TrlParser does not do for YAML. Booleans accept ``--flag``, ``--flag true/false``; lists
are given as YAML lists or space-separated on the command line.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from lmselfplay.utils.errors import UserError

T = TypeVar("T")


class ConfigError(UserError, ValueError):
    """A config file or flag that cannot be used; the message says which and why."""


class Config:
    """Base of every config dataclass: building one runs each class's own ``validate(self)``
    exactly once, base classes first (the MRO reversed), so a recipe config composed of
    several parents can neither skip nor repeat a parent's checks.

    Rules: a config class checks (and normalises) only its own fields in ``validate``, never
    calls ``super().validate()``, and defines no ``__post_init__`` (a TypeError when the class
    is created: an own ``__post_init__`` would replace this one and skip the parents)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for klass in cls.__mro__:
            if klass is not Config and "__post_init__" in vars(klass):
                raise TypeError(f"{klass.__name__} defines __post_init__; a Config checks its fields in "
                                "validate(self), which Config.__post_init__ runs for every class")

    def __post_init__(self) -> None:
        for klass in reversed(type(self).__mro__):
            validate = vars(klass).get("validate")
            if validate is not None:
                validate(self)


def positive(cfg: Any, *names: str) -> None:
    """ConfigError naming the first field of ``names`` that is not a finite number > 0."""
    _check_numbers(cfg, names, lambda v: v > 0, "> 0")


def non_negative(cfg: Any, *names: str) -> None:
    """ConfigError naming the first field of ``names`` that is not a finite number >= 0
    (NaN and inf fail too: a learning rate of NaN trains nothing, silently)."""
    _check_numbers(cfg, names, lambda v: v >= 0, ">= 0")


def _check_numbers(cfg: Any, names: Sequence[str], ok: Any, rule: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and ok(value)):
            raise ConfigError(f"{name} must be a finite number {rule}, got {value!r}")


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


def check_renamed(cls: type, keys: Sequence[str], where: str) -> None:
    """ConfigError naming the new name of a key the class lists in ``renamed_keys``
    ({old: new}): an old config says what to change instead of just failing."""
    renamed = getattr(cls, "renamed_keys", {})
    old = [k for k in keys if k in renamed]
    if old:
        raise ConfigError(f"{where}: {', '.join(f'{k} is now called {renamed[k]}' for k in old)}")


def check_keys(cls: type, data: dict[str, Any], where: str) -> None:
    check_renamed(cls, list(data), where)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) in {where}: {', '.join(unknown)} "
                          f"(known keys of {cls.__name__}: {', '.join(sorted(known))})")


def check_value(cls: type, key: str, value: Any, where: str) -> Any:
    """A YAML value of the field's type (an int is a valid float; a number is a valid str,
    as on the command line; a mapping only for the fields the class lists in its
    ``yaml_mappings`` attribute, e.g. a per-game weight),
    else ConfigError naming the key, the value and the type."""
    expected = typing.get_type_hints(cls).get(key)
    optional = typing.get_origin(expected) in (typing.Union, types.UnionType) and type(None) in typing.get_args(expected)
    if optional:
        if value is None:
            return value
        expected = next(a for a in typing.get_args(expected) if a is not type(None))
    if expected is str:
        if isinstance(value, dict) and key in getattr(cls, "yaml_mappings", ()):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
          bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, str)}.get(expected)
    if ok is not None and not ok(value):
        raise ConfigError(f"{key}: {value!r} is not a valid {expected.__name__} (in {where})")
    if typing.get_origin(expected) is list and not isinstance(value, list):
        raise ConfigError(f"{key}: {value!r} is not a list (in {where})")
    return float(value) if expected is float else value


def parse_config(cls: type[T], argv: Sequence[str] | None = None) -> T:
    """Build ``cls`` from ``--config FILE`` (optional) and ``--key value`` overrides."""
    from transformers import (
        HfArgumentParser,  # here: the Config base must stay cheap to import (sandbox)
    )

    argv = list(sys.argv[1:] if argv is None else argv)
    data: dict[str, Any] = {}
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ConfigError("--config needs a file name")
        data = load_yaml(argv[i + 1])
        check_keys(cls, data, argv[i + 1])
        data = {k: check_value(cls, k, v, argv[i + 1]) for k, v in data.items()}
        del argv[i : i + 2]
    parser = HfArgumentParser(cls)
    parser.set_defaults(**data)
    parser.error = _raise_config_error(cls, parser.prog)  # argparse would print and exit
    (cfg, rest) = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if rest:
        check_renamed(cls, [a[2:].split("=")[0] for a in rest if a.startswith("--")], "command line")
        raise ConfigError(f"unknown command-line argument(s): {' '.join(rest)} "
                          f"(see --help for the keys of {cls.__name__})")
    return cfg


def _raise_config_error(cls: type, prog: str):
    """argparse's error hook: name the field, the value and the type it expects."""
    types = {f.name: getattr(f.type, "__name__", str(f.type)) for f in dataclasses.fields(cls)}

    def error(message: str) -> None:
        m = re.match(r"argument --(\w+)(?:/[^:]*)?: invalid (\w+) value: '(.*)'", message)
        if m:
            field_, kind, value = m.groups()
            raise ConfigError(f"--{field_} {value!r} is not a valid {kind}; {field_} expects "
                              f"{types.get(field_, kind)} (command line)")
        m = re.match(r"argument --(\w+)(?:/[^:]*)?: (.*)", message)
        if m:
            raise ConfigError(f"--{m.group(1)}: {m.group(2)} (command line)")
        raise ConfigError(f"{message} (command line; {prog} --help lists the keys)")

    return error


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
