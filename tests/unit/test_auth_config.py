"""[auth] and [tenants.NAME] in tailgate.toml: loading, checking the token files, and
never printing a token or key (`tailgate config`)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from deploy.config import ConfigError, check_credentials, load_config, parse_config
from deploy.config_toml import dump_config
from tests.conftest import REPO_ROOT

ADMIN, ADMIN_NEXT, KEY, INLINE_KEY = "adm-tok-0123", "adm-tok-4567", "acme-key-1", "beta-key-9"

TOML = """
[auth]
admin_tokens_file = "secrets/admin.tokens"
read_routes = "token"
refusal_interval_s = 30

[tenants.acme]
api_keys_file = "secrets/acme.keys"
rate_per_s = 20
max_in_flight = 4

[tenants.beta]
api_keys = ["beta-key-9"]
"""


def _write(tmp_path: Path, toml: str = TOML) -> Path:
    (tmp_path / "secrets").mkdir(exist_ok=True)
    (tmp_path / "secrets" / "admin.tokens").write_text(f"# current, next\n{ADMIN}\n{ADMIN_NEXT}\n")
    (tmp_path / "secrets" / "acme.keys").write_text(f"{KEY}\n")
    f = tmp_path / "tailgate.toml"
    f.write_text(toml)
    return f


def test_auth_and_tenants_load_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path), env={})
    auth = cfg.gateway.auth
    assert auth.admin_tokens_file == str(tmp_path / "secrets" / "admin.tokens")
    assert auth.read_routes == "token" and auth.refusal_interval_s == 30.0
    assert auth.tenants["acme"].api_keys_file == str(tmp_path / "secrets" / "acme.keys")
    assert (auth.tenants["acme"].rate_per_s, auth.tenants["acme"].max_in_flight) == (20.0, 4)
    assert auth.tenants["beta"].api_keys == (INLINE_KEY,)
    assert auth.query_access == "key"  # tenants have keys
    check_credentials(cfg)


def test_a_config_without_auth_is_as_before() -> None:
    cfg = load_config(None, env={})
    assert not cfg.gateway.auth.has_admin and cfg.gateway.auth.tenants == {}
    assert cfg.gateway.auth.read_routes == "open" and cfg.gateway.auth.query_access == "open"
    check_credentials(cfg)


@pytest.mark.parametrize(
    ("doc", "key", "words"),
    [
        ({"auth": {"admin_tokens_file": 3}}, "auth.admin_tokens_file", "file path"),
        ({"auth": {"read_routes": "closed"}}, "auth.read_routes", "'open' or 'token'"),
        ({"auth": {"tenants": {}}}, "auth.tenants", "[tenants.NAME]"),
        ({"tenants": {"acme": {"rate_per_s": 5}}}, "tenants.acme.api_keys", "api_keys_file"),
        ({"tenants": {"acme": {"api_keys": ["k1"], "burst": -1}}}, "tenants.acme.burst", ">= 0"),
        ({"tenants": {"acme": {"api_key": ["k1"]}}}, "tenants.acme.api_key", "unknown key"),
        ({"tenants": {"acme": 3}}, "tenants.acme", "expected a table"),
        ({"auth": {"admin_tokens": ["has space"]}}, "auth.admin_tokens[0]", "without spaces"),
    ],
)
def test_bad_auth_values_name_their_key(doc: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(doc, env={})
    assert err.value.key == key, str(err.value)
    assert words in err.value.message
    assert "has space" not in str(err.value)


@pytest.mark.parametrize(
    ("admin_text", "key", "words"),
    [
        (None, "auth.admin_tokens_file", "cannot read token file"),
        ("\n# none yet\n", "auth.admin_tokens_file", "holds no token"),
        ("a-1\nb-2\nc-3\n", "auth.admin_tokens_file", "at most 2"),
        ("good-1\nnot good\n", "auth.admin_tokens_file", "line 2"),
        (f"{KEY}\n", "auth", "admin and tenant acme"),
    ],
)
def test_token_files_are_checked_before_the_gateway_starts(
    tmp_path: Path, admin_text: str | None, key: str, words: str
) -> None:
    f = _write(tmp_path)
    admin = tmp_path / "secrets" / "admin.tokens"
    if admin_text is None:
        admin.unlink()
    else:
        admin.write_text(admin_text)
    cfg = load_config(f, env={})  # a task server reading this file does not need them
    with pytest.raises(ConfigError) as err:
        check_credentials(cfg)
    assert err.value.key == key and words in err.value.message, str(err.value)
    assert "not good" not in str(err.value) and KEY not in str(err.value)


def test_tokens_and_keys_are_never_printed_and_the_rest_round_trips(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path), env={"TAILGATE_AGENT_TOKEN": "reg-tok-0123"})
    text = dump_config(cfg.redacted())
    for secret in (ADMIN, ADMIN_NEXT, KEY, INLINE_KEY, "reg-tok-0123", "<redacted>"):
        assert secret not in text
    assert "# [tenants.beta] api_keys: 1 set (not printed" in text
    doc = tomllib.loads(text)
    assert doc["tenants"]["acme"]["api_keys_file"] == str(tmp_path / "secrets" / "acme.keys")
    assert "tenants" not in doc["auth"]
    # Keys given in files come back as they were; inline ones must be given again.
    doc["tenants"]["beta"]["api_keys"] = [INLINE_KEY]
    back = parse_config(doc, env={})
    assert back.gateway.auth == cfg.gateway.auth
    assert INLINE_KEY not in repr(cfg) and ADMIN not in repr(cfg)
    assert INLINE_KEY not in str(dataclasses.asdict(cfg.redacted()))


def test_tailgate_config_prints_no_token(tmp_path: Path) -> None:
    f = _write(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "--config", str(f), "config"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(REPO_ROOT),
            "TAILGATE_AGENT_TOKEN": "reg-tok-r1",
        },
    )
    assert done.returncode == 0, done.stderr
    for secret in (ADMIN, ADMIN_NEXT, KEY, INLINE_KEY, "reg-tok-r1"):
        assert secret not in done.stdout and secret not in done.stderr
    assert "[tenants.acme]" in done.stdout and "admin_tokens_file" in done.stdout
