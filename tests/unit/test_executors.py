"""The emulated executor: service times, failures, spin mode and cancellation."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from taskserver.executors import EmulatedExecutor, Executor, ExecutorError
from taskserver.service_time import ConstantServiceTime, ExponentialServiceTime


def make_executor(*, mode: str = "sleep", value_ms: float = 0.0, server_id: str = "s1"):
    return EmulatedExecutor(ConstantServiceTime(value_ms), mode=mode, seed=1, server_id=server_id)


def request(**fields) -> bytes:
    return json.dumps(fields).encode()


async def test_explicit_service_ms_is_slept_and_reported():
    executor = make_executor()
    start = time.perf_counter()
    result = json.loads(await executor.execute(request(service_ms=5, echo={"k": [1, 2]})))
    elapsed = time.perf_counter() - start
    assert 0.005 <= elapsed < 1.0
    assert result == {"server": "s1", "service_ms": 5.0, "echo": {"k": [1, 2]}}


async def test_sub_millisecond_service_time_is_not_cut_short():
    executor = make_executor()
    start = time.perf_counter()
    await executor.execute(request(service_ms=0.3))
    assert 0.0003 <= time.perf_counter() - start < 1.0


@pytest.mark.parametrize("payload", [b"", b"{}"])
async def test_empty_payload_draws_from_the_distribution_and_omits_echo(payload):
    executor = make_executor(value_ms=1.5)
    start = time.perf_counter()
    result = json.loads(await executor.execute(payload))
    assert 0.0015 <= time.perf_counter() - start < 1.0
    assert result == {"server": "s1", "service_ms": 1.5}


async def test_drawn_service_times_are_seeded():
    def executor():
        return EmulatedExecutor(ExponentialServiceTime(0.01), seed=42)

    a, b = executor(), executor()
    first = [json.loads(await a.execute(b""))["service_ms"] for _ in range(3)]
    second = [json.loads(await b.execute(b""))["service_ms"] for _ in range(3)]
    assert first == second
    assert len(set(first)) == 3


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"{not json", "payload: invalid JSON"),
        (b"\xff\xfe", "payload: invalid JSON"),
        (b"[1, 2]", "payload: must be a JSON object, got list"),
        (request(service_ms=-1), "payload: service_ms must be a number >= 0, got -1"),
        (request(service_ms="5"), "payload: service_ms must be a number >= 0"),
        (request(service_ms=True), "payload: service_ms must be a number >= 0"),
        (request(fail=3), "payload: fail must be a string"),
    ],
)
async def test_bad_payload_raises_executor_error_naming_payload(payload, match):
    with pytest.raises(ExecutorError, match=match):
        await make_executor().execute(payload)


async def test_fail_raises_executor_error_with_the_message():
    with pytest.raises(ExecutorError, match=r"^disk on fire$"):
        await make_executor().execute(request(fail="disk on fire", service_ms=0))


async def test_spin_mode_burns_the_service_time_and_returns():
    executor = make_executor(mode="spin")
    start = time.perf_counter()
    result = json.loads(await executor.execute(request(service_ms=2)))
    assert 0.002 <= time.perf_counter() - start < 1.0
    assert result["service_ms"] == 2.0


@pytest.mark.parametrize("mode", ["sleep", "spin"])
async def test_cancellation_of_a_long_task_completes_quickly(mode):
    task = asyncio.create_task(make_executor(mode=mode).execute(request(service_ms=60_000)))
    await asyncio.sleep(0.01)
    start = time.perf_counter()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.perf_counter() - start < 0.5


async def test_bad_mode_is_rejected():
    with pytest.raises(ValueError, match="mode"):
        EmulatedExecutor(ConstantServiceTime(1.0), mode="nap")  # type: ignore[arg-type]


async def test_executor_close_is_a_no_op_by_default():
    executor: Executor = make_executor()
    assert executor.name == "emulated"
    await executor.close()


async def test_service_ms_on_gives_each_server_its_own_time():
    payload = json.dumps({"service_ms_on": {"ts-1": 2.0, "ts-2": 0.5}}).encode()
    a = await make_executor(server_id="ts-1").execute(payload)
    b = await make_executor(server_id="ts-2").execute(payload)
    assert json.loads(a)["service_ms"] == 2.0 and json.loads(b)["service_ms"] == 0.5
    with pytest.raises(ExecutorError, match="service_ms_on must map this server \\('ts-3'\\)"):
        await make_executor(server_id="ts-3").execute(payload)
    bad = json.dumps({"service_ms_on": {"ts-1": -1}}).encode()
    with pytest.raises(ExecutorError, match="service_ms must be a number >= 0, got -1"):
        await make_executor(server_id="ts-1").execute(bad)


def test_a_payload_repeated_in_a_process_is_parsed_once_and_errors_still_raise():
    from taskserver.executors import _parse_payload

    payload = json.dumps({"service_ms_on": {"ts-1": 2.0, "ts-2": 0.5}}).encode()
    first = _parse_payload(payload)
    assert _parse_payload(bytearray(payload)) is first  # the same bytes: the same request
    other = json.dumps({"service_ms_on": {"ts-1": 1.0}}).encode()
    assert _parse_payload(other) == {"service_ms_on": {"ts-1": 1.0}}
    with pytest.raises(ExecutorError, match="must be a JSON object"):
        _parse_payload(b"[1]")
    with pytest.raises(ExecutorError, match="payload"):
        _parse_payload(b"{bad")
    assert _parse_payload(other) is not first


def test_sleeps_end_early_only_on_loops_that_round_timeouts_to_milliseconds():
    import asyncio
    import selectors

    from taskserver.executors import timer_margin_s

    select_loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    epoll_loop = asyncio.SelectorEventLoop(selectors.EpollSelector())
    try:
        assert timer_margin_s(select_loop) == 0.0
        assert timer_margin_s(epoll_loop) == 0.001
    finally:
        select_loop.close()
        epoll_loop.close()
