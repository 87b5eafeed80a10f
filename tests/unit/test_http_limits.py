"""Limits on slow and greedy HTTP clients: their config, the in-flight table, the file limit."""

from __future__ import annotations

import logging
import resource
import tomllib

import pytest

from deploy.config import ConfigError, parse_config
from deploy.config_toml import dump_config
from gateway import connections
from gateway.config import GatewayConfig
from gateway.connections import PROBE_RESERVE, ConnectionLimits, fit_to_file_limit
from gateway.limits import InFlightTable


def test_defaults_and_the_printed_config() -> None:
    config = GatewayConfig()
    assert (config.header_timeout_s, config.body_timeout_s, config.keepalive_timeout_s) == (
        10.0,
        30.0,
        75.0,
    )
    assert (config.max_connections, config.max_in_flight_per_client) == (10_000, 256)
    text = dump_config(parse_config({}, env={}))
    for line in (
        "header_timeout_s = 10.0",
        "body_timeout_s = 30.0",
        "keepalive_timeout_s = 75.0",
        "max_connections = 10000",
        "max_in_flight_per_client = 256",
    ):
        assert line in text
    doc = {"gateway": {"header_timeout_s": 3, "max_connections": 50}}
    back = parse_config(tomllib.loads(dump_config(parse_config(doc, env={}))), env={})
    assert (back.gateway.header_timeout_s, back.gateway.max_connections) == (3.0, 50)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("header_timeout_s", 0, "header_timeout_s: must be seconds in (0, 3600], got 0"),
        ("body_timeout_s", float("inf"), "body_timeout_s: must be seconds in (0, 3600]"),
        ("keepalive_timeout_s", 7200, "keepalive_timeout_s: must be seconds in (0, 3600]"),
        ("max_connections", 0, "max_connections: must be 1..1000000, got 0"),
        ("max_in_flight_per_client", -1, "max_in_flight_per_client: must be 0 (no limit)"),
    ],
)
def test_a_bad_limit_names_its_key(key: str, value: float, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"gateway": {key: value}}, env={})
    assert str(info.value).startswith(f"gateway.{key}: ")
    assert message in str(info.value)


def test_in_flight_per_source_within_the_limit() -> None:
    table = InFlightTable(2)
    assert table.acquire("10.0.0.1") and table.acquire("10.0.0.1")
    assert not table.acquire("10.0.0.1")  # at its limit: refused, nothing counted
    assert table.acquire("10.0.0.2")  # another source is not held back
    table.release("10.0.0.1")
    assert table.acquire("10.0.0.1")
    for _ in range(2):
        table.release("10.0.0.1")
    table.release("10.0.0.2")
    assert table.counts == {}  # no source is kept once it has nothing in flight
    unlimited = InFlightTable(0)
    assert all(unlimited.acquire("10.0.0.1") for _ in range(10_000))


def _limits(monkeypatch: pytest.MonkeyPatch, soft: int, hard: int) -> list[tuple[int, int]]:
    """A process whose file limit is (soft, hard); returns the limits set."""
    set_to: list[tuple[int, int]] = []
    now = [soft]

    def setrlimit(which: int, limits: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        set_to.append(limits)
        now[0] = limits[0]

    monkeypatch.setattr(connections.resource, "getrlimit", lambda _which: (now[0], hard))
    monkeypatch.setattr(connections.resource, "setrlimit", setrlimit)
    return set_to


def test_the_file_limit_is_raised_as_far_as_the_connections_need(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_to = _limits(monkeypatch, 1024, 1 << 20)
    assert fit_to_file_limit(10_000) == 10_000
    assert set_to == [(10_000 + PROBE_RESERVE + connections.FILE_HEADROOM, 1 << 20)]


def test_a_small_file_limit_lowers_max_connections_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _limits(monkeypatch, 1024, 4096)
    caplog.set_level(logging.WARNING, logger="gateway.connections")
    fitted = fit_to_file_limit(10_000)
    assert fitted == 4096 - PROBE_RESERVE - connections.FILE_HEADROOM
    assert "max_connections 10000 lowered to" in caplog.text and "ulimit -n" in caplog.text
    config = GatewayConfig(header_timeout_s=2.0, keepalive_timeout_s=5.0)
    assert ConnectionLimits.of(config) == ConnectionLimits(2.0, 5.0, fitted, PROBE_RESERVE)
