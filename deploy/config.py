"""Loading ``tailgate.toml`` into typed config objects.

Layout of the file (every key optional; see README for each field)::

    [gateway]            -> gateway.config.GatewayConfig (host, port, grace_ms, ...)
    [[classes]]          -> GatewayConfig.classes
    [[pools]]            -> GatewayConfig.pools, with [pools.prior] and [[pools.servers]]
    [taskserver]         -> taskserver.config.TaskServerConfig, with [taskserver.service]
    [tracing]            -> taskserver.tracing.TracingConfig, for the gateway and task servers
    [tls]                -> taskserver.tls.TlsConfig, for the gateway and task servers
    [auth]               -> gateway.config.AuthConfig (admin and read tokens, refusal logging)
    [tenants.NAME]       -> AuthConfig.tenants: a tenant's API keys and per-key limits

The environment is read here and nowhere else: ``TAILGATE_CONFIG`` names the
file when no path is given. The registration token (the gateway's, and the one
task servers and edge agents send) comes, first found first, from
``TAILGATE_AGENT_TOKEN``, from the file ``TAILGATE_AGENT_TOKEN_FILE`` names, from
the file a table's ``token_file`` key names (relative to the config file), or
from a table's ``token`` key. Admin tokens, read tokens and API keys are given inline or
as files (paths relative to the config file); the files are read here to check them, and
again by the gateway, which re-reads them while it runs (gateway.guard).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config import AuthConfig, GatewayConfig, check_token
from taskserver.config import TaskServerConfig
from taskserver.tomlconfig import ConfigError, build, describe
from taskserver.tracing import with_env

ENV_CONFIG = "TAILGATE_CONFIG"
ENV_TOKEN = "TAILGATE_AGENT_TOKEN"
ENV_TOKEN_FILE = "TAILGATE_AGENT_TOKEN_FILE"
REDACTED = "<redacted>"


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
        gw = dataclasses.replace(gw, auth=_redacted_auth(gw.auth))
        url = _without_password(gw.storage_url)
        if url != gw.storage_url:
            gw = dataclasses.replace(gw, storage_url=url)
        return dataclasses.replace(
            self,
            gateway=gw,
            taskserver=ts if ts.token is None else dataclasses.replace(ts, token=REDACTED),
        )


def _redacted_auth(auth: AuthConfig) -> AuthConfig:
    """[auth] with every inline token and key replaced by REDACTED (their number kept)."""
    tenants = {
        name: dataclasses.replace(t, api_keys=(REDACTED,) * len(t.api_keys))
        for name, t in auth.tenants.items()
    }
    return dataclasses.replace(
        auth,
        admin_tokens=(REDACTED,) * len(auth.admin_tokens),
        read_tokens=(REDACTED,) * len(auth.read_tokens),
        tenants=tenants,
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


def parse_config(
    data: Mapping[str, Any], source: str = "", env: Mapping[str, str] | None = None
) -> TailgateConfig:
    """Build the config from an already-parsed TOML document (and the token from ``env``)."""
    known = {
        *("gateway", "classes", "pools", "taskserver", "admission", "autoscaling", "allocation"),
        *("tracing", "tls", "auth", "tenants"),
    }
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
            raise ConfigError("taskserver", f"expected a table, got {describe(ts)}")
        ts = dict(ts)
        _token_from_file(gw, "gateway", base)
        _token_from_file(ts, "taskserver", base)
        _auth_section(data, gw, base)
        for section in ("classes", "pools", "admission", "autoscaling", "allocation"):
            if section in data:
                if section in gw:
                    raise ConfigError(
                        f"gateway.{section}", f"give [[{section}]] once, at the top level"
                    )
                gw[section] = data[section]
        if "tracing" in data:
            # One [tracing] table for every process the file configures.
            for table, name in ((gw, "gateway"), (ts, "taskserver")):
                if "tracing" in table:
                    raise ConfigError(f"{name}.tracing", "give [tracing] once, at the top level")
                table["tracing"] = data["tracing"]
        _tls_section(data, gw, ts, base)
        gateway = _build_top(GatewayConfig, gw, "gateway")
        taskserver = _build_top(TaskServerConfig, ts, "taskserver")
        env_ = env or {}
        gateway = dataclasses.replace(gateway, tracing=with_env(gateway.tracing, env_))
        taskserver = dataclasses.replace(taskserver, tracing=with_env(taskserver.tracing, env_))
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


def _tls_section(
    data: Mapping[str, Any], gw: dict[str, Any], ts: dict[str, Any], base: Path | None
) -> None:
    """One [tls] table for every process the file configures, its file paths absolute."""
    if "tls" not in data:
        return
    tls = data["tls"]
    if not isinstance(tls, Mapping):
        raise ConfigError("tls", f"expected a table, got {describe(tls)}")
    tls = dict(tls)
    for key in ("cert_file", "key_file", "ca_file"):
        if key in tls:
            tls[key] = _path(tls[key], f"tls.{key}", base)
    for table, name in ((gw, "gateway"), (ts, "taskserver")):
        if "tls" in table:
            raise ConfigError(f"{name}.tls", "give [tls] once, at the top level")
        table["tls"] = tls


def _auth_section(data: Mapping[str, Any], gw: dict[str, Any], base: Path | None) -> None:
    """[auth] and [tenants.NAME] into gw["auth"], their file paths made absolute."""
    if "auth" not in data and "tenants" not in data:
        return
    if "auth" in gw:
        raise ConfigError("gateway.auth", "give [auth] once, at the top level")
    auth = data.get("auth", {})
    if not isinstance(auth, Mapping):
        raise ConfigError("auth", f"expected a table, got {describe(auth)}")
    auth = dict(auth)
    if "tenants" in auth:
        raise ConfigError("auth.tenants", "give each tenant as [tenants.NAME]")
    for key in ("admin_tokens_file", "read_tokens_file"):
        if key in auth:
            auth[key] = _path(auth[key], f"auth.{key}", base)
    if "tenants" in data:
        tenants = data["tenants"]
        if not isinstance(tenants, Mapping):
            raise ConfigError("tenants", f"expected tables [tenants.NAME], got {describe(tenants)}")
        auth["tenants"] = {}
        for name, table in tenants.items():
            if not isinstance(table, Mapping):
                raise ConfigError(f"tenants.{name}", f"expected a table, got {describe(table)}")
            table = dict(table)
            if "api_keys_file" in table:
                table["api_keys_file"] = _path(
                    table["api_keys_file"], f"tenants.{name}.api_keys_file", base
                )
            auth["tenants"][name] = table
    gw["auth"] = auth


def _path(value: Any, key: str, base: Path | None) -> str:
    """A file path of the config, relative to the config file's folder, made absolute."""
    if not isinstance(value, str) or not value:
        raise ConfigError(key, f"expected a file path, got {describe(value)}")
    path = Path(value).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    return str(path.absolute())


def check_credentials(cfg: TailgateConfig) -> None:
    """Every token file of [auth] and [tenants.*] readable and valid, and no token given
    for two roles: ConfigError naming the key, never quoting a token.

    Apart from loading: the gateway's commands check (`tailgate gateway`, `up`, `config`),
    so a task server that reads the same file need not hold the gateway's token files.
    """
    from gateway.auth import credentials_of, parse_tokens, token_files

    files: dict[str, tuple[str, ...]] = {}
    for path, (key, limit) in token_files(cfg.gateway.auth).items():
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ConfigError(
                key, f"cannot read token file {path!r}: {reason}", cfg.source
            ) from None
        try:
            files[path] = parse_tokens(text, limit)
        except ValueError as exc:
            raise ConfigError(key, f"token file {path!r} {exc}", cfg.source) from None
    try:
        credentials_of(cfg.gateway, files)
    except ValueError as exc:
        raise ConfigError("auth", str(exc), cfg.source) from None


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
        raise ConfigError(key, f"expected a file path, got {describe(value)}")
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
        raise ConfigError(name, f"expected a table, got {describe(table)}")
    try:
        return build(cls, table, name)
    except ConfigError as exc:
        # Classes and pools live at the top level of the file: name them as written there.
        key = exc.key.replace("gateway.auth.tenants", "tenants")
        for section in (
            *("classes", "pools", "admission", "autoscaling", "allocation", "tracing"),
            *("tls", "auth"),
        ):
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
