"""Request ids and W3C Trace Context: what is kept, what is replaced, what is ignored."""

from __future__ import annotations

import pytest

from deploy.config import ConfigError, parse_config
from gateway.request_ids import MAX_REQUEST_ID_CHARS, valid_request_id
from taskserver.tracecontext import (
    MAX_TRACESTATE_CHARS,
    TraceParent,
    parse_traceparent,
    parse_tracestate,
)
from taskserver.tracing import TracingConfig, with_env

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
W3C_EXAMPLE = f"00-{TRACE}-{SPAN}-01"


def test_the_spec_example_parses() -> None:
    tp = parse_traceparent(W3C_EXAMPLE)
    assert tp == TraceParent(TRACE, SPAN, 1)
    assert tp.sampled and tp.header() == W3C_EXAMPLE
    unsampled = parse_traceparent(f"00-{TRACE}-{SPAN}-00")
    assert unsampled is not None and not unsampled.sampled


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        W3C_EXAMPLE.upper(),  # hex is lower case
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE}-{SPAN}-01",  # version ff is invalid
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE[:-1]}-{SPAN}-01",  # short trace id
        f"00-{TRACE}-{SPAN}-1",  # one flag digit
        f"00-{TRACE}x{SPAN}-01",  # wrong separator
        f"0g-{TRACE}-{SPAN}-01",  # version not hex
        f"00-{TRACE[:-1]}z-{SPAN}-01",  # trace id not hex
        f"cc-{TRACE}-{SPAN}-01x",  # a later version's extra fields start with "-"
    ],
)
def test_an_invalid_traceparent_is_ignored(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_a_later_version_is_read_by_its_version_00_prefix() -> None:
    tp = parse_traceparent(f"cc-{TRACE}-{SPAN}-01-what-the-future-holds")
    assert tp == TraceParent(TRACE, SPAN, 1)
    assert parse_traceparent(f"01-{TRACE}-{SPAN}-03") == TraceParent(TRACE, SPAN, 3)


def test_a_continuation_keeps_the_trace_and_flags_under_a_new_parent() -> None:
    tp = TraceParent(TRACE, SPAN, 0)
    child = tp.child()
    assert (child.trace_id, child.flags) == (TRACE, 0)
    assert child.parent_id != SPAN and len(child.parent_id) == 16
    assert parse_traceparent(child.header()) == child
    assert tp.child("1111111111111111").parent_id == "1111111111111111"


def test_tracestate_is_normalised_and_joined_across_headers() -> None:
    assert parse_tracestate("rojo=00f067aa0ba902b7 , congo=t61rcWkgMzE") == (
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    )
    assert parse_tracestate(["rojo=1", "", "tenant@vendor=x"]) == "rojo=1,tenant@vendor=x"
    assert parse_tracestate(" , ,") is None
    assert parse_tracestate(None) is None


@pytest.mark.parametrize(
    "value",
    [
        "rojo=1,rojo=2",  # a key twice
        "Rojo=1",  # upper-case key
        "rojo",  # no value
        "rojo=a=b",  # "=" in a value
        "rojo=\x01",  # a control character
        ",".join(f"k{i}=v" for i in range(33)),  # more than 32 members
        "k=" + "v" * 257,  # a value longer than 256
    ],
)
def test_an_invalid_tracestate_is_dropped_whole(value: str) -> None:
    assert parse_tracestate(value) is None


def test_a_tracestate_beyond_512_characters_is_dropped() -> None:
    members = [f"k{i}={'v' * 40}" for i in range(12)]  # 529 characters with the commas
    assert len(",".join(members)) > MAX_TRACESTATE_CHARS
    assert parse_tracestate(members) is None
    assert parse_tracestate(members[:11]) == ",".join(members[:11])


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("3f1c2a9e-5d1b-4c8e-9a0f-6b7e8d9c0a1b", True),
        ("a", True),
        ("x" * MAX_REQUEST_ID_CHARS, True),
        ("x" * (MAX_REQUEST_ID_CHARS + 1), False),
        ("", False),
        (None, False),
        ("has space", False),
        ("line\nbreak", False),
        ("tab\there", False),
        ("caf\u00e9", False),
    ],
)
def test_a_request_id_is_kept_only_when_short_and_printable(value: str | None, kept: bool) -> None:
    assert valid_request_id(value) is kept


def test_the_environment_fills_what_the_file_leaves_empty() -> None:
    on = TracingConfig(enabled=True)
    env = {"OTEL_SERVICE_NAME": "edge-gw", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    got = with_env(on, env)
    assert got.service_name == "edge-gw"
    assert got.endpoint() == "http://collector:4318/v1/traces"
    traces = {**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://tempo:4318/v1/traces"}
    assert with_env(on, traces).endpoint() == "http://tempo:4318/v1/traces"
    named = TracingConfig(enabled=True, service_name="gw", otlp_endpoint="http://a:1/v1/traces")
    assert with_env(named, traces) == named  # the file wins
    assert not with_env(on, {"OTEL_SDK_DISABLED": "true"}).enabled
    assert with_env(on, {}).endpoint() == "http://localhost:4318/v1/traces"


def test_only_otlp_over_http_is_accepted() -> None:
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf"):
        with_env(TracingConfig(enabled=True), {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    off = TracingConfig()
    assert with_env(off, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == off  # off: not our concern
    with pytest.raises(ValueError, match="otlp_endpoint: expected an http"):
        TracingConfig(otlp_endpoint="collector:4317")
    with pytest.raises(ValueError, match=r"sample_ratio: must be in 0\.\.1, got 1\.5"):
        TracingConfig(sample_ratio=1.5)


def test_one_tracing_table_configures_the_gateway_and_the_task_servers() -> None:
    cfg = parse_config(
        {"tracing": {"enabled": True, "otlp_endpoint": "http://127.0.0.1:4318/v1/traces"}},
        env={"OTEL_SERVICE_NAME": "lab"},
    )
    assert cfg.gateway.tracing == cfg.taskserver.tracing
    assert cfg.gateway.tracing.enabled and cfg.gateway.tracing.service_name == "lab"
    assert not parse_config({}).gateway.tracing.enabled
    with pytest.raises(ConfigError, match=r"tracing\.sample_ratio: must be in 0\.\.1"):
        parse_config({"tracing": {"sample_ratio": -1.0}})
    with pytest.raises(ConfigError, match=r"tracing\.endpoint: unknown"):
        parse_config({"tracing": {"endpoint": "x"}})
    with pytest.raises(ConfigError, match=r"gateway.tracing: give \[tracing\] once"):
        parse_config({"tracing": {}, "gateway": {"tracing": {}}})
