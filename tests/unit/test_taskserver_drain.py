"""The task service's drain and ownership, with an in-memory connection and a fake clock."""

from __future__ import annotations

import asyncio
from typing import Any

from taskserver.executors import Executor
from taskserver.queues import create_task_queue
from taskserver.server import TaskService
from taskserver.wire import thrift


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _HeldExecutor(Executor):
    """Every task runs until the test releases it."""

    name = "held"

    def __init__(self) -> None:
        self.running: list[asyncio.Future[None]] = []

    async def execute(self, payload: bytes, *, budget_ms: float | None = None) -> bytes:
        fut = asyncio.get_running_loop().create_future()
        self.running.append(fut)
        await fut
        return b"{}"

    def release_one(self) -> None:
        """Finish the oldest task still running."""
        self.running = [f for f in self.running if not f.done()]
        self.running.pop(0).set_result(None)


class _Conn:
    """What the service sends back on one gateway's connection."""

    closed = False

    def __init__(self) -> None:
        self.results: list[Any] = []

    def send_item(self, item: Any) -> None:
        self.results.append(item)

    def close(self) -> None:
        self.closed = True


def _service(slots: int = 1) -> tuple[TaskService, _HeldExecutor, _Clock]:
    clock = _Clock()
    ex = _HeldExecutor()
    return TaskService("ts", create_task_queue("fifo"), ex, slots=slots, clock=clock), ex, clock


def _task(qid: str) -> Any:
    return thrift().Task(qid, 0, 10_000.0, 10_000.0, 0, "A", b"{}")


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _fates(conn: _Conn) -> dict[str, tuple[int, str | None]]:
    return {r.query_id: (r.status, r.error) for r in conn.results}


async def test_a_drain_serves_what_it_holds_and_refuses_new_tasks() -> None:
    svc, ex, _ = _service()
    conn = _Conn()
    for q in ("q1", "q2", "q3"):
        svc.submit(conn, _task(q))  # type: ignore[arg-type]
    await _settle()
    drain = asyncio.create_task(svc.drain(timeout_s=60.0))
    await _settle()
    assert svc.status().draining
    svc.submit(conn, _task("late"))  # type: ignore[arg-type]
    assert _fates(conn)["late"] == (3, "server is draining")
    for _ in range(3):
        ex.release_one()
        await _settle()
    assert await drain == (3, 0)  # all served, none given up; it did not wait out 60 s
    assert {q: f[0] for q, f in _fates(conn).items()} == {"late": 3, "q1": 0, "q2": 0, "q3": 0}


async def test_at_the_drain_timeout_every_task_left_goes_back_rejected() -> None:
    svc, _, _ = _service()
    conn = _Conn()
    for q in ("q1", "q2", "q3"):
        svc.submit(conn, _task(q))  # type: ignore[arg-type]
    await _settle()
    assert await svc.drain(timeout_s=0.0) == (0, 3)
    fates = _fates(conn)
    assert {q: f[0] for q, f in fates.items()} == {"q1": 3, "q2": 3, "q3": 3}
    assert all("draining" in str(err) for _, err in fates.values())
    assert svc.busy == 0 and len(svc.queue) == 0


def _claim(gateway_id: str, lease_ms: float = 3000.0) -> Any:
    return thrift().OwnerClaim(gateway_id, lease_ms)


async def test_one_owner_at_a_time_takes_tasks_and_a_closed_owner_frees_the_server() -> None:
    svc, ex, clock = _service(slots=4)
    a, b, stranger = _Conn(), _Conn(), _Conn()
    assert svc.status(a, _claim("gw-a")).owner == "gw-a"  # type: ignore[arg-type]
    st = svc.status(b, _claim("gw-b"))  # type: ignore[arg-type]
    assert (st.owner, st.owner_lease_ms) == ("gw-a", 3000.0)
    svc.submit(a, _task("qa"))  # type: ignore[arg-type]
    svc.submit(b, _task("qb"))  # type: ignore[arg-type]
    svc.submit(stranger, _task("qs"))  # type: ignore[arg-type]  (never claimed)
    await _settle()
    assert svc.busy == 1 and a.results == []
    for conn in (b, stranger):
        [r] = conn.results
        assert r.status == 3 and "owned by gateway gw-a" in r.error
    # The owner misses its renewals: at the lease's end the other one takes over.
    clock.t = 3.0
    assert svc.status(b, _claim("gw-b")).owner == "gw-b"  # type: ignore[arg-type]
    assert svc.status(a, _claim("gw-a")).owner == "gw-b"  # type: ignore[arg-type]
    ex.release_one()
    await _settle()
    assert _fates(a) == {"qa": (0, None)}  # a task taken before the handover still finishes


async def test_the_owners_closed_connection_releases_the_lease_at_once() -> None:
    svc, _, _ = _service()
    conn_a = svc.protocol_factory()
    conn_b = _Conn()
    svc.status(conn_a, _claim("gw-a"))
    assert svc.status(conn_b, _claim("gw-b")).owner == "gw-a"  # type: ignore[arg-type]
    conn_a.connection_lost(None)
    assert svc.status(conn_b, _claim("gw-b")).owner == "gw-b"  # type: ignore[arg-type]
    assert svc.status().owner_lease_ms == 3000.0


async def test_a_closed_connections_tasks_are_stopped_and_others_go_on() -> None:
    svc, ex, _ = _service()
    gone = svc.protocol_factory()
    other = _Conn()
    svc.submit(gone, _task("g1"))  # runs
    svc.submit(gone, _task("g2"))  # queued
    svc.submit(other, _task("o1"))  # type: ignore[arg-type]  (queued)
    await _settle()
    assert (svc.busy, len(svc.queue)) == (1, 2)
    gone.connection_lost(None)  # nobody is waiting for g1 and g2 any more
    await _settle()
    assert (svc.busy, len(svc.queue)) == (1, 0)  # o1 runs now
    ex.release_one()
    await _settle()
    assert _fates(other) == {"o1": (0, None)}
