"""The task server: a thin asyncio shell around a policy queue and an executor.

Tasks arrive as oneway ``submit`` messages carrying their remaining budgets;
the server turns a budget into a local deadline on receipt (hosts share no
clock), queues the task by policy, serves ``slots`` tasks at once and sends
each result back on the connection the task came from, with durations only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from taskserver.config import TaskServerConfig
from taskserver.executors import EmulatedExecutor, Executor, ExecutorError, TaskDropped
from taskserver.queues import Dequeued, QueuedTask, QueueFull, TaskQueue, create_task_queue
from taskserver.registration import GatewayUnreachable, gateway_call
from taskserver.service_time import make_distribution
from taskserver.wire import (
    ONEWAY,
    Batcher,
    ConnectionClosed,
    ThriftConnection,
    server_body_types,
    thrift,
)

if TYPE_CHECKING:  # prometheus_client and aiohttp.web only load when metrics are served
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from taskserver.metrics import TaskServerMetrics

log = logging.getLogger(__name__)

_STATUS_NAMES = {0: "ok", 1: "failed", 2: "cancelled", 3: "rejected", 4: "dropped"}


@dataclass(slots=True)
class _Inbound:
    """What the shell keeps with a queued task: the wire task and its way back."""

    task: Any
    conn: ThriftConnection
    received_s: float


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
    ) -> None:
        self.server_id = server_id
        self.queue = queue
        self.executor = executor
        self.slots = slots
        self.clock = clock
        self.metrics = metrics
        self.busy = 0
        self.tasks_done = 0
        self.draining = False
        self.last_activity = clock()
        """When the last task arrived or finished (for idle retirement)."""
        self._running: dict[asyncio.Task[None], str] = {}
        """Executing tasks -> their query id (at most `slots` entries)."""
        self._conns: set[ThriftConnection] = set()
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

        conn = ThriftConnection(types, on_message, on_lost, batcher=Batcher.result())
        self._conns.add(conn)
        return conn

    def handle(self, conn: ThriftConnection, name: str, mtype: int, seqid: int, body: Any) -> None:
        """Dispatch one TaskServer call."""
        if name == "submit":
            self.submit(conn, body.task)
        elif name == "submit_batch":
            for task in body.tasks or ():
                self.submit(conn, task)
        elif name == "cancel":
            self.cancel(body.query_id)
        elif name == "status":
            conn.reply(name, seqid, self.status())
        elif name == "ping":
            conn.reply(name, seqid, body.token or "")
        if mtype != ONEWAY and name in ("submit", "submit_batch", "cancel"):
            # A stock client may send oneway methods as plain calls; answer them.
            conn.reply(name, seqid, None)

    # -- the task path -------------------------------------------------------
    def submit(self, conn: ThriftConnection, task: Any) -> None:
        """Queue one task with its local deadlines; start it if a slot is free."""
        now = self.clock()
        self.last_activity = now
        if self.draining:
            self._send(conn, task, 3, now, now, 0.0, False, error="server is draining")
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
            self._send(conn, task, 3, now, now, 0.0, False, error="queue full")
            return
        except TypeError as exc:  # a required field missing in a hand-made message
            self._send(conn, task, 3, now, now, 0.0, False, error=f"bad task: {exc}")
            return
        self._pump()

    def _pump(self) -> None:
        while self.busy < self.slots:
            now = self.clock()
            dq = self.queue.pop(now)
            if dq is None:
                return
            self.busy += 1
            runner = asyncio.get_running_loop().create_task(self._run(dq, now))
            self._running[runner] = dq.task.query_id

    async def _run(self, dq: Dequeued, dequeued_s: float) -> None:
        inbound: _Inbound = dq.task.item
        task = inbound.task
        status, result, error = 0, b"", None
        try:
            # What is left of the query's end-to-end SLO (T-EDFQ's key) as the task starts.
            budget_ms = task.slo_budget_ms - (dequeued_s - inbound.received_s) * 1000.0
            result = await self.executor.execute(task.payload or b"", budget_ms=budget_ms)
        except TaskDropped as exc:
            status, error = 4, str(exc)
        except ExecutorError as exc:
            status, error = 1, str(exc)
        except asyncio.CancelledError:
            status, error = 2, "cancelled"
        except Exception as exc:  # an executor bug must not kill the server
            log.exception("executor failed on task %s/%s", task.query_id, task.task_index)
            status, error = 1, f"internal error: {exc!r}"
        finally:
            self.busy -= 1
            self._running.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
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
        if not self.draining or len(self.queue):
            self._pump()

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
            result if status == 0 else None,
            error,
        )
        if self.metrics is not None:
            self.metrics.task_done(_STATUS_NAMES[status])
        if conn.closed:
            return  # the gateway went away; nobody is waiting for this result
        with contextlib.suppress(ConnectionClosed):
            conn.send_item(res)

    def cancel(self, query_id: str) -> int:
        """Drop the query's queued tasks and cancel its running ones."""
        removed = self.queue.remove_query(query_id)
        self._cancel_queued(removed, "cancelled")
        running = [r for r, qid in self._running.items() if qid == query_id]
        for runner in running:
            runner.cancel()
        return len(removed) + len(running)

    def _cancel_queued(self, queued: list[QueuedTask], reason: str) -> None:
        """Report CANCELLED for tasks taken out of the queue before they ran."""
        now = self.clock()
        for qt in queued:
            inbound: _Inbound = qt.item
            self._send(
                inbound.conn, inbound.task, 2, inbound.received_s, now, 0.0, False, error=reason
            )

    def status(self) -> Any:
        """The ServerStatus struct."""
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
        )

    async def close(self) -> None:
        """Cancel everything queued and running."""
        self.draining = True
        self._cancel_queued(self.queue.drain(), "server stopping")
        runners = list(self._running)
        for r in runners:
            r.cancel()
        if runners:
            await asyncio.gather(*runners, return_exceptions=True)
        for conn in list(self._conns):
            conn.close()
        await self.executor.close()


def build_service(
    config: TaskServerConfig,
    registry: CollectorRegistry | None = None,
    executor: Executor | None = None,
) -> TaskService:
    """Wire a TaskService from its config (an emulated executor unless one is given)."""
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
        snapshot = getattr(executor, "snapshot", None)
        if callable(snapshot):  # a pipeline executor: its PARD metrics too
            from taskserver.metrics import PipelineCollector

            registry.register(PipelineCollector(snapshot, config.server_id))
    return TaskService(
        config.server_id,
        create_task_queue(config.policy, max_len=config.max_queue),
        executor,
        slots=config.slots,
        metrics=metrics,
    )


def _metrics_app(service: TaskService, registry: CollectorRegistry) -> web.Application:
    from aiohttp import web
    from prometheus_client import generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(_: web.Request) -> web.Response:
        st = service.status()
        return web.json_response(
            {
                "status": "draining" if st.draining else "ok",
                "server_id": st.server_id,
                "queued": st.queued,
                "busy": st.busy,
                "slots": st.slots,
            }
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


def auth_headers(config: TaskServerConfig) -> dict[str, str]:
    """The registration credential, if this server has a token."""
    return {"Authorization": f"Bearer {config.token}"} if config.token else {}


async def _register_forever(config: TaskServerConfig, address: str, slots: int) -> None:
    """Register with the gateway now and every interval (idempotent; survives its restarts).

    Each registration doubles as this server's heartbeat towards the gateway.
    """
    assert config.gateway_url
    url = config.gateway_url.rstrip("/") + "/v1/servers"
    body: dict[str, Any] = {
        "id": config.server_id,
        "pool": config.pool,
        "address": address,
        "slots": slots,
    }
    if config.cluster:
        body["cluster"] = config.cluster
    headers = auth_headers(config)
    while True:
        try:
            status, text = await gateway_call("POST", url, body, headers)
        except GatewayUnreachable as exc:
            log.info("gateway %s not reachable yet: %s", url, exc)
        else:
            if status == 401:
                log.error("registration refused: wrong or missing token (401)")
            elif status >= 400:
                log.warning("registration refused (%s): %s", status, text)
        await asyncio.sleep(config.register_interval_s)


async def _retire_when_idle(service: TaskService, config: TaskServerConfig) -> None:
    """Return once no task has come or gone for idle_exit_s (Swayam's passive scale-in)."""
    while True:
        await asyncio.sleep(min(1.0, config.idle_exit_s / 4))
        idle = service.busy == 0 and len(service.queue) == 0
        if idle and service.clock() - service.last_activity >= config.idle_exit_s:
            log.info(
                "task server %s idle for %.0f s: retiring", config.server_id, config.idle_exit_s
            )
            if config.gateway_url:
                url = f"{config.gateway_url.rstrip('/')}/v1/servers/{config.server_id}"
                with contextlib.suppress(GatewayUnreachable):
                    await gateway_call("DELETE", url, headers=auth_headers(config))
            return


async def serve(
    config: TaskServerConfig,
    ready: Callable[[str], None] | None = None,
    executor: Executor | None = None,
) -> None:
    """Run a task server until cancelled (with `executor`, or an emulated one)."""
    registry = None
    if config.metrics_port:
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry()
    service = build_service(config, registry, executor)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(service.protocol_factory, config.host, config.port)
    port = server.sockets[0].getsockname()[1]
    address = config.advertise or f"{config.host}:{port}"
    runner: web.AppRunner | None = None
    background: list[asyncio.Task[None]] = []
    try:
        if registry is not None:
            from aiohttp import web

            runner = web.AppRunner(_metrics_app(service, registry), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, config.host, config.metrics_port).start()
        if config.gateway_url:
            background.append(loop.create_task(_register_forever(config, address, config.slots)))
        log.info(
            "task server %s listening on %s (policy %s, %d slots)",
            config.server_id,
            address,
            config.policy,
            config.slots,
        )
        if ready is not None:
            ready(json.dumps({"server_id": config.server_id, "address": address}))
        if config.idle_exit_s > 0:
            await _retire_when_idle(service, config)
        else:
            await asyncio.Event().wait()
    finally:
        for t in background:
            t.cancel()
        server.close()
        await service.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2.0)
        if runner is not None:
            await runner.cleanup()
