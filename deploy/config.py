"""Loading ``tailgate.toml`` into typed config objects.

Layout of the file (every key optional; see README for each field)::

    [gateway]            -> gateway.config.GatewayConfig (host, port, grace_ms, ...)
    [[classes]]          -> GatewayConfig.classes
    [[pools]]            -> GatewayConfig.pools, with [pools.prior] and [[pools.servers]]
    [taskserver]         -> taskserver.config.TaskServerConfig, with [taskserver.service]

The environment is read here and nowhere else: ``TAILGATE_CONFIG`` names the
file when no path is given. The registration token (the gateway's, and the one
task servers and edge agents send) comes, first found first, from
``TAILGATE_AGENT_TOKEN``, from the file ``TAILGATE_AGENT_TOKEN_FILE`` names, from
the file a table's ``token_file`` key names (relative to the config file), or
from a table's ``token`` key.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig, check_token
from taskserver.config import TaskServerConfig

ENV_CONFIG = "TAILGATE_CONFIG"
ENV_TOKEN = "TAILGATE_AGENT_TOKEN"
ENV_TOKEN_FILE = "TAILGATE_AGENT_TOKEN_FILE"
REDACTED = "<redacted>"


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

    def redacted(self) -> TailgateConfig:
        """A copy fit for printing: every token and the store's password replaced."""
        gw, ts = self.gateway, self.taskserver
        if gw.token is not None:
            gw = dataclasses.replace(gw, token=REDACTED)
        url = _without_password(gw.storage_url)
        if url != gw.storage_url:
            gw = dataclasses.replace(gw, storage_url=url)
        return dataclasses.replace(
            self,
            gateway=gw,
            taskserver=ts if ts.token is None else dataclasses.replace(ts, token=REDACTED),
        )


def _without_password(url: str) -> str:
    """`url` with its password, and a `password` query parameter, hidden (user:***@host)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        return url  # not a URL SQLAlchemy reads: nothing it would send as a password
    if parsed.password is None and "password" not in parsed.query:
        return url  # rendering would re-quote the query; keep it as written
    if "password" in parsed.query:
        parsed = parsed.update_query_dict({"password": "***"})
    return parsed.render_as_string(hide_password=True)


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
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            valid = ", ".join(repr(m.value) for m in tp)
            raise ConfigError(key, f"expected one of {valid}, got {_describe(value)}") from None
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


def parse_config(
    data: Mapping[str, Any], source: str = "", env: Mapping[str, str] | None = None
) -> TailgateConfig:
    """Build the config from an already-parsed TOML document (and the token from ``env``)."""
    known = {"gateway", "classes", "pools", "taskserver", "admission", "autoscaling"}
    base = Path(source).parent if source else None
    try:
        for key in data:
            if key not in known:
                raise ConfigError(key, f"unknown section (known: {', '.join(sorted(known))})")
        gw = dict(data.get("gateway", {}) or {})
        if not isinstance(data.get("gateway", {}), Mapping):
            raise ConfigError("gateway", "expected a table")
        ts = data.get("taskserver", {})
        if not isinstance(ts, Mapping):
            raise ConfigError("taskserver", f"expected a table, got {_describe(ts)}")
        ts = dict(ts)
        _token_from_file(gw, "gateway", base)
        _token_from_file(ts, "taskserver", base)
        for section in ("classes", "pools", "admission", "autoscaling"):
            if section in data:
                if section in gw:
                    raise ConfigError(
                        f"gateway.{section}", f"give [[{section}]] once, at the top level"
                    )
                gw[section] = data[section]
        gateway = _build_top(GatewayConfig, gw, "gateway")
        taskserver = _build_top(TaskServerConfig, ts, "taskserver")
        if taskserver.token is not None:
            try:
                check_token(taskserver.token)
            except ValueError as exc:
                raise ConfigError("taskserver.token", str(exc).removeprefix("token: ")) from None
    except ConfigError as exc:
        raise ConfigError(exc.key, exc.message, source) from None
    token = _token_from_env(env or {})
    if token is not None:
        gateway = dataclasses.replace(gateway, token=token)
        taskserver = dataclasses.replace(taskserver, token=token)
    return TailgateConfig(gateway=gateway, taskserver=taskserver, source=source)


def _read_token(path: Path, key: str) -> str:
    """The token in a file (surrounding whitespace dropped), checked; ConfigError names key."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(key, f"cannot read token file {str(path)!r}: {reason}") from None
    if not token:
        raise ConfigError(key, f"token file {str(path)!r} is empty")
    try:
        return check_token(token)
    except ValueError as exc:
        raise ConfigError(
            key, f"token in {str(path)!r} {str(exc).removeprefix('token: ')}"
        ) from None


def _token_from_file(table: dict[str, Any], name: str, base: Path | None) -> None:
    """Replace a table's ``token_file`` key by the ``token`` the file holds."""
    if "token_file" not in table:
        return
    key = f"{name}.token_file"
    value = table.pop("token_file")
    if "token" in table:
        raise ConfigError(key, "give token or token_file, not both")
    if not isinstance(value, str) or not value:
        raise ConfigError(key, f"expected a file path, got {_describe(value)}")
    path = Path(value).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    table["token"] = _read_token(path, key)


def _token_from_env(env: Mapping[str, str]) -> str | None:
    """$TAILGATE_AGENT_TOKEN, else the token in the file $TAILGATE_AGENT_TOKEN_FILE names."""
    token = env.get(ENV_TOKEN)
    if token:
        try:
            return check_token(token.strip())
        except ValueError as exc:
            raise ConfigError(ENV_TOKEN, str(exc).removeprefix("token: ")) from None
    path = env.get(ENV_TOKEN_FILE)
    if path:
        return _read_token(Path(path).expanduser(), ENV_TOKEN_FILE)
    return None


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
        return parse_config({}, env=env)
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError("", f"cannot read config file: {exc.strerror}", str(p)) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"not valid TOML: {exc}", str(p)) from exc
    return parse_config(data, str(p), env)
