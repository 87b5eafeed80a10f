"""Loading ``tailgate.toml`` into typed config objects.

Layout of the file (every key optional; see README for each field)::

    [gateway]            -> gateway.config.GatewayConfig (host, port, grace_ms, ...)
    [[classes]]          -> GatewayConfig.classes
    [[pools]]            -> GatewayConfig.pools, with [pools.prior] and [[pools.servers]]
    [taskserver]         -> taskserver.config.TaskServerConfig, with [taskserver.service]

The environment is read here and nowhere else: ``TAILGATE_CONFIG`` names the
file when no path is given.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig
from taskserver.config import TaskServerConfig

ENV_CONFIG = "TAILGATE_CONFIG"


class ConfigError(Exception):
    """A configuration value is wrong; names the key and the value."""

    def __init__(self, key: str, message: str, source: str = "") -> None:
        self.key = key
        self.message = message
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}: {message}" if key else f"{where}{message}")


@dataclass(frozen=True, slots=True)
class TailgateConfig:
    """The whole file."""

    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    taskserver: TaskServerConfig = field(default_factory=TaskServerConfig)
    source: str = ""


def _describe(value: Any) -> str:
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
            raise ConfigError(key, f"expected a table, got {_describe(value)}")
        return {
            _convert(key_tp, k, key): _convert(value_tp, v, f"{key}.{k}") for k, v in value.items()
        }
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(key, f"expected an array, got {_describe(value)}")
        return tuple(_convert(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"expected a table, got {_describe(value)}")
        return build(tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(key, f"expected a number, got {_describe(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {_describe(value)}")
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


def parse_config(data: Mapping[str, Any], source: str = "") -> TailgateConfig:
    """Build the config from an already-parsed TOML document."""
    known = {"gateway", "classes", "pools", "taskserver", "admission", "autoscaling"}
    try:
        for key in data:
            if key not in known:
                raise ConfigError(key, f"unknown section (known: {', '.join(sorted(known))})")
        gw = dict(data.get("gateway", {}) or {})
        if not isinstance(data.get("gateway", {}), Mapping):
            raise ConfigError("gateway", "expected a table")
        for section in ("classes", "pools", "admission", "autoscaling"):
            if section in data:
                if section in gw:
                    raise ConfigError(
                        f"gateway.{section}", f"give [[{section}]] once, at the top level"
                    )
                gw[section] = data[section]
        gateway = _build_top(GatewayConfig, gw, "gateway")
        taskserver = _build_top(TaskServerConfig, data.get("taskserver", {}), "taskserver")
    except ConfigError as exc:
        raise ConfigError(exc.key, exc.message, source) from None
    return TailgateConfig(gateway=gateway, taskserver=taskserver, source=source)


def _build_top(cls: type, table: Any, name: str) -> Any:
    if not isinstance(table, Mapping):
        raise ConfigError(name, f"expected a table, got {_describe(table)}")
    try:
        return build(cls, table, name)
    except ConfigError as exc:
        # Classes and pools live at the top level of the file: name them as written there.
        key = exc.key
        for section in ("classes", "pools", "admission", "autoscaling"):
            key = key.replace(f"gateway.{section}", section)
        raise ConfigError(key, exc.message) from None


def load_config(
    path: str | Path | None = None, env: Mapping[str, str] | None = None
) -> TailgateConfig:
    """Load the file at ``path`` (or $TAILGATE_CONFIG); defaults when neither is set."""
    env = os.environ if env is None else env
    if path is None:
        path = env.get(ENV_CONFIG) or None
    if path is None:
        return TailgateConfig()
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError("", f"cannot read config file: {exc.strerror}", str(p)) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"not valid TOML: {exc}", str(p)) from exc
    return parse_config(data, str(p))
