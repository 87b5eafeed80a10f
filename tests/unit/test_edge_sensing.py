"""Sensing tasks: range/latest/status payloads, the compact encoding and the error messages."""

from __future__ import annotations

import asyncio
import json
import random
import time
from array import array
from typing import Any

import pytest

from edge_agent.backfill import backfill
from edge_agent.profiles import fit_profile
from edge_agent.readers import SimulatedReader
from edge_agent.sensing import SensingExecutor, decode_series, encode_series, iso, parse_time
from edge_agent.store import Readings, SensorStore
from taskserver.executors import ExecutorError

NOW = 1_768_435_200  # 2026-01-15T00:00:00Z
DAY = 86_400


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> SensorStore:
    """60 days of simulated readings every 5 minutes, up to NOW."""
    s = SensorStore(str(tmp_path_factory.mktemp("sensing") / "edge.db"))
    backfill(s, SimulatedReader(seed=1), start_s=NOW - 60 * DAY, end_s=NOW, interval_s=300)
    return s


def make_executor(store: SensorStore, **kw: Any) -> SensingExecutor:
    kw.setdefault("retention_s", 90 * DAY)
    return SensingExecutor(store, agent_id="pi-7", clock=lambda: float(NOW), **kw)


async def run(executor: SensingExecutor, **payload: Any) -> dict[str, Any]:
    return json.loads(await executor.execute(json.dumps(payload).encode()))


async def test_range_of_two_sensors_is_compact_and_exact(store: SensorStore) -> None:
    result = await run(
        make_executor(store),
        op="range",
        sensors=["temperature", "humidity"],
        start="2026-01-01T00:00:00Z",
        end="2026-01-08T00:00:00Z",
    )
    assert result["agent"] == "pi-7" and result["op"] == "range"
    assert result["start"] == "2026-01-01T00:00:00Z" and result["end"] == "2026-01-08T00:00:00Z"
    assert result["count"] == 2 * 7 * 288
    temp = result["series"]["temperature"]
    assert temp["count"] == 7 * 288 and temp["step"] == 300 and "dt" not in temp
    assert temp["t0"] == 1_767_225_600
    reader = SimulatedReader(seed=1)
    assert decode_series(temp)[:3] == [
        (t, reader.value("temperature", t)) for t in range(1_767_225_600, 1_767_226_500, 300)
    ]


async def test_single_sensor_naive_and_unix_times(store: SensorStore) -> None:
    executor = make_executor(store)
    a = await run(executor, op="range", sensor="humidity", start="2026-01-10T00:00", end=NOW)
    b = await run(executor, op="range", sensor="humidity", start=NOW - 5 * DAY, end=NOW)
    assert a["series"] == b["series"] and a["count"] == 5 * 288


async def test_irregular_series_uses_deltas() -> None:
    text = encode_series(Readings(array("q", [10, 20, 40, 41]), array("d", [1.004, 2, 3, 4.5])))
    series = json.loads(text)
    assert series == {"count": 4, "t0": 10, "dt": [10, 20, 1], "values": [1.0, 2.0, 3.0, 4.5]}
    assert decode_series(series) == [(10, 1.0), (20, 2.0), (40, 3.0), (41, 4.5)]
    empty = json.loads(encode_series(Readings()))
    assert empty == {"count": 0, "t0": None, "step": None, "values": []}
    assert decode_series(empty) == []
    single = json.loads(encode_series(Readings(array("q", [5]), array("d", [-0.126]))))
    assert single == {"count": 1, "t0": 5, "step": 0, "values": [-0.13]}


async def test_latest_and_status(store: SensorStore) -> None:
    executor = make_executor(store, stats=lambda: {"reader": "simulated", "reader_faults": 2})
    latest = await run(executor, op="latest", sensor="temperature")
    assert latest["sensor"] == "temperature" and latest["ts"] == iso(NOW - 300)
    assert latest["value"] == SimulatedReader(seed=1).value("temperature", NOW - 300)
    status = await run(executor, op="status")
    assert status["sensors"] == ["humidity", "temperature"]
    assert status["rows"] == 2 * 60 * 288 and status["reader_faults"] == 2
    assert status["retention_days"] == 90 and status["horizon"] == iso(NOW - 90 * DAY)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"op": "range", "sensor": "temperature", "start": NOW, "end": NOW - 1}, "^end: must be"),
        ({"op": "range", "sensor": "temperature", "start": NOW, "end": NOW}, "^end: must be"),
        ({"op": "scan"}, "^op: unknown 'scan'; expected one of latest, range, status"),
        ({"sensor": "temperature"}, "^op: missing"),
        ({"op": "latest"}, "^sensor: missing"),
        ({"op": "range", "start": NOW - 10, "end": NOW}, "^sensor: missing"),
        ({"op": "range", "sensor": "temperature", "end": NOW}, "^start: missing"),
        ({"op": "range", "sensor": "temperature", "start": NOW - 10}, "^end: missing"),
        ({"op": "range", "sensors": [], "start": 0, "end": 1}, "^sensors: must be a non-empty"),
        ({"op": "range", "sensors": ["a"], "sensor": "a"}, "^sensors: give either"),
        ({"op": "latest", "sensor": 7}, "^sensor: must be a sensor name"),
        (
            {"op": "range", "sensor": "temperature", "start": "yesterday", "end": NOW},
            "^start: not an ISO 8601 timestamp: 'yesterday'",
        ),
        (
            {"op": "range", "sensor": "temperature", "start": NOW - 10, "end": True},
            "^end: must be an ISO 8601",
        ),
        (
            {"op": "range", "sensor": "temperature", "start": "2025-01-01T00:00:00Z", "end": NOW},
            r"^start: 2025-01-01T00:00:00Z is before the retention horizon "
            r"2025-10-17T00:00:00Z \(90 days are kept\)",
        ),
        (
            {"op": "range", "sensor": "pressure", "start": NOW - 10, "end": NOW},
            "^sensor: unknown sensor 'pressure'; known: humidity, temperature",
        ),
        ({"op": "latest", "sensor": "pressure"}, "^sensor: unknown sensor 'pressure'"),
    ],
)
async def test_bad_parameters_name_the_field(
    store: SensorStore, payload: dict[str, Any], match: str
) -> None:
    with pytest.raises(ExecutorError, match=match):
        await run(make_executor(store), **payload)


@pytest.mark.parametrize(("payload", "match"), [(b"{oops", "invalid JSON"), (b"[1]", "object")])
async def test_malformed_payloads(store: SensorStore, payload: bytes, match: str) -> None:
    with pytest.raises(ExecutorError, match=match):
        await make_executor(store).execute(payload)


async def test_row_limit_names_the_range(store: SensorStore) -> None:
    executor = make_executor(store, max_rows=100)
    with pytest.raises(ExecutorError, match="more than 100 readings of 'temperature'"):
        await run(executor, op="range", sensor="temperature", start=NOW - DAY, end=NOW)


async def test_reads_run_off_the_event_loop(store: SensorStore) -> None:
    """While a 60-day read runs, the loop keeps ticking."""
    executor = make_executor(store)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    payload = {"op": "range", "sensors": ["temperature", "humidity"], "start": NOW - 59 * DAY}
    task = asyncio.create_task(ticker())
    try:
        for _ in range(3):
            await run(executor, end=NOW, **payload)
    finally:
        task.cancel()
    assert ticks > 10


async def test_profile_pads_the_query_to_the_drawn_service_time(store: SensorStore) -> None:
    profile = fit_profile("test", 40.0, 60.0, 70.0, floor_ratio=0.5)
    executor = make_executor(store, profile=profile, seed=5)
    durations = []
    for _ in range(5):
        t0 = time.perf_counter()
        await run(executor, op="latest", sensor="humidity")
        durations.append(time.perf_counter() - t0)
    # Only the lower bound: padding guarantees it, while an upper bound on wall-clock time
    # fails whenever a loaded machine runs the event loop late.
    assert min(durations) >= profile.quantile_ms(0.0) / 1000 * 0.95


def test_parse_time_forms() -> None:
    assert parse_time("2026-01-01T00:00:00Z", "start") == 1_767_225_600
    assert parse_time("2026-01-01T01:00:00+01:00", "start") == 1_767_225_600
    assert parse_time(12.5, "end") == 12.5
    for bad in (float("inf"), float("nan"), 1e300, -1e300):
        # Beyond the span of ISO timestamps: a store keys readings by int64 (the fuzzer
        # found 1e300 reaching SQLite as an OverflowError).
        with pytest.raises(ExecutorError, match=r"^end: must be unix seconds within years"):
            parse_time(bad, "end")
    with pytest.raises(ExecutorError, match=r"^start: must be an ISO 8601 timestamp, got None"):
        parse_time(None, "start")


def _week_payload(**kw: Any) -> dict[str, Any]:
    return {"op": "range", "sensor": "temperature", "start": NOW - 8 * DAY, "end": NOW - DAY} | kw


async def test_unsampled_range_tasks_sleep_the_scaled_draw_and_answer_without_readings(
    store: SensorStore,
) -> None:
    profile = fit_profile("test", 40.0, 60.0, 70.0, floor_ratio=0.5)
    executor = make_executor(store, profile=profile, seed=5, read_sample=0.0, time_scale=2.0)
    t0 = time.perf_counter()
    result = await run(executor, **_week_payload())
    elapsed = time.perf_counter() - t0
    assert result == {
        "agent": "pi-7",
        "op": "range",
        "start": iso(NOW - 8 * DAY),
        "end": iso(NOW - DAY),
        "emulated": True,
    }
    # The draw, doubled: a lower bound only (a loaded machine runs the loop late).
    assert elapsed >= 2 * profile.quantile_ms(0.0) / 1000 * 0.95
    # Parameters are still checked as for a real read.
    with pytest.raises(ExecutorError, match="sensor: unknown sensor 'pressure'"):
        await run(executor, **_week_payload(sensor="pressure"))
    with pytest.raises(ExecutorError, match="end: must be after start"):
        await run(executor, **_week_payload(end=NOW - 9 * DAY))
    status = await run(executor, op="status")
    assert (status["real_reads"], status["emulated_reads"]) == (0, 1)


async def test_a_sample_of_range_tasks_reads_the_store(store: SensorStore) -> None:
    profile = fit_profile("fast", 0.2, 0.4, 0.5, floor_ratio=0.5)  # sub-ms draws: a quick test
    executor = make_executor(store, profile=profile, seed=3, read_sample=0.25)
    results = [await run(executor, **_week_payload()) for _ in range(80)]
    real = [r for r in results if "series" in r]
    assert len(real) == executor.real_reads and executor.emulated_reads == 80 - len(real)
    assert 5 <= len(real) <= 40  # 20 expected
    assert all(r["series"]["temperature"]["count"] == 7 * 288 for r in real)
    # The share draws from a stream of its own: the profile's draws are those of the seed.
    reference = random.Random(3)
    for _ in range(80):
        reference.random()
    assert executor._rng.random() == reference.random()


def test_sampling_and_scaling_need_a_profile(store: SensorStore) -> None:
    with pytest.raises(ValueError, match="read_sample and time_scale need a profile"):
        make_executor(store, read_sample=0.5)
    with pytest.raises(ValueError, match="read_sample: must be in"):
        make_executor(store, profile=fit_profile("t", 40.0, 60.0, 70.0), read_sample=-0.1)
