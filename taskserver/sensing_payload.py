"""Sensing task payloads: the rules that edge agents and the gateway both check them by.

Payloads (JSON objects)::

    {"op": "range", "sensor": "temperature",            # or "sensors": ["temperature", ...]
     "start": "2026-01-01T00:00:00Z", "end": "2026-01-08T00:00:00Z"}
    {"op": "latest", "sensor": "humidity"}
    {"op": "status"}

Times are ISO 8601 (``Z`` or an offset; naive means UTC) or unix seconds; a range holds the
readings with start <= ts < end, so end must come after start.

An edge agent (`edge_agent.sensing`) runs them; the gateway checks a query's task by the
same rules before it sends it to edge agents (servers whose heartbeat names the
``sensing`` executor), so a bad range is a 400 naming the field rather than a failed task.
What only the agent can judge (its retention horizon, its sensors, its row limit) it
reports as an `InvalidTask` too, which the gateway also answers 400.

Errors::

    taskserver.abc.InvalidTask   a bad parameter, naming the field ("payload", "op",
                                 "sensor"/"sensors", "start", "end")
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from taskserver import jsonbody
from taskserver.abc import InvalidTask

__all__ = ["OPS", "SENSING_EXECUTOR", "SensingTask", "check_sensing_task", "parse_time"]

SENSING_EXECUTOR = "sensing"
"""The executor name an edge agent reports in its heartbeat (ServerStatus.executor)."""
OPS = ("latest", "range", "status")

_MIN_UNIX_S = datetime(1, 1, 1, tzinfo=UTC).timestamp()
_MAX_UNIX_S = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()


@dataclass(frozen=True, slots=True)
class SensingTask:
    """A checked sensing task."""

    op: str
    sensors: tuple[str, ...] = ()
    """range: the sensors, each once, in the order given; latest: the one sensor."""
    start_s: float = 0.0
    """range: start, unix seconds."""
    end_s: float = 0.0
    """range: end, unix seconds (after start_s)."""
    start_text: str = ""
    """range: start as the payload gave it (for messages)."""


def parse_time(value: Any, field: str) -> float:
    """An ISO 8601 string (naive = UTC) or unix seconds, as unix seconds; else InvalidTask."""
    if isinstance(value, bool):
        raise InvalidTask(field, "must be an ISO 8601 timestamp or unix seconds")
    if isinstance(value, int | float):
        # The span of ISO 8601 timestamps (years 1..9999): a store keys readings by int64.
        if not (_MIN_UNIX_S <= value <= _MAX_UNIX_S):  # False for NaN too
            raise InvalidTask(field, f"must be unix seconds within years 1..9999, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise InvalidTask(field, f"must be an ISO 8601 timestamp, got {value!r}")
    try:
        dt = datetime.fromisoformat(value)
    except ValueError as exc:
        raise InvalidTask(field, f"not an ISO 8601 timestamp: {value[:40]!r}") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def parse_payload(payload: bytes) -> dict[str, Any]:
    """A task payload's JSON object; InvalidTask("payload") when it is not one."""
    try:
        request = jsonbody.loads(payload) if payload else None
    except jsonbody.JsonError as exc:
        raise InvalidTask("payload", str(exc)) from exc
    if not isinstance(request, dict):
        raise InvalidTask("payload", 'must be a JSON object such as {"op": "latest", ...}')
    return request


def check_sensing_task(request: dict[str, Any]) -> SensingTask:
    """The task a payload object asks for, checked; InvalidTask naming the field if not."""
    op = request.get("op")
    if op is None:
        raise InvalidTask("op", f"missing; expected one of {', '.join(OPS)}")
    if op == "status":
        return SensingTask("status")
    if op == "latest":
        return SensingTask("latest", (_sensor(request),))
    if op != "range":
        raise InvalidTask("op", f"unknown {op!r}; expected one of {', '.join(OPS)}")
    sensors = _sensors(request)
    for field in ("start", "end"):
        if field not in request:
            raise InvalidTask(field, "missing (ISO 8601 timestamp or unix seconds)")
    start = parse_time(request["start"], "start")
    end = parse_time(request["end"], "end")
    if end <= start:
        raise InvalidTask(
            "end", f"must be after start (start {request['start']}, end {request['end']})"
        )
    return SensingTask("range", tuple(sensors), start, end, str(request["start"]))


def _sensor(request: dict[str, Any]) -> str:
    sensor = request.get("sensor")
    if sensor is None:
        raise InvalidTask("sensor", "missing")
    if not isinstance(sensor, str) or not sensor:
        raise InvalidTask("sensor", f"must be a sensor name, got {sensor!r}")
    return sensor


def _sensors(request: dict[str, Any]) -> list[str]:
    if "sensors" not in request:
        if "sensor" not in request:
            raise InvalidTask("sensor", 'missing (give "sensor" or "sensors")')
        return [_sensor(request)]
    if "sensor" in request:
        raise InvalidTask("sensors", 'give either "sensor" or "sensors", not both')
    sensors = request["sensors"]
    if (
        not isinstance(sensors, list)
        or not sensors
        or not all(isinstance(s, str) and s for s in sensors)
    ):
        raise InvalidTask("sensors", f"must be a non-empty list of sensor names, got {sensors!r}")
    return list(dict.fromkeys(sensors))
