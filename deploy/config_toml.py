"""The effective configuration as ``tailgate.toml`` text (``tailgate config``).

The inverse of `deploy.config.load_config`: every field of every config object, in the
layout the loader reads ([gateway], [[classes]], [[pools]] with [pools.prior] and
[[pools.servers]], [admission], [autoscaling], [allocation], [tracing], [tls], [auth] and
[tenants.NAME], [taskserver] with [taskserver.service]), so the printed text can be saved
and loaded back as the same configuration. A field that is None is left out (the loader's
default for it is None); tokens and API keys are never printed (their files' paths are).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from deploy.config import TailgateConfig

__all__ = ["dump_config", "to_toml"]

TOP_LEVEL = ("classes", "pools", "admission", "autoscaling", "allocation", "tracing", "tls")
TOP_LEVEL += ("auth",)
"""GatewayConfig fields the file gives as top-level sections, not inside [gateway]."""
SHARED = ("tracing", "tls")
"""Top-level sections the loader copies into [taskserver] too: written once, from the
gateway's."""

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def dump_config(cfg: TailgateConfig) -> str:
    """The configuration as TOML the loader reads back to an equal configuration."""
    gateway = _plain(cfg.gateway)
    doc: dict[str, Any] = {"gateway": {k: v for k, v in gateway.items() if k not in TOP_LEVEL}}
    for section in TOP_LEVEL:
        if section in gateway:
            doc[section] = gateway[section]
    taskserver = _plain(cfg.taskserver)
    doc["taskserver"] = {k: v for k, v in taskserver.items() if k not in SHARED}
    header = [f"# Effective configuration ({cfg.source or 'built-in defaults'})"]
    for name, section in (("gateway", cfg.gateway), ("taskserver", cfg.taskserver)):
        doc[name].pop("token", None)
        if section.token is not None:
            header.append(
                f"# [{name}] token: set (not printed; give it as $TAILGATE_AGENT_TOKEN or "
                "token_file)"
            )
    header += _auth_without_secrets(doc, cfg)
    return "\n".join(header) + "\n\n" + to_toml(doc)


def _auth_without_secrets(doc: dict[str, Any], cfg: TailgateConfig) -> list[str]:
    """Take the inline tokens and keys out of doc's [auth]; its tenants go to the top level
    as [tenants.NAME]. Returns the header lines that say what was left out."""
    auth = cfg.gateway.auth
    table = doc["auth"]
    lines = []
    for key in ("admin_tokens", "read_tokens"):
        table.pop(key, None)
        if getattr(auth, key):
            lines.append(f"# [auth] {key}: {len(getattr(auth, key))} set (not printed; give "
                         f"them in {key}_file)")  # fmt: skip
    tenants = table.pop("tenants", {})
    for name, tenant in tenants.items():
        tenant.pop("api_keys", None)
        if auth.tenants[name].api_keys:
            lines.append(f"# [tenants.{name}] api_keys: {len(auth.tenants[name].api_keys)} set "
                         "(not printed; give them in api_keys_file)")  # fmt: skip
    if tenants:
        doc["tenants"] = tenants
    return lines


def _plain(value: Any) -> Any:
    """Dataclasses as dicts of their init fields (None left out), enums as their values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.init and item is not None:
                out[f.name] = _plain(item)
        return out
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def to_toml(doc: Mapping[str, Any]) -> str:
    """A document of tables (dicts), arrays of tables (lists of dicts) and values as TOML."""
    lines: list[str] = []
    _table(lines, doc, ())
    return "\n".join(lines).strip("\n") + "\n"


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _table(lines: list[str], table: Mapping[str, Any], path: tuple[str, ...]) -> None:
    plain = {k: v for k, v in table.items() if not isinstance(v, Mapping)}
    plain = {k: v for k, v in plain.items() if not _is_table_array(v)}
    for key, value in plain.items():
        lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in table.items():
        name = ".".join(_key(p) for p in (*path, key))
        if isinstance(value, Mapping):
            lines += ["", f"[{name}]"]
            _table(lines, value, (*path, key))
        elif _is_table_array(value):
            for item in value:
                lines += ["", f"[[{name}]]"]
                _table(lines, item, (*path, key))


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        # JSON's escapes are TOML's too; TOML also wants DEL escaped (and no surrogates).
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")  # an invariant of our config classes
