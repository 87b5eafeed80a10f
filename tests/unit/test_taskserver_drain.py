"""The task service's drain, ownership and slot watchdog, with an in-memory connection and a
fake clock."""

from __future__ import annotations

import asyncio
from typing import Any

from taskserver.abc import InvalidTask
from taskserver.executors import Executor
from taskserver.ownership import claim_proof
from taskserver.queues import create_task_queue
from taskserver.server import TaskService, slot_limit_s
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
    peer = "127.0.0.1:1"

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
        assert r.status == 3 and "owned by another gateway" in r.error and "gw-a" not in r.error
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


TOKEN = "s3cret-token"


def _proved(conn: Any, svc: TaskService, gateway_id: str, lease_ms: float = 3000.0) -> Any:
    """A claim that proves TOKEN on `conn` (whose nonce comes from a first status call)."""
    nonce = svc.status(conn).claim_nonce
    return thrift().OwnerClaim(
        gateway_id, lease_ms, claim_proof(TOKEN, nonce, gateway_id, lease_ms)
    )


async def test_a_claim_without_the_token_is_refused_and_learns_nothing() -> None:
    clock = _Clock()
    svc = TaskService("ts", create_task_queue("fifo"), _HeldExecutor(), clock=clock, token=TOKEN)
    owner, intruder = _Conn(), _Conn()
    st = svc.status(owner, _proved(owner, svc, "gw-a"))  # type: ignore[arg-type]
    assert (st.owner, st.claim_error) == ("gw-a", None)
    # No proof, a wrong one, and the owner's own proof replayed on another connection.
    wrong = thrift().OwnerClaim("intruder", 60_000.0, claim_proof("guess", b"x" * 16, "i", 1.0))
    replay = _proved(owner, svc, "intruder", 60_000.0)
    for claim in (_claim("intruder", 60_000.0), wrong, replay):
        st = svc.status(intruder, claim)  # type: ignore[arg-type]
        assert st.claim_error == "claim refused: it does not prove this server's registration token"
        assert (st.owner, st.owner_lease_ms) == (None, None)  # not even who owns it
    svc.submit(intruder, _task("qi"))  # type: ignore[arg-type]
    [r] = intruder.results
    assert r.status == 3 and "gw-a" not in r.error
    # A plain status on an unproved connection does not name the owner either.
    assert svc.status(_Conn()).owner is None  # type: ignore[arg-type]


async def test_an_intruder_cannot_take_a_server_of_a_pool_nobody_claims() -> None:
    svc = TaskService("ts", create_task_queue("fifo"), _HeldExecutor(), clock=_Clock(), token=TOKEN)
    gateway, intruder = _Conn(), _Conn()
    assert svc.status(intruder, _claim("intruder", 60_000.0)).claim_error  # type: ignore[arg-type]
    svc.submit(gateway, _task("q1"))  # type: ignore[arg-type]  (server queueing: no claim)
    await _settle()
    assert svc.busy == 1 and gateway.results == []


async def test_a_proved_claim_from_a_second_gateway_waits_for_the_lease() -> None:
    svc = TaskService("ts", create_task_queue("fifo"), _HeldExecutor(), clock=_Clock(), token=TOKEN)
    a, b = _Conn(), _Conn()
    svc.status(a, _proved(a, svc, "gw-a"))  # type: ignore[arg-type]
    st = svc.status(b, _proved(b, svc, "gw-b"))  # type: ignore[arg-type]
    # Both prove the token: the standby may know who holds the lease.
    assert (st.owner, st.claim_error) == (
        "gw-a",
        "claim refused: another gateway holds this server's lease",
    )


async def test_the_watchdog_reclaims_a_slot_held_past_the_budget_plus_grace() -> None:
    clock = _Clock()
    ex = _HeldExecutor()
    svc = TaskService(
        "ts", create_task_queue("fifo"), ex, clock=clock, task_grace_s=2.0, max_task_s=300.0
    )
    conn = _Conn()
    svc.submit(conn, thrift().Task("q1", 0, 50.0, 100.0, 0, "A", b"{}"))  # type: ignore[arg-type]
    svc.submit(conn, _task("q2"))  # type: ignore[arg-type]  (queued behind it)
    await _settle()
    assert (svc.busy, len(svc.queue)) == (1, 1)
    clock.t = 2.0999  # 100 ms of budget + 2 s of grace not yet over
    assert svc.reclaim_overdue(clock.t) == 0
    clock.t = 2.1
    assert svc.reclaim_overdue(clock.t) == 1
    await _settle()
    [r] = conn.results
    assert (r.query_id, r.status) == ("q1", 1) and "slot was reclaimed" in r.error
    assert svc.busy == 1 and len(svc.queue) == 0  # q2 took the slot back
    assert svc.reclaimed == 1
    ex.release_one()  # q1's executor never returns; q2's does
    await _settle()
    assert [x.query_id for x in conn.results] == ["q1", "q2"] and svc.busy == 0


async def test_no_budget_holds_a_slot_longer_than_max_task_s() -> None:
    clock = _Clock()
    svc = TaskService(
        "ts", create_task_queue("fifo"), _HeldExecutor(), clock=clock, max_task_s=300.0
    )
    conn = _Conn()
    svc.submit(conn, thrift().Task("q", 0, 1e8, 1e8, 0, "A", b"{}"))  # type: ignore[arg-type]
    await _settle()
    assert svc.reclaim_overdue(299.9) == 0 and svc.reclaim_overdue(300.0) == 1


def test_a_tasks_slot_limit_is_its_budget_left_plus_grace_capped() -> None:
    assert slot_limit_s(10.0, 100.0, 2.0, 300.0) == 12.1
    assert slot_limit_s(10.0, -500.0, 2.0, 300.0) == 11.5  # late: what is left of the grace
    assert slot_limit_s(10.0, 1e9, 2.0, 300.0) == 310.0


async def test_a_task_dequeued_past_its_slo_plus_grace_fails_without_running() -> None:
    clock = _Clock()
    ex = _HeldExecutor()
    svc = TaskService("ts", create_task_queue("fifo"), ex, clock=clock, task_grace_s=2.0)
    conn = _Conn()
    svc.submit(conn, _task("q1"))  # type: ignore[arg-type]  (holds the slot)
    svc.submit(conn, thrift().Task("q2", 0, 50.0, 100.0, 0, "A", b"{}"))  # type: ignore[arg-type]
    svc.submit(conn, _task("q3"))  # type: ignore[arg-type]
    await _settle()
    clock.t = 2.1  # q2's SLO (100 ms) plus the grace (2 s) is over while it waits
    ex.release_one()
    await _settle()
    fates = _fates(conn)
    assert fates["q1"] == (0, None)
    assert fates["q2"][0] == 1 and fates["q2"][1].startswith("expired in the queue")
    assert "q3" not in fates and svc.busy == 1  # q3 runs in the slot q2 never took


async def test_a_task_cancelled_before_its_runner_starts_frees_its_slot() -> None:
    # The slot leak the fuzzer found: a cancel in the same tick as the submit cancels the
    # runner before its first step, so its `finally` never ran and the slot stayed busy.
    svc, _, _ = _service()
    conn = _Conn()
    svc.submit(conn, _task("q1"))  # type: ignore[arg-type]
    svc.submit(conn, _task("q2"))  # type: ignore[arg-type]  (queued)
    svc.cancel("q1")
    await _settle()
    assert _fates(conn) == {"q1": (2, "cancelled")}
    assert (svc.busy, len(svc.queue)) == (1, 0)  # q2 runs in the freed slot
    svc.cancel("q2")
    await _settle()
    assert (svc.busy, len(svc.queue)) == (0, 0)


async def test_a_connection_lost_before_its_runner_starts_frees_its_slot() -> None:
    svc, _, _ = _service()
    conn = svc.protocol_factory()
    svc.submit(conn, _task("q1"))
    conn.connection_lost(None)
    await _settle()
    assert (svc.busy, len(svc.queue)) == (0, 0)


async def test_giving_up_before_runners_start_leaves_no_slot_busy() -> None:
    svc, _, _ = _service(slots=2)
    conn = _Conn()
    svc.submit(conn, _task("q1"))  # type: ignore[arg-type]
    svc.submit(conn, _task("q2"))  # type: ignore[arg-type]
    assert await svc.drain(timeout_s=0.0) == (0, 2)
    assert svc.busy == 0
    assert {q: f[0] for q, f in _fates(conn).items()} == {"q1": 3, "q2": 3}


class _InstantExecutor(Executor):
    """Answers without waiting (an instant emulated service, a cached result)."""

    name = "instant"

    async def execute(self, payload: bytes, *, budget_ms: float | None = None) -> bytes:
        return b'{"instant": true}'


async def test_an_instant_executor_finishes_in_the_pump_without_a_runner_task() -> None:
    # TaskService._start runs an executor up to its first wait at once: one that never
    # waits is done before submit returns, with no asyncio task per execution.
    svc = TaskService("ts", create_task_queue("fifo"), _InstantExecutor(), slots=1, clock=_Clock())
    conn = _Conn()
    for q in ("q1", "q2", "q3"):
        svc.submit(conn, _task(q))  # type: ignore[arg-type]
    assert {q: f[0] for q, f in _fates(conn).items()} == {"q1": 0, "q2": 0, "q3": 0}
    assert [r.result for r in conn.results] == [b'{"instant": true}'] * 3
    assert (svc.busy, len(svc.queue), len(svc._running), svc.tasks_done) == (0, 0, 0, 3)


class _FailingExecutor(Executor):
    """Refuses a payload at once, or after waiting once (as one reading a thread's answer)."""

    name = "failing"

    async def execute(self, payload: bytes, *, budget_ms: float | None = None) -> bytes:
        if payload == b"later":
            await asyncio.sleep(0)
        raise InvalidTask("sensor", "unknown sensor 'x'")


async def test_an_executor_failing_at_once_or_after_a_wait_fails_its_task_alike() -> None:
    svc = TaskService("ts", create_task_queue("fifo"), _FailingExecutor(), slots=2, clock=_Clock())
    conn = _Conn()
    now, later = _task("now"), _task("later")
    now.payload, later.payload = b"at once", b"later"
    svc.submit(conn, now)  # type: ignore[arg-type]
    svc.submit(conn, later)  # type: ignore[arg-type]
    assert list(_fates(conn)) == ["now"]  # the other one waits in its runner
    await _settle()
    fates = _fates(conn)
    assert (
        fates["now"]
        == fates["later"]
        == (1, InvalidTask("sensor", "unknown sensor 'x'").wire_error())
    )
    assert svc.busy == 0


class _WatchedExecutor(_HeldExecutor):
    """A held executor that notes the cancellations it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = 0

    async def execute(self, payload: bytes, *, budget_ms: float | None = None) -> bytes:
        try:
            return await super().execute(payload, budget_ms=budget_ms)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def test_a_runner_cancelled_before_its_first_step_cancels_its_executor_too() -> None:
    # The executor took its first step at once and waits on a future; its runner has not
    # run yet when the query is cancelled: the executor sees the cancellation and the future
    # it waits on is cancelled (a thread's result is dropped, not left unread).
    ex = _WatchedExecutor()
    svc = TaskService("ts", create_task_queue("fifo"), ex, slots=1, clock=_Clock())
    conn = _Conn()
    svc.submit(conn, _task("q1"))  # type: ignore[arg-type]
    [waited] = ex.running
    svc.cancel("q1")
    assert waited.cancelled() and ex.cancelled == 1
    await _settle()
    assert _fates(conn) == {"q1": (2, "cancelled")}
    assert (svc.busy, len(svc._running)) == (0, 0)


async def test_a_runner_cancelled_while_its_executor_waits_cancels_it_through_the_runner() -> None:
    ex = _WatchedExecutor()
    svc = TaskService("ts", create_task_queue("fifo"), ex, slots=1, clock=_Clock())
    conn = _Conn()
    svc.submit(conn, _task("q1"))  # type: ignore[arg-type]
    await _settle()  # the runner goes on with the started executor and waits with it
    [waited] = ex.running
    svc.cancel("q1")
    await _settle()
    assert waited.cancelled() and ex.cancelled == 1
    assert _fates(conn) == {"q1": (2, "cancelled")}
    assert (svc.busy, len(svc._running)) == (0, 0)
