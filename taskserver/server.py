"""The task server: a thin asyncio shell around a policy queue and an executor.

Tasks arrive as oneway ``submit`` messages carrying their remaining budgets;
the server turns a budget into a local deadline on receipt (hosts share no
clock), queues the task by policy, serves ``slots`` tasks at once and sends
each result back on the connection the task came from, with durations only.
Told to stop, it drains (taskserver.lifecycle): every task it took gets an
outcome. A gateway that holds this server's queue claims it on its heartbeat
(taskserver.ownership), and tasks from any other gateway are then refused. Each gateway's
heartbeat may carry its local request rate; the reply lists every rate heard, so gateway
replicas agree on the global rate (taskserver.frontends, Swayam §4.2).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from taskserver.abc import InvalidTask
from taskserver.config import BUSY_PREFIX, TaskServerConfig
from taskserver.executors import EmulatedExecutor, Executor, ExecutorError, TaskDropped
from taskserver.exposition import Reply, Route, start_http
from taskserver.framecheck import IMPLEMENTATION as FRAMECHECK
from taskserver.frontends import FRONTEND_HORIZON_S, FrontendRates, load_problem
from taskserver.lifecycle import drain_and_leave, register_forever, retire_when_idle
from taskserver.messages import claim_problem, task_identity_problem, task_problem
from taskserver.ownership import NONCE_BYTES, OwnerLease, proof_matches
from taskserver.queues import Dequeued, QueuedTask, QueueFull, TaskQueue, create_task_queue
from taskserver.registration import gateway_urls
from taskserver.service_time import make_distribution
from taskserver.tls import HANDSHAKE_TIMEOUT_S, http_client_tls, link_server_tls
from taskserver.tracing import TaskSpans, Tracing, open_tracing
from taskserver.wire import (
    CALL,
    DEFAULT_LIMITS,
    INVALID_MESSAGE_TYPE,
    ONEWAY,
    Batcher,
    ConnectionClosed,
    ProtocolViolation,
    TaskStatus,
    ThriftConnection,
    WireLimits,
    server_body_types,
    status_names,
    thrift,
)

if TYPE_CHECKING:  # prometheus_client only loads when metrics are served
    from prometheus_client import CollectorRegistry

    from taskserver.metrics import TaskServerMetrics

log = logging.getLogger(__name__)

WATCH_PERIOD_S = 0.25
"""How often running tasks are checked against their budgets (the watchdog's period)."""
_ONEWAY_METHODS = frozenset(("submit", "submit_batch", "cancel"))
_OWNED_ELSEWHERE = "server is owned by another gateway (central queueing)"


@dataclass(slots=True)
class _Inbound:
    """What the shell keeps with a queued task: the wire task and its way back."""

    task: Any
    conn: ThriftConnection
    received_s: float
    limit_s: float = 0.0
    """When it runs: by this clock time it has given its slot back (the watchdog)."""
    reclaimed: bool = False
    """The watchdog took its slot back and reported it; its runner's end is moot."""
    started: bool = False
    """Its runner has taken its first step (a runner cancelled before that never runs)."""
    suspended: tuple[Coroutine[Any, Any, bytes], Any] | None = None
    """Its executor's coroutine, which took its first step at once (`_start`), and what it
    waits on, until its runner goes on with it (None then, or when there is none)."""


def slot_limit_s(now: float, slo_budget_ms: float, grace_s: float, max_task_s: float) -> float:
    """By when a task dequeued at `now` with slo_budget_ms of its SLO left (negative: late)
    gives its slot back: at its SLO plus the grace, and never more than max_task_s on."""
    return now + min(slo_budget_ms / 1000.0 + grace_s, max_task_s)


class _Resumed:
    """Awaits a coroutine that has already taken its first step and is waiting on
    `waiting_on` (what that step yielded): `yield from` semantics from the second step on.
    What the awaiting task is sent or thrown goes on to the coroutine."""

    __slots__ = ("_coro", "_waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, bytes], waiting_on: Any) -> None:
        self._coro = coro
        self._waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, bytes]:
        coro, pending = self._coro, self._waiting_on
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation, or what the task was thrown
                try:
                    pending = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]


def _stop_suspended(inbound: _Inbound) -> None:
    """Cancel the executor coroutine of a task whose runner was cancelled before its first
    step (so never went on with it), as the runner's cancellation would have: the future it
    waits on is cancelled (a thread's result is then dropped, not left unread), and the
    cancellation is thrown in where it waits."""
    suspended, inbound.suspended = inbound.suspended, None
    if suspended is None:
        return
    coro, waiting_on = suspended
    if isinstance(waiting_on, asyncio.Future):
        waiting_on.cancel()
    try:
        coro.throw(asyncio.CancelledError())
    except (Exception, asyncio.CancelledError):  # StopIteration included
        return  # it ended (as a cancelled executor does)
    coro.close()  # it went on waiting regardless: stop it there


class _Throttled:
    """Logs a repeated warning once, then once per `every_s` with the count in between."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def warning(
        self, key: str, now: float, msg: str, *args: Any, extra: dict[str, Any] | None = None
    ) -> None:
        last = self._last.get(key)
        if last is not None and now - last < self.every_s:
            self._skipped[key] = self._skipped.get(key, 0) + 1
            return
        skipped = self._skipped.pop(key, 0)
        self._last[key] = now
        suffix = f" ({skipped} more like it since the last report)" if skipped else ""
        log.warning(msg + suffix, *args, extra=extra)


class TaskService:
    """Serves TaskServer calls: queue by policy, execute in slots, report results."""

    def __init__(
        self,
        server_id: str,
        queue: TaskQueue,
        executor: Executor,
        *,
        slots: int = 1,
        clock: Callable[[], float] = time.perf_counter,
        metrics: TaskServerMetrics | None = None,
        token: str | None = None,
        task_grace_s: float = 2.0,
        max_task_s: float = 300.0,
        limits: WireLimits = DEFAULT_LIMITS,
        frontend_horizon_s: float = FRONTEND_HORIZON_S,
        reject_when_busy: bool = False,
        spans: TaskSpans | None = None,
    ) -> None:
        self.server_id = server_id
        self.queue = queue
        self.executor = executor
        self.slots = slots
        self.clock = clock
        self.metrics = metrics
        self.token = token
        """The registration token an ownership claim must prove (None: claims are open)."""
        self.task_grace_s = task_grace_s
        self.max_task_s = max_task_s
        self.limits = limits
        self.reject_when_busy = reject_when_busy
        """Queue nothing: a task that finds every slot busy goes back REJECTED, BUSY_PREFIX."""
        self.spans = spans
        """Records traced tasks' queue wait and service as spans (None: tracing is off)."""
        self.reclaimed = 0
        """Slots the watchdog took back from tasks that ran past their budget."""
        self.violations = 0
        """Connections closed because the peer broke the protocol."""
        self._throttled = _Throttled()
        self._nonces: dict[ThriftConnection, bytes] = {}
        """Connection -> the nonce an ownership claim on it must sign."""
        self._watchdog: asyncio.Task[None] | None = None
        self.busy = 0
        self.tasks_done = 0
        self.draining = False
        self.last_activity = clock()
        """When the last task arrived or finished (for idle retirement)."""
        self._running: dict[asyncio.Task[None], _Inbound] = {}
        """Executing tasks -> what came with them (at most `slots` entries)."""
        self._conns: set[ThriftConnection] = set()
        self.lease = OwnerLease()
        """The gateway that owns this server's slots (central queueing), if any."""
        self._peers: dict[ThriftConnection, str] = {}
        """Connection -> the id of the gateway that claimed this server on it."""
        self.frontends = FrontendRates(frontend_horizon_s)
        """The gateways that reported their request rate with a heartbeat, and their rates."""
        self._reporters: dict[ThriftConnection, str] = {}
        """Connection -> the gateway id its last heartbeat reported a rate for."""
        self._stop_reason: str | None = None
        """Set when running tasks are given up (drain timeout, stop): their error."""
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._t = thrift()
        if metrics is not None:
            metrics.bind_gauges(lambda: len(self.queue), lambda: self.busy)

    # -- connections -------------------------------------------------------
    def protocol_factory(self) -> ThriftConnection:
        """A new connection whose messages this service handles."""
        types = server_body_types()
        conn: ThriftConnection

        def on_message(name: str, mtype: int, seqid: int, body: Any) -> None:
            self.handle(conn, name, mtype, seqid, body)

        def on_lost(_: Exception | None) -> None:
            self._conns.discard(conn)
            self._nonces.pop(conn, None)
            self._drop_tasks_of(conn)
            reporter = self._reporters.pop(conn, None)
            if reporter is not None and reporter not in self._reporters.values():
                self.frontends.forget(reporter)  # its last connection closed: it is gone
            gateway_id = self._peers.pop(conn, None)
            if gateway_id is not None and gateway_id not in self._peers.values():
                # The owner's last connection closed: a standby may take over at once.
                if self.lease.release(gateway_id):
                    log.info("server %s: owner gateway %s went away", self.server_id, gateway_id)

        conn = ThriftConnection(
            types,
            on_message,
            on_lost,
            batcher=Batcher.result(),
            limits=self.limits,
            on_violation=self._on_violation,
        )
        self._conns.add(conn)
        return conn

    def _on_violation(self, violation: ProtocolViolation, peer: str) -> None:
        """A peer broke the protocol and its connection was closed: count it, log it."""
        self.violations += 1
        if self.metrics is not None:
            self.metrics.wire_violation(violation.reason)
        self._throttled.warning(
            f"violation:{violation.reason}",
            self.clock(),
            "server %s: closed the connection from %s: %s",
            self.server_id,
            peer,
            violation,
        )

    def handle(self, conn: ThriftConnection, name: str, mtype: int, seqid: int, body: Any) -> None:
        """Dispatch one TaskServer call; ProtocolViolation for one that breaks the contract."""
        if name in _ONEWAY_METHODS:
            if mtype != ONEWAY:
                # No reply type exists for a oneway method: say so, and do not carry it out.
                conn.reply_error(
                    name,
                    seqid,
                    INVALID_MESSAGE_TYPE,
                    f"{name} is a oneway method: send it as a ONEWAY message",
                )
                return
            if name == "submit":
                self.submit(conn, body.task)
            elif name == "submit_batch":
                if type(body.tasks) is not list:
                    raise ProtocolViolation("bad_message", "submit_batch without its tasks")
                for task in body.tasks:
                    self.submit(conn, task)
            else:
                if type(body.query_id) is not str:
                    raise ProtocolViolation("bad_message", "cancel without a query_id string")
                self.cancel(body.query_id)
            return
        if mtype != CALL:
            raise ProtocolViolation("bad_message", f"{name} is a two-way call, sent as oneway")
        if name == "status":
            conn.reply(name, seqid, self.status(conn, body.claim, body.load))
        elif name == "ping":
            conn.reply(name, seqid, body.token if type(body.token) is str else "")
        elif name == "pipeline_state":
            conn.reply(name, seqid, self.executor.published_state())

    # -- the task path -------------------------------------------------------
    def submit(self, conn: ThriftConnection, task: Any) -> None:
        """Queue one task with its local deadlines; start it if a slot is free (with
        `reject_when_busy`, send it back REJECTED when none is)."""
        problem = task_identity_problem(task)
        if problem is not None:  # no result could name it: the peer is broken
            raise ProtocolViolation("bad_message", f"submit: {problem}")
        now = self.clock()
        self.last_activity = now
        if self.draining:
            self._send(
                conn, task, TaskStatus.REJECTED, now, now, 0.0, False, error="server is draining"
            )
            return
        if not self.lease.admits(self._peers.get(conn), now):
            self._send(
                conn, task, TaskStatus.REJECTED, now, now, 0.0, False, error=_OWNED_ELSEWHERE
            )
            return
        problem = task_problem(task)
        if problem is not None:
            self._send(
                conn, task, TaskStatus.REJECTED, now, now, 0.0, False, error=f"bad task: {problem}"
            )
            return
        if self.reject_when_busy and (self.busy >= self.slots or len(self.queue)):
            # Swayam §4.5 (RAND with retries): a busy backend sends the request back at once,
            # and the gateway tries another one; nothing waits here.
            error = f"{BUSY_PREFIX} all {self.slots} slot(s) of server {self.server_id} are in use"
            self._send(conn, task, TaskStatus.REJECTED, now, now, 0.0, False, error=error)
            return
        try:
            queued = QueuedTask(
                query_id=task.query_id,
                task_index=task.task_index,
                # Remaining budgets become local deadlines on receipt (TailGuard eq. (4) t_D).
                deadline_s=now + task.deadline_budget_ms / 1000.0,
                slo_deadline_s=now + task.slo_budget_ms / 1000.0,
                priority=task.priority,
                arrival_s=now,
                item=_Inbound(task, conn, now),
            )
            self.queue.push(queued)
        except QueueFull:
            self._send(conn, task, TaskStatus.REJECTED, now, now, 0.0, False, error="queue full")
            return
        self._pump()

    def _pump(self) -> None:
        while self.busy < self.slots:
            now = self.clock()
            dq = self.queue.pop(now)
            if dq is None:
                return
            inbound: _Inbound = dq.task.item
            # What is left of the query's end-to-end SLO (T-EDFQ's key) as the task starts.
            budget_ms = inbound.task.slo_budget_ms - (now - inbound.received_s) * 1000.0
            limit_s = slot_limit_s(now, budget_ms, self.task_grace_s, self.max_task_s)
            if limit_s <= now:  # its SLO plus the grace passed in the queue: nobody waits
                self._expire(dq, now)
                continue
            self.busy += 1
            inbound.limit_s = limit_s
            self._start(dq, now, budget_ms)

    def _start(self, dq: Dequeued, dequeued_s: float, budget_ms: float) -> None:
        """Run the task's executor up to its first wait, here and now: one that answers
        without waiting (an instant or cached result) is finished without an asyncio task;
        one that waits goes on in a runner task of its own from where it stopped (`_run`).

        Beyond the papers: what Python 3.12's eager tasks do, by hand (this runs on 3.11).
        A task per execution cost the task server ~4 µs of its ~19 µs per instant task.
        """
        inbound: _Inbound = dq.task.item
        task = inbound.task
        error: str | None = None
        coro = self.executor.execute(task.payload or b"", budget_ms=budget_ms)
        try:
            waiting_on = coro.send(None)
        except StopIteration as stop:
            status, result = TaskStatus.OK, stop.value
        except (Exception, asyncio.CancelledError) as exc:
            (status, error), result = self._failure(task, exc), b""
        else:
            inbound.suspended = coro, waiting_on
            loop = asyncio.get_running_loop()
            runner = loop.create_task(self._run(dq, dequeued_s, coro, waiting_on))
            self._running[runner] = inbound
            if self._watchdog is None:
                self._watchdog = loop.create_task(self._watch())
            return
        inbound.started = True
        self.busy -= 1
        self._finish(dq, dequeued_s, status, result, error)  # the caller's loop pumps on
        self._check_idle()

    def _failure(self, task: Any, exc: BaseException) -> tuple[TaskStatus, str]:
        """The status and error a task ends with when its executor raised `exc`."""
        if isinstance(exc, TaskDropped):
            return TaskStatus.DROPPED, str(exc)
        if isinstance(exc, InvalidTask):
            # Marked, so that the gateway answers its client 4xx naming the field.
            return TaskStatus.FAILED, exc.wire_error()
        if isinstance(exc, ExecutorError):
            return TaskStatus.FAILED, str(exc)
        if isinstance(exc, asyncio.CancelledError):
            return self._cancelled()
        # An executor bug must not kill the server.
        log.error("executor failed on task %s/%s", task.query_id, task.task_index, exc_info=exc)
        return TaskStatus.FAILED, f"internal error: {exc!r}"

    def _cancelled(self) -> tuple[TaskStatus, str]:
        """The status and error of a task stopped while it ran: REJECTED when given up by a
        drain or a stop (so the gateway may retry it elsewhere), else CANCELLED."""
        if self._stop_reason:
            return TaskStatus.REJECTED, self._stop_reason
        return TaskStatus.CANCELLED, "cancelled"

    async def _run(
        self,
        dq: Dequeued,
        dequeued_s: float,
        coro: Coroutine[Any, Any, bytes],
        waiting_on: Any,
    ) -> None:
        """The runner of a task whose executor waits: goes on with its started coroutine."""
        inbound: _Inbound = dq.task.item
        inbound.started = True
        inbound.suspended = None
        status, result, error = TaskStatus.OK, b"", None
        try:
            result = await _Resumed(coro, waiting_on)
        except (Exception, asyncio.CancelledError) as exc:
            status, error = self._failure(inbound.task, exc)
        finally:
            if not inbound.reclaimed:
                self.busy -= 1
                self._running.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
        if inbound.reclaimed:
            return  # the watchdog gave the slot back and reported the task already
        self._finish(dq, dequeued_s, status, result, error)
        if not self.draining or len(self.queue):
            self._pump()
        self._check_idle()

    def _finish(
        self,
        dq: Dequeued,
        dequeued_s: float,
        status: TaskStatus,
        result: bytes,
        error: str | None,
    ) -> None:
        """A task's executor ended: count it and send its outcome back."""
        inbound: _Inbound = dq.task.item
        task = inbound.task
        done = self.clock()
        self.last_activity = done
        if self.metrics is not None:
            self.metrics.queue_wait.observe(dq.wait_s)
            self.metrics.service.observe(done - dequeued_s)
            if dq.missed_deadline:
                self.metrics.deadline_misses.inc()
        self.tasks_done += 1
        self._send(
            inbound.conn,
            task,
            status,
            inbound.received_s,
            dequeued_s,
            done - dequeued_s,
            dq.missed_deadline,
            result=result,
            error=error,
        )

    def _send(
        self,
        conn: ThriftConnection,
        task: Any,
        status: int,
        received_s: float,
        dequeued_s: float,
        service_s: float,
        missed: bool,
        *,
        result: bytes = b"",
        error: str | None = None,
    ) -> None:
        now = self.clock()
        if self.spans is not None and task.traceparent is not None:
            self.spans.record(
                task, status_names()[status], received_s, dequeued_s, service_s, missed, error
            )
        # Positional (IDL field order: query_id, task_index, status, queue_ms, service_ms,
        # server_ms, missed_deadline, result, error): a third of the keyword cost, per task.
        res = self._t.TaskResult(
            task.query_id,
            task.task_index,
            status,
            (dequeued_s - received_s) * 1000.0,
            service_s * 1000.0,
            (now - received_s) * 1000.0,
            missed,
            result if status == TaskStatus.OK else None,
            error,
        )
        if self.metrics is not None:
            self.metrics.task_done(status_names()[status])
        if conn.closed:
            return  # the gateway went away; nobody is waiting for this result
        with contextlib.suppress(ConnectionClosed):
            conn.send_item(res)

    def _expire(self, dq: Dequeued, now: float) -> None:
        """A task dequeued past its SLO plus the grace: FAILED without running."""
        inbound: _Inbound = dq.task.item
        if self.metrics is not None:
            self.metrics.queue_wait.observe(dq.wait_s)
            self.metrics.deadline_misses.inc()
        self.tasks_done += 1
        error = (
            f"expired in the queue: its SLO budget ({inbound.task.slo_budget_ms:.0f} ms) plus "
            f"the grace ({self.task_grace_s:g} s) passed before a slot was free"
        )
        self._send(
            inbound.conn,
            inbound.task,
            TaskStatus.FAILED,
            inbound.received_s,
            now,
            0.0,
            True,
            error=error,
        )

    async def _watch(self) -> None:
        """The watchdog: every WATCH_PERIOD_S, take back the slots of overdue tasks."""
        while True:
            await asyncio.sleep(WATCH_PERIOD_S)
            self.reclaim_overdue(self.clock())

    def reclaim_overdue(self, now: float) -> int:
        """Give back the slot of every task running past its budget plus the grace.

        The task is reported FAILED and its runner cancelled; an executor that cannot stop
        at once (work in a thread) finishes in the background, its result dropped. How many.
        """
        overdue = [(r, inb) for r, inb in self._running.items() if now >= inb.limit_s]
        for runner, inbound in overdue:
            inbound.reclaimed = True
            del self._running[runner]
            self.busy -= 1
            self.reclaimed += 1
            runner.cancel()
            if not inbound.started:
                _stop_suspended(inbound)  # its runner will not run: stop what it would go on
            task = inbound.task
            error = (
                f"task ran past its budget ({task.slo_budget_ms:.0f} ms) plus the grace "
                f"({self.task_grace_s:g} s): its slot was reclaimed"
            )
            self._throttled.warning(
                "reclaimed",
                now,
                "server %s: task %s/%s %s",
                self.server_id,
                task.query_id,
                task.task_index,
                error.removeprefix("task "),
                extra={
                    "server_id": self.server_id,
                    "query_id": task.query_id,
                    "outcome": "reclaimed",
                },
            )
            if self.metrics is not None:
                self.metrics.slots_reclaimed.inc()
            self._send(
                inbound.conn,
                task,
                TaskStatus.FAILED,
                inbound.received_s,
                now,
                0.0,
                False,
                error=error,
            )
        if overdue:
            self.last_activity = now
            if not self.draining or len(self.queue):
                self._pump()
            self._check_idle()
        return len(overdue)

    def cancel(self, query_id: str) -> int:
        """Drop the query's queued tasks and cancel its running ones."""
        removed = self.queue.remove_query(query_id)
        self._cancel_queued(removed, "cancelled")
        running = [(r, inb) for r, inb in self._running.items() if inb.task.query_id == query_id]
        for runner, inbound in running:
            self._stop_runner(runner, inbound)
        self._check_idle()
        return len(removed) + len(running)

    def _stop_runner(self, runner: asyncio.Task[None], inbound: _Inbound) -> None:
        """Cancel a running task; it reports CANCELLED (REJECTED when giving up) and frees its
        slot from its own `finally`, or here if it has not taken its first step yet: asyncio
        then throws the cancellation into the coroutine before any of its code runs."""
        runner.cancel()
        if inbound.started or inbound.reclaimed:
            return
        inbound.reclaimed = True  # nothing of the runner will run
        del self._running[runner]
        self.busy -= 1
        _stop_suspended(inbound)
        status, error = self._cancelled()
        now = self.clock()
        self._send(
            inbound.conn, inbound.task, status, inbound.received_s, now, 0.0, False, error=error
        )
        if not self.draining or len(self.queue):
            self._pump()

    def _drop_tasks_of(self, conn: ThriftConnection) -> None:
        """A gateway's connection closed: nobody waits for its tasks any more; stop them."""
        self._cancel_queued(
            self.queue.remove_where(lambda qt: qt.item.conn is conn), "gateway went away"
        )
        for runner, inbound in list(self._running.items()):
            if inbound.conn is conn:
                self._stop_runner(runner, inbound)
        self._check_idle()

    def _cancel_queued(self, queued: list[QueuedTask], reason: str) -> None:
        """Report CANCELLED for tasks taken out of the queue before they ran."""
        now = self.clock()
        for qt in queued:
            inbound: _Inbound = qt.item
            self._send(
                inbound.conn, inbound.task, 2, inbound.received_s, now, 0.0, False, error=reason
            )

    def status(
        self, conn: ThriftConnection | None = None, claim: Any = None, load: Any = None
    ) -> Any:
        """The ServerStatus struct; a gateway's ownership claim and its reported load on
        `conn` are taken first.

        The owner is named only to a connection that proved the token (and by a server
        without one): a refused claim learns nothing about who holds the server.
        """
        now = self.clock()
        nonce = claim_error = None
        if conn is not None:
            nonce = self._nonces.get(conn)
            if nonce is None:
                nonce = self._nonces[conn] = os.urandom(NONCE_BYTES)
            if claim is not None:
                claim_error = self._claim(conn, claim, nonce, now)
            if load is not None:
                self._take_load(conn, load, now)
        owner = self.lease.holder(now)
        if conn is not None and self.token is not None and conn not in self._peers:
            owner = None
        return self._t.ServerStatus(
            server_id=self.server_id,
            policy=str(self.queue.policy.value),
            slots=self.slots,
            busy=self.busy,
            queued=len(self.queue),
            tasks_done=self.tasks_done,
            deadline_misses=self.queue.missed,
            draining=self.draining,
            executor=self.executor.name,
            owner=owner,
            owner_lease_ms=None if owner is None else self.lease.remaining_s(now) * 1000.0,
            claim_nonce=nonce,
            claim_error=claim_error,
            frontends=self._frontend_loads(now),
        )

    def _take_load(self, conn: ThriftConnection, load: Any, now: float) -> None:
        """Keep a gateway's reported request rate (Swayam §4.2's gossip, on the heartbeat).

        One gateway per connection: a connection that reports another id replaces its old
        entry, so a peer cannot fill the table through one socket. A bad report is ignored.
        """
        gateway_id, rate = getattr(load, "gateway_id", None), getattr(load, "rate_per_s", None)
        problem = load_problem(gateway_id, rate)
        if problem is not None:
            self._throttled.warning(
                "load", now, "server %s: ignored a load report: %s", self.server_id, problem
            )
            return
        before = self._reporters.get(conn)
        if before is not None and before != gateway_id:
            self._reporters.pop(conn)
            if before not in self._reporters.values():
                self.frontends.forget(before)
        if self.frontends.heard(gateway_id, rate, now):
            self._reporters[conn] = gateway_id
        else:
            self._throttled.warning(
                "load_full",
                now,
                "server %s: ignored gateway %s's load: %d gateways already report theirs",
                self.server_id,
                gateway_id,
                self.frontends.max_frontends,
            )

    def _frontend_loads(self, now: float) -> list[Any] | None:
        """The rates heard within the horizon, as ServerStatus.frontends (None: none)."""
        rates = self.frontends.rates(now)
        if not rates:
            return None
        return [self._t.FrontendLoad(gid, rate) for gid, rate in rates.items()]

    def _claim(self, conn: ThriftConnection, claim: Any, nonce: bytes, now: float) -> str | None:
        """A gateway claims this server's slots (taskserver.ownership); why not, if refused."""
        problem = claim_problem(claim)
        if problem is not None:
            return f"claim refused: {problem}"
        gateway_id = claim.gateway_id
        if self.token is not None and not proof_matches(
            self.token, nonce, gateway_id, claim.lease_ms, claim.proof
        ):
            self._throttled.warning(
                "claim",
                now,
                "server %s: refused an ownership claim from %s: no valid proof",
                self.server_id,
                conn.peer,
            )
            return "claim refused: it does not prove this server's registration token"
        self._peers[conn] = gateway_id
        before = self.lease.holder(now)
        decision = self.lease.claim(gateway_id, claim.lease_ms / 1000.0, now)
        if decision.granted and before != gateway_id:
            log.info("server %s: now owned by gateway %s", self.server_id, gateway_id)
        if not decision.granted:
            return "claim refused: another gateway holds this server's lease"
        return None

    # -- draining and stopping -------------------------------------------------
    def _check_idle(self) -> None:
        if self._idle_waiters and not self.busy and not len(self.queue):
            waiters, self._idle_waiters = self._idle_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def drain(self, timeout_s: float) -> tuple[int, int]:
        """Take no new task; serve the queue for at most timeout_s, then give up on the rest.

        Returns (finished, given_up): tasks that ran to an outcome during the drain, and
        tasks sent back REJECTED unfinished. Every task's fate reaches its gateway.
        """
        self.draining = True
        done_before = self.tasks_done
        if self.busy or len(self.queue):
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(fut)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, timeout_s)
        finished = self.tasks_done - done_before
        given_up = await self._give_up(
            f"server draining: not finished within its drain timeout ({timeout_s:g} s)"
        )
        return finished, given_up

    async def _give_up(self, reason: str) -> int:
        """Send every queued and running task back REJECTED with `reason`; how many."""
        self.draining = True
        self._stop_reason = reason
        queued = self.queue.drain()
        now = self.clock()
        for qt in queued:
            inbound: _Inbound = qt.item
            self._send(
                inbound.conn, inbound.task, 3, inbound.received_s, now, 0.0, False, error=reason
            )
        runners = list(self._running.items())
        for r, inbound in runners:
            self._stop_runner(r, inbound)
        if runners:
            await asyncio.gather(*(r for r, _ in runners), return_exceptions=True)
        return len(queued) + len(runners)

    async def close(self) -> None:
        """Give up on everything queued and running (REJECTED), then close the connections."""
        await self._give_up("server stopping")
        if self._watchdog is not None:
            self._watchdog.cancel()
        for conn in list(self._conns):
            conn.close()
        if not self._closed:
            self._closed = True
            await self.executor.close()


def build_service(
    config: TaskServerConfig,
    registry: CollectorRegistry | None = None,
    executor: Executor | None = None,
    tracing: Tracing | None = None,
) -> TaskService:
    """Wire a TaskService from its config (an emulated executor unless one is given); with
    `tracing`, traced tasks' queue wait and service become spans."""
    if executor is None:
        executor = EmulatedExecutor(
            make_distribution(config.service),
            mode=config.emulation,  # type: ignore[arg-type]
            seed=config.seed,
            server_id=config.server_id,
        )
    metrics = None
    if registry is not None:
        from taskserver.metrics import TaskServerMetrics

        metrics = TaskServerMetrics(registry, config.server_id)
        if executor.snapshot() is not None:  # e.g. a pipeline executor: its PARD metrics too
            from taskserver.metrics import PipelineCollector

            registry.register(PipelineCollector(executor.snapshot, config.server_id))
    service = TaskService(
        config.server_id,
        create_task_queue(config.policy, max_len=config.max_queue),
        executor,
        slots=config.slots,
        metrics=metrics,
        token=config.token,
        task_grace_s=config.task_grace_s,
        max_task_s=config.max_task_s,
        limits=WireLimits.for_frames_of(config.max_frame_bytes),
        reject_when_busy=config.reject_when_busy,
    )
    if tracing is not None:
        service.spans = TaskSpans(tracing, config.server_id, service.clock)
    return service


def _metrics_routes(service: TaskService, registry: CollectorRegistry) -> dict[str, Route]:
    from prometheus_client import generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    def metrics() -> Reply:
        return 200, CONTENT_TYPE_LATEST, generate_latest(registry)

    def healthz() -> Reply:
        st = service.status()
        body = {
            "status": "draining" if st.draining else "ok",
            "server_id": st.server_id,
            "queued": st.queued,
            "busy": st.busy,
            "slots": st.slots,
        }
        return 200, "application/json", json.dumps(body).encode()

    return {"/metrics": metrics, "/healthz": healthz}


async def serve(
    config: TaskServerConfig,
    ready: Callable[[str], None] | None = None,
    executor: Executor | None = None,
    *,
    registry: CollectorRegistry | None = None,
    stop: asyncio.Event | None = None,
    tracing: Tracing | None = None,
) -> None:
    """Run a task server until `stop` is set or it retires, then drain; or until cancelled.

    With a metrics port, /metrics exports `registry` (a new one if None) with the task
    server's own metrics added; the announcement then names the metrics address too.
    Setting `stop` (SIGTERM in the CLI) drains: see taskserver.lifecycle. With
    ``[tracing] enabled`` it traces through `tracing` (its own provider if None, flushed at
    the end; ConfigError before anything starts when the extra is missing).
    """
    own_tracing = tracing is None and config.tracing.enabled
    if own_tracing:
        tracing = open_tracing(config.tracing, "tailgate-taskserver", "tailgate.taskserver")
    try:
        await _serve(config, ready, executor, registry, stop, tracing)
    finally:
        if own_tracing and tracing is not None:
            tracing.shutdown()


async def _serve(
    config: TaskServerConfig,
    ready: Callable[[str], None] | None,
    executor: Executor | None,
    registry: CollectorRegistry | None,
    stop: asyncio.Event | None,
    tracing: Tracing | None,
) -> None:
    stop = asyncio.Event() if stop is None else stop
    if not config.metrics_port:
        registry = None
    elif registry is None:
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry()
    # Certificates load before anything listens: a bad file is a ConfigError at start.
    tls = link_server_tls(config.tls, f"task server {config.server_id}")
    gateway_tls = http_client_tls(config.tls, gateway_urls(config.gateway_url))
    service = build_service(config, registry, executor, tracing)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        service.protocol_factory,
        config.host,
        config.port,
        ssl=None if tls is None else tls.listening(),
        ssl_handshake_timeout=None if tls is None else HANDSHAKE_TIMEOUT_S,
    )
    port = server.sockets[0].getsockname()[1]
    address = config.advertise or f"{config.host}:{port}"
    announcement = {"server_id": config.server_id, "address": address}
    http_server: asyncio.Server | None = None
    background: list[asyncio.Task[None]] = []
    registration: asyncio.Task[None] | None = None
    try:
        if registry is not None:
            routes = _metrics_routes(service, registry)
            http_server = await start_http(config.host, config.metrics_port, routes)
            announcement["metrics"] = f"{config.host}:{config.metrics_port}"
        if config.gateway_url:
            registration = loop.create_task(
                register_forever(config, address, config.slots, stop, tls=gateway_tls)
            )
            background.append(registration)
        log.info(
            "task server %s listening on %s%s (policy %s, %d slots, frame check in %s)",
            config.server_id,
            address,
            "" if tls is None else f" with TLS (client_auth {config.tls.client_auth.value})",
            config.policy,
            config.slots,
            FRAMECHECK,
        )
        if config.token is None:
            log.warning(
                "task server %s has no registration token: any client of its Thrift port can "
                "claim it (central queueing); configure a token",
                config.server_id,
            )
        if ready is not None:
            ready(json.dumps(announcement))
        waits = [loop.create_task(stop.wait())]
        if config.idle_exit_s > 0:
            waits.append(loop.create_task(retire_when_idle(service, config)))
        background += waits
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        stop.set()  # ends the registration loop
        server.close()  # no new connections while draining
        await drain_and_leave(service, config, registration, tls=gateway_tls)
    finally:
        for t in background:
            t.cancel()
        server.close()
        await service.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2.0)
        if http_server is not None:
            http_server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(http_server.wait_closed(), 2.0)


def dense_configs(config: TaskServerConfig, count: int) -> list[TaskServerConfig]:
    """`count` emulated servers from one config, to run in one process (`serve_many`).

    Server i (from 1) is ``<server_id>-i`` with its own listener (``port + i - 1``, or any
    free port with port 0), its own metrics port when one is set, and its own seed (``seed
    + i - 1``) so their service-time draws differ. Each registers on its own, as if it
    were a process of its own; only the event loop is shared. With count 1 the config is
    returned unchanged.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count: must be an integer >= 1, got {count!r}")
    if count == 1:
        return [config]
    if config.advertise is not None:
        raise ValueError("count: --advertise names one address; it cannot serve several servers")
    out = []
    for i in range(count):
        out.append(
            dataclasses.replace(
                config,
                server_id=f"{config.server_id}-{i + 1}",
                port=config.port + i if config.port else 0,
                metrics_port=config.metrics_port + i if config.metrics_port else 0,
                seed=None if config.seed is None else config.seed + i,
            )
        )
    return out


async def serve_many(
    configs: Sequence[TaskServerConfig],
    ready: Callable[[str], None] | None = None,
    *,
    stop: asyncio.Event | None = None,
) -> None:
    """Run several task servers in this event loop (`serve` each) until `stop` is set.

    Each announces itself on its own line. If one fails (a port taken), the others are
    stopped and drained, and its error is raised. With tracing on they share one provider.
    """
    tracing = None
    if configs and configs[0].tracing.enabled:
        tracing = open_tracing(configs[0].tracing, "tailgate-taskserver", "tailgate.taskserver")
    servers = [functools.partial(serve, c, ready=ready, tracing=tracing) for c in configs]
    try:
        await serve_together(servers, stop=stop)
    finally:
        if tracing is not None:
            tracing.shutdown()


async def serve_together(
    servers: Sequence[Callable[..., Awaitable[None]]], *, stop: asyncio.Event | None = None
) -> None:
    """Run ``server(stop=own_stop)`` for each until `stop` is set; the first failure stops
    and drains the others and is raised. Each gets a stop of its own, so one that retires
    (idle exit) does not stop the rest; `stop` sets them all."""
    stop = asyncio.Event() if stop is None else stop
    stops = [asyncio.Event() for _ in servers]

    async def relay() -> None:
        await stop.wait()
        for s in stops:
            s.set()

    relayer = asyncio.create_task(relay())
    tasks = [asyncio.create_task(server(stop=s)) for server, s in zip(servers, stops, strict=True)]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in done if not t.cancelled() and t.exception() is not None]
        if failed:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise failed[0].exception()  # type: ignore[misc]
        await asyncio.gather(*tasks)
    finally:
        relayer.cancel()
        for t in tasks:
            t.cancel()
        await asyncio.gather(relayer, *tasks, return_exceptions=True)
