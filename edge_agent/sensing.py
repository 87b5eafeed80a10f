"""Sensing tasks: the executor that answers the gateway's queries from the sensor store.

Payloads (JSON objects)::

    {"op": "range", "sensor": "temperature",            # or "sensors": ["temperature", ...]
     "start": "2026-01-01T00:00:00Z", "end": "2026-01-08T00:00:00Z"}
    {"op": "latest", "sensor": "humidity"}
    {"op": "status"}

Times are ISO 8601 (``Z`` or an offset; naive means UTC) or unix seconds. A range holds
the readings with start <= ts < end; start may not reach before the retention horizon.

Range result (compact JSON, no spaces)::

    {"agent": "pi-3", "op": "range", "start": "...Z", "end": "...Z", "count": 4032,
     "series": {"temperature": {"count": 2016, "t0": 1767225600, "step": 300,
                                "values": [4.21, 4.18, ...]},
                "humidity":    {"count": 2016, "t0": 1767225600, "dt": [300, 600, ...],
                                "values": [81.5, ...]}}}

Timestamps are unix seconds: reading i is at ``t0 + i*step`` when the series is regular
(``step``; 0 for a single reading), else at ``t0 + sum(dt[:i])`` (``dt`` holds the
count - 1 gaps). An empty series is ``{"count": 0, "t0": null, "step": null,
"values": []}``. Values are written with 2 decimals (0.01 °C, 0.01 %RH: the sensors'
resolution; "21.40" is a JSON number). ``decode_series`` turns a series back into
(ts, value) pairs.

Latest result: ``{"agent", "op": "latest", "sensor", "ts": ISO or null, "value"}``.

Sampled reads (dense testbeds): with ``read_sample`` below 1 and a profile, only that
share of range tasks reads the store; the others are checked as usual (sensors, start,
end), sleep their profile draw and answer without readings::

    {"agent": "pi-3", "op": "range", "start": "...Z", "end": "...Z", "emulated": true}

so many emulated agents can share one process and one store while the read path stays
exercised. The ``status`` task counts both kinds (``real_reads``, ``emulated_reads``).

The payload rules (ops, sensors, times, end after start) live in
`taskserver.sensing_payload`, which the gateway checks queries by as well.

Errors::

    taskserver.executors.ExecutorError   a store failure ("store: ..."); it goes back to
     │                                   the gateway as the task's error (502)
     └── taskserver.abc.InvalidTask      a bad parameter, the message naming the field
                                         ("payload", "op", "sensor"/"sensors", "start",
                                         "end"), the retention horizon, an unknown sensor
                                         or too many rows included; the gateway answers
                                         its client 400 naming the field
"""

from __future__ import annotations

import asyncio
import json
import math
import operator
import random
import time
from array import array
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from edge_agent.profiles import ServiceProfile
from edge_agent.store import Readings, SensorStore, StoreError, UnknownSensor
from taskserver.abc import Executor, ExecutorError, InvalidTask
from taskserver.sensing_payload import (
    OPS,
    SENSING_EXECUTOR,
    SensingTask,
    check_sensing_task,
    parse_payload,
    parse_time,
)

__all__ = ["OPS", "SensingExecutor", "decode_series", "encode_series", "iso", "parse_time"]

DAY_S = 86_400


def iso(ts: int) -> str:
    """Unix seconds as an ISO 8601 UTC timestamp ('2026-01-01T00:00:00Z')."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def encode_series(readings: Readings, decimals: int = 2) -> str:
    """One sensor's readings as the compact JSON object of the module docstring."""
    ts, values = readings.ts, readings.values
    n = len(ts)
    if n == 0:
        return '{"count":0,"t0":null,"step":null,"values":[]}'
    step = ts[1] - ts[0] if n > 1 else 0
    # Regular iff ts equals t0, t0+step, ...: one comparison in C instead of n in Python.
    if n == 1 or (step > 0 and ts == array("q", range(ts[0], ts[0] + step * n, step))):
        timing = f'"step":{step}'
    else:
        timing = '"dt":[' + ",".join(map(str, map(operator.sub, ts[1:], ts[:-1]))) + "]"
    body = _fixed_point(values, decimals)
    return f'{{"count":{n},"t0":{ts[0]},{timing},"values":[{body}]}}'


def _fixed_point(values: array[float], decimals: int, chunk: int = 1024) -> str:
    """The values as comma-separated fixed-point numbers ("21.40"), chunk by chunk.

    One %-format per chunk: a tenth of the cost of json.dumps over rounded floats, which
    also holds a string per number until the end. The store holds only finite values.
    """
    one = f"%.{decimals}f"
    full = ",".join([one] * chunk)
    parts = []
    for i in range(0, len(values), chunk):
        part = tuple(values[i : i + chunk])
        parts.append((full if len(part) == chunk else ",".join([one] * len(part))) % part)
    return ",".join(parts)


def decode_series(series: dict[str, Any]) -> list[tuple[int, float]]:
    """The (ts, value) pairs of an encoded series."""
    values = series["values"]
    if not values:
        return []
    t0 = series["t0"]
    if "step" in series:
        ts = [t0 + i * series["step"] for i in range(len(values))]
    else:
        ts = [t0]
        for gap in series["dt"]:
            ts.append(ts[-1] + gap)
    return list(zip(ts, values, strict=True))


class SensingExecutor(Executor):
    """Runs sensing tasks against a SensorStore; DB work runs in a worker thread."""

    name = SENSING_EXECUTOR

    def __init__(
        self,
        store: SensorStore,
        *,
        agent_id: str,
        retention_s: float = 548 * DAY_S,
        profile: ServiceProfile | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.time,
        stats: Callable[[], dict[str, Any]] | None = None,
        max_rows: int = 1_000_000,
        decimals: int = 2,
        read_sample: float = 1.0,
        time_scale: float = 1.0,
    ) -> None:
        if not 0.0 <= read_sample <= 1.0:
            raise ValueError(f"read_sample: must be in [0, 1], got {read_sample}")
        if not (time_scale > 0 and math.isfinite(time_scale)):
            raise ValueError(f"time_scale: must be a finite number > 0, got {time_scale}")
        if profile is None and (read_sample < 1.0 or time_scale != 1.0):
            raise ValueError("profile: read_sample and time_scale need a profile to draw from")
        self.store = store
        self.agent_id = agent_id
        self.retention_s = retention_s
        self.profile = profile
        self.clock = clock
        self.stats = stats
        self.max_rows = max_rows
        self.decimals = decimals
        self.read_sample = read_sample
        self.time_scale = time_scale
        self.real_reads = 0
        """Range tasks answered from the store."""
        self.emulated_reads = 0
        """Range tasks answered by their profile draw alone (see read_sample)."""
        self._rng = random.Random(seed)
        # A stream of its own: the profile's draws are the same whatever the share.
        self._sample_rng = random.Random(None if seed is None else f"read-sample-{seed}")

    async def execute(self, payload: bytes, *, budget_ms: float | None = None) -> bytes:
        # The rules the gateway checks too (taskserver.sensing_payload); what only this
        # agent can judge (horizon, sensors, row limit) is an InvalidTask as well.
        task = check_sensing_task(parse_payload(payload))
        op = task.op
        if op == "status":
            return await asyncio.to_thread(self._status)
        started = time.perf_counter()
        drawn_ms = (
            self.profile.sample_ms(self._rng) * self.time_scale if self.profile is not None else 0.0
        )
        if op == "range":
            sensors = list(task.sensors)
            start_s, end_s = self._window(task)
            if self.read_sample < 1.0 and self._sample_rng.random() >= self.read_sample:
                result = self._emulated_range(sensors, start_s, end_s)
                self.emulated_reads += 1
                # The draw less the checks so far, on a plain timer: nothing spins.
                await asyncio.sleep(max(0.0, drawn_ms / 1000.0 - (time.perf_counter() - started)))
                return result
            result = await asyncio.to_thread(self._range, sensors, start_s, end_s)
            self.real_reads += 1
        else:
            result = await asyncio.to_thread(self._latest, task.sensors[0])
        if self.profile is not None:
            query_s = time.perf_counter() - started
            wait_s = self.profile.service_s(drawn_ms, query_s) - query_s
            if wait_s > 0:
                await asyncio.sleep(wait_s)
        return result

    def _window(self, task: SensingTask) -> tuple[int, int]:
        start, end = task.start_s, task.end_s
        horizon = self.clock() - self.retention_s
        if start < horizon:
            days = self.retention_s / DAY_S
            raise InvalidTask(
                "start",
                f"{task.start_text} is before the retention horizon "
                f"{iso(math.ceil(horizon))} ({days:g} days are kept)",
            )
        # Integer readings: ts >= start <=> ts >= ceil(start); ts < end <=> ts < ceil(end).
        return math.ceil(start), math.ceil(end)

    def _range(self, sensors: list[str], start_s: int, end_s: int) -> bytes:
        try:
            data = self.store.range(sensors, start_s, end_s, limit=self.max_rows + 1)
        except UnknownSensor as exc:
            raise InvalidTask("sensor", str(exc)) from exc
        except StoreError as exc:
            raise ExecutorError(f"store: {exc}") from exc
        for name, points in data.items():
            if len(points) > self.max_rows:
                raise InvalidTask(
                    "end",
                    f"more than {self.max_rows} readings of {name!r} in the range; "
                    "narrow start..end",
                )
        head = {
            "agent": self.agent_id,
            "op": "range",
            "start": iso(start_s),
            "end": iso(end_s),
            "count": sum(len(r) for r in data.values()),
        }
        series = ",".join(
            f"{json.dumps(name)}:{encode_series(r, self.decimals)}" for name, r in data.items()
        )
        text = json.dumps(head, separators=(",", ":"))[:-1] + ',"series":{' + series + "}}"
        return text.encode()

    def _emulated_range(self, sensors: list[str], start_s: int, end_s: int) -> bytes:
        """A range task's answer without its readings; an unknown sensor fails as a read would."""
        known = self.store.sensor_names()
        for name in sensors:
            if name not in known:
                raise InvalidTask("sensor", str(UnknownSensor(name, known)))
        result = {
            "agent": self.agent_id,
            "op": "range",
            "start": iso(start_s),
            "end": iso(end_s),
            "emulated": True,
        }
        return json.dumps(result, separators=(",", ":")).encode()

    def _latest(self, sensor: str) -> bytes:
        try:
            row = self.store.latest(sensor)
        except UnknownSensor as exc:
            raise InvalidTask("sensor", str(exc)) from exc
        except StoreError as exc:
            raise ExecutorError(f"store: {exc}") from exc
        result = {
            "agent": self.agent_id,
            "op": "latest",
            "sensor": sensor,
            "ts": iso(row[0]) if row else None,
            "value": round(row[1], self.decimals) if row else None,
        }
        return json.dumps(result, separators=(",", ":")).encode()

    def _status(self) -> bytes:
        try:
            rows = self.store.count()
        except StoreError as exc:
            raise ExecutorError(f"store: {exc}") from exc
        result: dict[str, Any] = {
            "agent": self.agent_id,
            "op": "status",
            "sensors": self.store.sensor_names(),
            "rows": rows,
            "retention_days": self.retention_s / DAY_S,
            "horizon": iso(math.ceil(self.clock() - self.retention_s)),
            "profile": self.profile.name if self.profile is not None else "none",
            "real_reads": self.real_reads,
            "emulated_reads": self.emulated_reads,
        }
        if self.stats is not None:
            result.update(self.stats())
        return json.dumps(result, separators=(",", ":")).encode()

    def __repr__(self) -> str:
        profile = self.profile.name if self.profile is not None else "none"
        return f"SensingExecutor(agent_id={self.agent_id!r}, store={self.store!r}, {profile=})"
