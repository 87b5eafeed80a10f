"""Build frozen config dataclasses from TOML tables, naming the key of any bad value.

The one loader of every configuration in Tailgate: `tailgate.toml` (`deploy.config`), the
simulator's scenarios (`loadtests.sim.scenario`, `loadtests.sim.pool`) and the dataclasses
they embed (the gateway's, the task server's, `admission.AdmissionConfig`). A field's type
decides what a value must be: bool, int, float, str, an Enum (by value), a tuple, a dict,
or another dataclass (a sub-table); a dataclass's own ``__post_init__`` checks the rest and
raises ``ValueError("field: problem")``, which becomes a `ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any

__all__ = ["ConfigError", "build", "describe"]


class ConfigError(Exception):
    """A configuration value is wrong; names the key and the value."""

    def __init__(self, key: str, message: str, source: str = "") -> None:
        self.key = key
        self.message = message
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {message}" if key else f"{where}{message}")


def describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(typing.get_args(tp)):
            return None
        errors = []
        for a in args:
            try:
                return _convert(a, value, key)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"expected a table, got {describe(value)}")
        return {
            _convert(key_tp, k, key): _convert(value_tp, v, f"{key}.{k}") for k, v in value.items()
        }
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(key, f"expected an array, got {describe(value)}")
        return tuple(_convert(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"expected a table, got {describe(value)}")
        return build(tp, value, key)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            valid = ", ".join(repr(m.value) for m in tp)
            raise ConfigError(key, f"expected one of {valid}, got {describe(value)}") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(key, f"expected a number, got {describe(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {describe(value)}")
        return value
    raise ConfigError(key, f"unsupported type {tp!r}")  # an invariant of our own config classes


def build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a TOML table, naming the key of any bad value."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if key not in names:
            raise ConfigError(path, f"unknown key (known: {', '.join(sorted(names))})")
        kwargs[key] = _convert(hints[key], value, path)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.init
            and f.name not in kwargs
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            key = f"{prefix}.{missing[0]}" if prefix else missing[0]
            raise ConfigError(key, "required") from exc
        raise ConfigError(prefix, str(exc)) from exc
    except ValueError as exc:
        field_name, sep, message = str(exc).partition(": ")
        if sep and field_name and " " not in field_name:
            key = f"{prefix}.{field_name}" if prefix else field_name
            raise ConfigError(key, message) from exc
        raise ConfigError(prefix, str(exc)) from exc
