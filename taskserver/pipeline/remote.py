"""A pipeline split across task servers: hand-offs to the next stage and its module states.

When a module's sub runs in another task server (``PipelineConfig.peers``), the request
leaves this process as an ordinary task on the Tailgate wire: a oneway ``submit`` whose
payload is a hand-off (``tensors.handoff_payload``: the frame, the entry module, its
region, the budget left) and whose result comes back as a ``TaskResult`` on the same
connection. So the next stage queues, batches and drops it with the same machinery as a
task from the gateway, a drop there comes back as DROPPED, and a request abandoned here is
cancelled there with ``cancel``. Budgets travel as durations: the next stage turns the
budget left into its own local deadline on receipt (hosts share no clock).

State exchange across processes (PARD §4.1 ②, "at most once per second"): upstream
modules need the states of every module downstream of them (q_i, batch size, the batch-wait
sketch) for eq. (3). A `PeerLink` polls its stage's published states with the two-way
``pipeline_state`` call once per ``period_s``; a stage answers with the states its own
modules last published (each at most once per period) plus those it learnt from the
stages after it, so a chain of stages passes them all the way up.

Errors::

    ExecutorError (taskserver.executors)
     └── PeerUnavailable   the next stage cannot be reached, or its connection was lost
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskserver import jsonbody
from taskserver.abc import ExecutorError
from taskserver.messages import result_problem
from taskserver.pard import ModuleState
from taskserver.wire import (
    ONEWAY,
    Batcher,
    ThriftConnection,
    WireError,
    gateway_body_types,
    status_names,
    thrift,
)

__all__ = [
    "PeerLink",
    "PeerResult",
    "PeerUnavailable",
    "decode_states",
    "encode_states",
]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0


class PeerUnavailable(ExecutorError):
    """The task server of the next stage cannot be reached (or went away mid-request)."""


@dataclass(frozen=True, slots=True)
class PeerResult:
    """What the next stage answered for one hand-off."""

    status: str  # ok, failed, cancelled, rejected, dropped
    result: bytes | None  # the stage's pipeline result (JSON) when ok
    error: str  # why, otherwise


def encode_states(pipeline: str, states: list[ModuleState]) -> bytes:
    """The ``pipeline_state`` answer: a stage's module states as JSON."""
    return json.dumps(
        {"pipeline": pipeline, "states": [dataclasses.asdict(s) for s in states]},
        allow_nan=False,
    ).encode()


def decode_states(pipeline: str, raw: bytes) -> list[ModuleState]:
    """Parse a ``pipeline_state`` answer; ValueError names what is wrong."""
    try:
        body = jsonbody.loads(raw) if raw else {"pipeline": pipeline, "states": []}
    except jsonbody.JsonError as exc:
        raise ValueError(f"pipeline_state: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("states"), list):
        raise ValueError("pipeline_state: need an object with a states list")
    if body.get("pipeline") != pipeline:
        raise ValueError(
            f"pipeline_state: the peer serves pipeline {body.get('pipeline')!r}, not {pipeline!r}"
        )
    states = []
    for item in body["states"]:
        if not isinstance(item, dict):
            raise ValueError(f"pipeline_state: a state must be an object, got {item!r:.60}")
        try:
            states.append(
                ModuleState(
                    module_id=str(item["module_id"]),
                    batch_size=int(item["batch_size"]),
                    workers=int(item.get("workers", 1)),
                    queue_delay_s=float(item.get("queue_delay_s", 0.0)),
                    wait_fractions=tuple(float(x) for x in item.get("wait_fractions", ())),
                    seq=int(item.get("seq", -1)),
                    incarnation=int(item.get("incarnation", 0)),
                    duration_scale=float(item.get("duration_scale", 1.0)),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"pipeline_state: bad module state {item!r:.80}: {exc}") from exc
    return states


class PeerLink:
    """One connection to the task server of a later stage: hand-offs out, results back."""

    def __init__(
        self,
        address: str,
        pipeline: str,
        on_states: Callable[[list[ModuleState]], None],
        *,
        period_s: float = 1.0,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self.host, self.port = host, int(port)
        self.pipeline = pipeline
        self.period_s = period_s
        self._on_states = on_states
        self._conn: ThriftConnection | None = None
        self._connecting: asyncio.Lock | None = None
        self._pending: dict[str, asyncio.Future[PeerResult]] = {}
        self._prefix = uuid.uuid4().hex[:8]
        self._ids = itertools.count(1)
        self._poller: asyncio.Task[None] | None = None
        self._t = thrift()
        self.handoffs = 0
        self.state_polls = 0
        self.state_errors = 0
        self.last_error = ""

    @property
    def outstanding(self) -> int:
        """Hand-offs waiting for the stage's answer."""
        return len(self._pending)

    def new_key(self) -> str:
        """A task id for one hand-off, unique across this process's incarnations."""
        return f"pipe-{self._prefix}-{next(self._ids)}"

    async def run(self, key: str, payload: bytes, budget_ms: float) -> PeerResult:
        """Hand one request on and wait for the next stage's answer."""
        # Pending before connecting, so a cancel() while the connection opens is not lost.
        fut: asyncio.Future[PeerResult] = asyncio.get_running_loop().create_future()
        self._pending[key] = fut
        try:
            conn = await self._connected()
        except PeerUnavailable:
            self._pending.pop(key, None)
            raise
        if fut.done():  # cancelled meanwhile: nothing to send
            return fut.result()
        task = self._t.Task(
            query_id=key,
            task_index=0,
            deadline_budget_ms=budget_ms,
            slo_budget_ms=budget_ms,
            priority=0,
            payload=payload,
        )
        try:
            conn.send_item(task)
            self.handoffs += 1
            return await fut
        except WireError as exc:
            raise PeerUnavailable(f"pipeline stage at {self.address}: {exc}") from exc
        finally:
            self._pending.pop(key, None)

    def cancel(self, key: str) -> None:
        """Ask the next stage to drop a hand-off, and stop waiting for it here at once (a
        stage that hangs must not hold the request's waiter; its late answer is ignored)."""
        fut = self._pending.pop(key, None)
        if fut is None:
            return
        conn = self._conn
        if conn is not None and not conn.closed:
            with contextlib.suppress(WireError):
                conn.send("cancel", ONEWAY, 0, self._t.TaskServer.cancel_args(query_id=key))
        if not fut.done():
            fut.set_result(PeerResult("cancelled", None, "cancelled by the stage before"))

    def start(self) -> None:
        """Start polling the stage's module states (once per period)."""
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(
                self._poll_states(), name=f"pipeline-peer-{self.address}"
            )

    async def close(self) -> None:
        """Stop polling, close the connection; outstanding hand-offs fail."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._fail_pending("pipeline executor closed")

    # ---- internals ------------------------------------------------------------------------

    async def _connected(self) -> ThriftConnection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn
            loop = asyncio.get_running_loop()
            types = gateway_body_types()
            try:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: ThriftConnection(
                            types, self._on_message, self._on_lost, batcher=Batcher.submit()
                        ),
                        self.host,
                        self.port,
                    ),
                    CONNECT_TIMEOUT_S,
                )
            except (TimeoutError, OSError) as exc:
                self.last_error = f"connect failed: {exc or type(exc).__name__}"
                raise PeerUnavailable(
                    f"pipeline stage at {self.address} unreachable: {self.last_error}"
                ) from exc
            self._conn = conn
            return conn

    def _on_message(self, name: str, mtype: int, seqid: int, body: Any) -> None:
        if name == "result":
            self._resolve(body.result)
        elif name == "result_batch":
            for r in body.results or ():
                self._resolve(r)

    def _resolve(self, r: Any) -> None:
        fut = self._pending.get(r.query_id)
        if fut is not None and not fut.done():
            problem = result_problem(r)
            if problem is not None:
                fut.set_result(PeerResult("failed", None, f"bad result from the stage: {problem}"))
                return
            status = status_names().get(r.status, "failed")
            fut.set_result(PeerResult(status, r.result, r.error or ""))

    def _on_lost(self, exc: Exception | None) -> None:
        self.last_error = f"connection lost: {exc}" if exc else "connection closed by the stage"
        self._fail_pending(self.last_error)

    def _fail_pending(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(PeerUnavailable(f"pipeline stage at {self.address}: {reason}"))

    async def _poll_states(self) -> None:
        args = self._t.TaskServer.pipeline_state_args()
        while True:
            await asyncio.sleep(self.period_s)
            try:
                conn = await self._connected()
                raw = await conn.call("pipeline_state", args, self.period_s)
                states = decode_states(self.pipeline, raw)
            except (PeerUnavailable, WireError, TimeoutError, ValueError) as exc:
                self.state_errors += 1
                self.last_error = str(exc) or type(exc).__name__
                log.debug("pipeline stage %s: no states: %s", self.address, self.last_error)
                continue
            self.state_polls += 1
            self._on_states(states)
