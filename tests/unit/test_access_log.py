"""The gateway's access log: off by default, `[gateway] access_log`, and the line's fields."""

from __future__ import annotations

import pytest

from deploy.config import parse_config
from gateway.access_log import AccessLogger, access_fields, access_log_options
from taskserver.tomlconfig import ConfigError


def test_it_is_off_unless_the_config_or_the_flag_turns_it_on() -> None:
    assert parse_config({}).gateway.access_log is False
    assert parse_config({"gateway": {"access_log": True}}).gateway.access_log is True
    with pytest.raises(ConfigError) as err:
        parse_config({"gateway": {"access_log": "yes"}})
    assert err.value.key == "gateway.access_log"
    assert access_log_options(False) == {"access_log": None}
    on = access_log_options(True)
    assert on["access_log"].name == "gateway.access" and on["access_log_class"] is AccessLogger


def test_an_access_line_has_method_path_status_duration_bytes_and_request_id() -> None:
    assert access_fields("POST", "/v1/queries", 503, 0.0123456, 210, "r-1") == {
        "method": "POST",
        "path": "/v1/queries",
        "status": 503,
        "duration_ms": 12.346,
        "bytes": 210,
        "request_id": "r-1",
    }
    assert "request_id" not in access_fields("GET", "/healthz", 200, 0.001, 2, None)
