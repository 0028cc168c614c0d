"""Recipe configs: dataclasses, filled from ``--config file.yaml`` then command-line flags.

A recipe parses a tuple of config classes the way TRL's scripts do
(``HfArgumentParser((ScriptArguments, GRPOConfig, ModelConfig))``): its own arguments plus
the config of each component it builds (trainer, policy, engine, run, ...). One flat YAML and
one flat set of flags fill them all, each key going to the class that declares it
(:func:`parse_configs`); a recipe keeps the parts in a :class:`Configs` container and hands
each component its own part. Unlike TrlParser, unknown keys are refused by name in the YAML
too. Booleans accept ``--flag``, ``--flag true/false``; lists are given as YAML lists or
space-separated on the command line. ``--help`` lists the flags grouped by class (each class's
``_argument_group_name``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, NoReturn, TypeVar

import yaml

from lmselfplay.utils.errors import UserError


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



def json_object(cfg: Any, name: str) -> dict[str, Any]:
    """Field ``name`` of ``cfg``, a JSON object given as text, as a mapping (empty text: ``{}``);
    a ConfigError naming the field when it is not JSON of an object."""
    text = getattr(cfg, name)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        raise ConfigError(f"{name} must be a JSON object, got {text!r}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a JSON object, got {text!r}")
    return value

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
    """The mapping in the YAML file ``path``. ConfigError (one line, naming the file) for a
    file that is missing, unreadable, not UTF-8 text, not valid YAML, nested too deeply to
    read, empty, or not a mapping: an empty file is refused rather than read as "every
    default", so a truncated or wrongly named config never runs silently on other values."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}" if not path.exists()
                          else f"config file {path} is not a file")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not a text file (byte {e.object[e.start]:#04x} at offset "
                          f"{e.start} is not UTF-8)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply to read "
                          "(a recipe config is one flat mapping of keys to values)") from None
    if data is None:
        raise ConfigError(f"config file {path} is empty: give it the keys to set, or leave out --config "
                          "to run on the recipe's defaults")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    return data


def note_repeated_flags(argv: Sequence[str]) -> list[str]:
    """The rule for a flag given twice with different values (``--x 1 ... --x 2``, or
    ``--x=2``): the last one wins, as in argparse and TRL's scripts (a script appends an
    override to a base command line), and it is never silent: one ``note:`` line per such
    flag on stderr, naming both values. Returns those lines."""
    seen: dict[str, tuple[str, ...]] = {}
    notes = []
    for i, arg in enumerate(argv):
        if not arg.startswith("--") or len(arg) == 2:
            continue
        name, eq, inline = arg[2:].partition("=")
        if eq:
            value: tuple[str, ...] = (inline,)
        else:
            end = next((j for j in range(i + 1, len(argv)) if argv[j].startswith("--")), len(argv))
            value = tuple(argv[i + 1:end])
        if name in seen and seen[name] != value:
            notes.append(f"note: --{name} is given twice ({' '.join(seen[name]) or '(no value)'}, then "
                         f"{' '.join(value) or '(no value)'}): the last one is used")
        seen[name] = value
    for line in notes:
        print(line, file=sys.stderr)
    return notes


def as_classes(classes: type | Sequence[type]) -> tuple[type, ...]:
    """One class or a tuple of them, as a tuple."""
    return (classes,) if isinstance(classes, type) else tuple(classes)


def field_owners(classes: type | Sequence[type]) -> dict[str, type]:
    """{field name: the class of ``classes`` that declares it}; a name declared by two of them
    is a TypeError (one flag, one owner)."""
    owners: dict[str, type] = {}
    for cls in as_classes(classes):
        for f in dataclasses.fields(cls):
            if f.name in owners:
                raise TypeError(f"field {f.name!r} is declared by both {owners[f.name].__name__} and {cls.__name__}: "
                                "in one parsed tuple a flag has one owner")
            owners[f.name] = cls
    return owners


def check_renamed(classes: type | Sequence[type], keys: Sequence[str], where: str) -> None:
    """ConfigError naming the new name of a key a class lists in ``renamed_keys``
    ({old: new}), or saying why the recipe does not use a key a class lists in ``unused_keys``
    ({key: why}, a flag a shipped config or doc once gave it): an old config says what to
    change instead of just failing."""
    renamed = {k: v for cls in as_classes(classes) for k, v in getattr(cls, "renamed_keys", {}).items()}
    unused = {k: v for cls in as_classes(classes) for k, v in getattr(cls, "unused_keys", {}).items()}
    old = [f"{k} is now called {renamed[k]}" for k in keys if k in renamed]
    old += [f"{k} is not used by this recipe: {unused[k]}" for k in keys if k in unused]
    if old:
        raise ConfigError(f"{where}: {'; '.join(old)}")


def check_keys(classes: type | Sequence[type], data: dict[str, Any], where: str) -> None:
    """ConfigError for a renamed key (:func:`check_renamed`) or a key no class declares."""
    check_renamed(classes, list(data), where)
    known = set(field_owners(classes))
    unknown = sorted(set(data) - known)
    if unknown:
        names = ", ".join(cls.__name__ for cls in as_classes(classes))
        raise ConfigError(f"unknown key(s) in {where}: {', '.join(unknown)} "
                          f"(known keys of {names}: {', '.join(sorted(known))})")


def check_value(cls: type, key: str, value: Any, where: str) -> Any:
    """A YAML value of the field's type (an int is a valid float; a number is a valid str,
    as on the command line; a mapping only for the fields the class lists in its
    ``yaml_mappings`` attribute, e.g. a per-game weight; a typed value, one whose class has
    ``from_config``, by that parser), else ConfigError naming the key, the value and the type."""
    expected = typing.get_type_hints(cls).get(key)
    if is_typed_value(expected):
        try:
            return expected.from_config(value)
        except ConfigError as e:
            raise ConfigError(f"{e} (in {where})") from None
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


def is_typed_value(kind: Any) -> bool:
    """Whether a field's type is a typed value: a class that parses a config value itself
    (``from_config(value)``, a ConfigError naming the bad part) and gives it back
    (``as_config()``, what ``config.json`` holds), e.g. the trainer's KL coefficient."""
    return isinstance(kind, type) and hasattr(kind, "from_config") and hasattr(kind, "as_config")


def _flag_parser(kind: type) -> Callable[[str], Any]:
    """argparse's ``type`` for a typed value's flag: its parser, whose ConfigError argparse then
    reports as it is (a ValueError would become "invalid value")."""
    def parse(text: str) -> Any:
        try:
            return kind.from_config(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = kind.__name__
    return parse


def config_dict(cfg: Any) -> dict[str, Any]:
    """A config dataclass's fields as plain data (``dataclasses.asdict``), each typed value
    (:func:`is_typed_value`) as its ``as_config()``: JSON as ``config.json`` holds it."""
    typed = {f.name: v.as_config() for f in dataclasses.fields(cfg)
             if is_typed_value(type(v := getattr(cfg, f.name)))}
    return {**dataclasses.asdict(cfg), **typed}


def parse_configs(classes: Sequence[type], argv: Sequence[str] | None = None,
                  defaults: dict[str, Any] | None = None, first: type | None = None) -> tuple[Any, ...]:
    """One instance of each class of ``classes``, in order, from ``--config FILE`` (optional,
    one flat mapping) and ``--key value`` flags, each key going to the class that declares it.
    ``--help`` lists the flags grouped by class, ``first``'s group (the recipe's own) first.

    Rules: a field name declared by two of the classes is a TypeError; ``defaults`` (a
    recipe's own defaults for its components' fields) lie under the YAML, which lies under the
    flags, and of a flag given twice the last value (said on stderr: :func:`note_repeated_flags`);
    an unknown or renamed key (YAML or flag) and a value of the wrong type are one-line
    ConfigErrors naming the key; each instance validates itself when it is built."""
    from transformers import (
        HfArgumentParser,  # here: the Config base must stay cheap to import (sandbox)
    )

    classes = as_classes(classes)
    owners = field_owners(classes)
    strangers = sorted(set(defaults or {}) - set(owners))
    if strangers:
        raise TypeError(f"defaults name fields no class declares: {', '.join(strangers)}")
    argv = list(sys.argv[1:] if argv is None else argv)
    note_repeated_flags(argv)
    data: dict[str, Any] = dict(defaults or {})
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise ConfigError("--config needs a file name")
        where = argv[i + 1]
        loaded = load_yaml(where)
        check_keys(classes, loaded, where)
        data.update({k: check_value(owners[k], k, v, where) for k, v in loaded.items()})
        del argv[i : i + 2]
    shown = [first, *(c for c in classes if c is not first)] if first in classes else list(classes)
    parser = HfArgumentParser(shown)
    parser.set_defaults(**data)
    parser.error = _raise_config_error(classes, parser.prog)  # argparse would print and exit
    for action in parser._actions:
        if is_typed_value(action.type):
            action.type = _flag_parser(action.type)
    *parsed, rest = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    cfgs = [parsed[shown.index(c)] for c in classes]
    if rest:
        check_renamed(classes, [a[2:].split("=")[0] for a in rest if a.startswith("--")], "command line")
        raise ConfigError(f"unknown command-line argument(s): {' '.join(rest)} (see --help for the keys)")
    return tuple(cfgs)


@dataclasses.dataclass(frozen=True)
class Configs:
    """A recipe's parsed configs: one field per part, typed by its config class (the recipe's
    own arguments first, then each component's config), e.g.
    ``SelfPlayConfigs(selfplay: SelfPlayArgs, trainer: TrainerConfig, ...)``.

    Rules: :meth:`parse` fills every part from one flat YAML and one flat set of flags
    (:func:`parse_configs`); a component is built from its own part only
    (``PolicyTrainer(model, tok, args.trainer)``); ``defaults`` holds the recipe's own defaults
    for its components' fields (``{"output_dir": "runs/selfplay_games"}``); a check that needs
    two parts is the container's ``validate``, run when it is built; :meth:`as_dict` is the
    flat dict of every field (a run's ``config.json``)."""

    defaults: ClassVar[dict[str, Any]] = {}

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Checks that span parts (none here)."""

    @classmethod
    def classes(cls) -> tuple[type, ...]:
        """The config class of each part, in field order."""
        hints = typing.get_type_hints(cls)
        return tuple(hints[f.name] for f in dataclasses.fields(cls))

    @classmethod
    def own_arguments(cls) -> type | None:
        """The recipe's own arguments: the first part this container declares itself (the parts
        a base container brings, trainer, policy, ..., come before it in the field order)."""
        own = [n for n in vars(cls).get("__annotations__", {}) if not n.startswith("_") and n != "defaults"]
        return typing.get_type_hints(cls)[own[0]] if own else None

    @classmethod
    def parse(cls: type[C], argv: Sequence[str] | None = None) -> C:
        """The recipe's configs from ``--config FILE`` and the flags (``sys.argv`` by default);
        ``--help`` shows the recipe's own arguments first."""
        return cls(*parse_configs(cls.classes(), argv, cls.defaults, first=cls.own_arguments()))

    @classmethod
    def from_values(cls: type[C], **values: Any) -> C:
        """The recipe's configs from flat ``field=value`` pairs, each going to its part (the
        rest: the recipe's defaults, then the classes')."""
        owners = field_owners(cls.classes())
        unknown = sorted(set(values) - set(owners))
        if unknown:
            raise ConfigError(f"unknown key(s): {', '.join(unknown)} (not a field of {cls.__name__}'s parts)")
        values = {**cls.defaults, **values}
        return cls(*(klass(**{k: v for k, v in values.items() if owners[k] is klass}) for klass in cls.classes()))

    @classmethod
    def build(cls, **values: Any) -> NoReturn:
        raise AttributeError(f"{cls.__name__}.build is {cls.__name__}.from_values(**values)")

    @classmethod
    def fixed_on_resume(cls) -> frozenset[str]:
        """The fields a resume may not change: those of the parts' fields that some part names in
        its ``resume_fixed`` (the rule: :class:`~lmselfplay.utils.run.RunConfig`'s doc)."""
        named = frozenset().union(*(getattr(klass, "resume_fixed", ()) for klass in cls.classes()))
        return named & set(field_owners(cls.classes()))

    def as_dict(self) -> dict[str, Any]:
        """Every part's fields in one flat dict (names are unique across the parts), as plain data
        (:func:`config_dict`)."""
        return {k: v for f in dataclasses.fields(self) for k, v in config_dict(getattr(self, f.name)).items()}


C = TypeVar("C", bound=Configs)


def _raise_config_error(classes: Sequence[type], prog: str):
    """argparse's error hook: name the field, the value and the type it expects."""
    types = {f.name: getattr(f.type, "__name__", str(f.type)) for cls in classes for f in dataclasses.fields(cls)}

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
