"""Heartbeats paced by traffic and quiet (`gateway.pacing`), on a real task server.

A task server runs in this event loop; the tests count the heartbeats (status calls) a
`ServerLink` makes: results stand in for heartbeats while they come, a quiet server is
asked at its quiet period, and given work it is back on heartbeat_s at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.links import ServerLink, TaskReport
from gateway.queries import PendingTask, QueryRun
from taskserver.config import ServiceSpec, TaskServerConfig
from taskserver.server import serve
from taskserver.wire import TaskStatus, ThriftConnection

pytestmark = pytest.mark.integration


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A task server in this loop, serving each task in `request.param` ms (0 unless the
    test is parametrized); its address."""
    service_ms = float(getattr(request, "param", 0.0))
    announced: asyncio.Queue[str] = asyncio.Queue()
    stop = asyncio.Event()
    service = ServiceSpec(kind="constant", value_ms=service_ms)
    config = TaskServerConfig(server_id="ts-p", port=0, slots=64, service=service)
    runner = asyncio.create_task(serve(config, ready=announced.put_nowait, stop=stop))
    address = json.loads(await asyncio.wait_for(announced.get(), 10))["address"]
    yield address
    stop.set()
    await asyncio.wait_for(runner, 10)


@pytest.fixture
def status_calls(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The loop time of every status call a link makes."""
    calls: list[float] = []
    real = ThriftConnection.call

    async def counted(self: ThriftConnection, name: str, args: Any, timeout_s: float) -> Any:
        if name == "status":
            calls.append(asyncio.get_running_loop().time())
        return await real(self, name, args, timeout_s)

    monkeypatch.setattr(ThriftConnection, "call", counted)
    return calls


def _link(address: str, **kw: Any) -> tuple[ServerLink, list[TaskReport]]:
    """A link to the server, and the reports of the results it gets."""
    host, port = address.rsplit(":", 1)
    reports: list[TaskReport] = []
    link = ServerLink(
        "ts-p", host, int(port), pool="default",
        on_result=lambda lk, p, r, now: reports.append(r),
        on_failure=lambda *a: None, **kw,
    )  # fmt: skip
    return link, reports


def _task(i: int) -> PendingTask:
    """A task due in 10 s (the link's clock: perf_counter)."""
    now = time.perf_counter()
    return PendingTask(QueryRun(f"q-{i}", 1, now), 0, "ts-p", now + 10.0, now + 10.0, 0, "B", b"{}")


async def test_a_quiet_server_is_asked_at_its_quiet_period_and_its_result_stands_in(
    server: str, status_calls: list[float]
) -> None:
    link, reports = _link(
        server, heartbeat_s=0.05, heartbeat_timeout_s=1.0, quiet_period=lambda: 0.6
    )
    link.start()
    try:
        assert await link.wait_up(5)
        await asyncio.sleep(0.5)
        # At heartbeat_s it would have asked ~10 times; quiet, once more at most.
        assert len(status_calls) <= 2
        before = len(status_calls)
        link.dispatch(_task(1))
        await asyncio.sleep(0.03)  # less than heartbeat_s: the result is all it takes
        assert [r.status for r in reports] == [TaskStatus.OK]
        assert len(status_calls) == before
        assert link.is_up
    finally:
        await link.close()


@pytest.mark.parametrize("server", [400.0], indirect=True)
async def test_a_quiet_server_given_work_is_back_on_heartbeat_s_until_its_result(
    server: str, status_calls: list[float]
) -> None:
    link, reports = _link(
        server, heartbeat_s=0.05, heartbeat_timeout_s=1.0, quiet_period=lambda: 5.0
    )
    link.start()
    try:
        assert await link.wait_up(5)
        await asyncio.sleep(0.2)
        before = len(status_calls)
        given = asyncio.get_running_loop().time()
        link.dispatch(_task(1))  # served in 400 ms: no result to stand in meanwhile
        await asyncio.sleep(0.3)
        assert reports == []
        asked = status_calls[before:]
        # Not after the 5 s quiet period: every ~50 ms, as for any server with work.
        assert len(asked) >= 2 and asked[0] - given < 0.2
        await asyncio.sleep(0.3)
        assert [r.status for r in reports] == [TaskStatus.OK]
        assert link.is_up
    finally:
        await link.close()


async def test_results_stand_in_for_heartbeats_while_they_come(
    server: str, status_calls: list[float]
) -> None:
    link, reports = _link(server, heartbeat_s=0.2, heartbeat_timeout_s=1.0)
    link.start()
    try:
        assert await link.wait_up(5)
        first = len(status_calls)
        for i in range(40):  # a result every 25 ms for a second
            link.dispatch(_task(i))
            await asyncio.sleep(0.025)
        assert sum(r.status is TaskStatus.OK for r in reports) >= 35
        assert len(status_calls) - first <= 1  # at heartbeat_s it would have asked ~5 times
        await asyncio.sleep(1.2)  # quiet again: heartbeats resume at heartbeat_s (~5)
        assert len(status_calls) - first >= 2
        assert link.is_up
    finally:
        await link.close()
