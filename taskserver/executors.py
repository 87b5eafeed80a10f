"""Executors run one task's payload on a task server: `EmulatedExecutor` here.

The interface, its optional hooks and the error tree (`ExecutorError`, `TaskDropped`) live
in `taskserver.abc` and are re-exported from here; ONNX pipelines and sensing queries are
executors elsewhere, all behind `Executor.execute(payload) -> bytes`.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import selectors
import threading
import time
from typing import Literal

from taskserver import jsonbody
from taskserver.abc import Executor, ExecutorError, InvalidTask, TaskDropped
from taskserver.service_time import ServiceTimeDistribution

__all__ = ["EmulatedExecutor", "Executor", "ExecutorError", "TaskDropped"]

# asyncio timers fire through epoll (and uvloop's through libuv), whose timeouts have 1 ms
# granularity: sleep through the loop until this close to the end, then yield to the loop
# until the exact time has come. A loop on select() wakes to the microsecond: no margin.
_SLEEP_MARGIN_S = 0.001


def timer_margin_s(loop: asyncio.AbstractEventLoop) -> float:
    """How early a sleep must end to be exact on `loop`: 0 on a select() loop, else 1 ms."""
    selector = getattr(loop, "_selector", None)  # asyncio's selector loops; uvloop has none
    return 0.0 if isinstance(selector, selectors.SelectSelector) else _SLEEP_MARGIN_S


# The last payload parsed in this process, and what it parsed to. A fanout query gives all
# its tasks one payload, so emulated servers sharing a process (`--count`) receive the same
# bytes one after another; with ``service_ms_on`` naming 100 servers that is ~3 KB of
# JSON, 60 µs to parse, which each of the process's 25 servers paid again. The request is
# only read, never changed, so sharing it is safe.
_last_parsed: tuple[bytes, dict] = (b"", {})


def _parse_payload(payload: bytes) -> dict:
    global _last_parsed
    if not payload or payload == b"{}":
        return {}
    last_payload, last_request = _last_parsed
    if payload == last_payload:
        return last_request
    try:
        request = jsonbody.loads(payload)
    except jsonbody.JsonError as exc:
        raise InvalidTask("payload", str(exc)) from exc
    if not isinstance(request, dict):
        raise InvalidTask("payload", f"must be a JSON object, got {type(request).__name__}")
    _last_parsed = (bytes(payload), request)
    return request


def _spin_until(deadline: float, cancelled: threading.Event) -> None:
    while time.perf_counter() < deadline and not cancelled.is_set():
        pass


class EmulatedExecutor(Executor):
    """Emulates a task's service time by sleeping or by burning CPU.

    Payload (JSON object, b"" means {}): "service_ms" (number >= 0) fixes the service time;
    "service_ms_on" ({server id: number >= 0}) fixes it per server, so one query can give
    each of its tasks its own (a replayed workload); otherwise it is drawn from the
    distribution; "fail" (message) makes the task fail with
    ExecutorError after its service time; "drop" (message) drops it at once with TaskDropped,
    only on the servers listed in "drop_on" when given; "echo" is returned as is.
    Result: {"server": server_id, "service_ms": emulated ms rounded to µs, "echo": ...}.
    A payload that breaks these rules raises InvalidTask (field "payload"): the client's
    error, which the gateway answers 400, not a server's failure.
    """

    name = "emulated"

    def __init__(
        self,
        distribution: ServiceTimeDistribution,
        *,
        mode: Literal["sleep", "spin"] = "sleep",
        seed: int | None = None,
        server_id: str = "",
    ) -> None:
        if mode not in ("sleep", "spin"):
            raise ValueError(f"executor mode: must be 'sleep' or 'spin', got {mode!r}")
        self.distribution = distribution
        self.mode = mode
        self.server_id = server_id
        self._rng = random.Random(seed)
        self._result_prefix = json.dumps({"server": server_id})[:-1].encode() + b', "service_ms": '

    async def execute(self, payload: bytes, *, budget_ms: float | None = None) -> bytes:
        request = _parse_payload(payload)
        self._maybe_drop(request)
        service_ms = self._service_ms(request)
        failure = request.get("fail")
        if failure is not None and not isinstance(failure, str):
            raise InvalidTask("payload", f"fail must be a string, got {failure!r}")
        if service_ms > 0:
            if self.mode == "sleep":
                await _sleep_precisely(service_ms / 1000)
            else:
                await _spin(service_ms / 1000)
        if failure is not None:
            raise ExecutorError(failure)
        if "echo" in request:
            result = {
                "server": self.server_id,
                "service_ms": round(service_ms, 3),
                "echo": request["echo"],
            }
            return json.dumps(result).encode()
        # The common result, without a json.dumps per task: {"server": ..., "service_ms": ...}
        return b"%s%r}" % (self._result_prefix, round(service_ms, 3))

    def _maybe_drop(self, request: dict) -> None:
        """`drop` (a reason) drops the task at once, on the servers in `drop_on` if given."""
        reason = request.get("drop")
        if reason is None:
            return
        if not isinstance(reason, str):
            raise InvalidTask("payload", f"drop must be a string, got {reason!r}")
        on = request.get("drop_on")
        if on is not None and (not isinstance(on, list) or not all(isinstance(x, str) for x in on)):
            raise InvalidTask("payload", f"drop_on must be a list of server ids, got {on!r}")
        if on is None or self.server_id in on:
            raise TaskDropped(reason)

    def _service_ms(self, request: dict) -> float:
        per_server = request.get("service_ms_on")
        if per_server is not None:
            if not isinstance(per_server, dict) or self.server_id not in per_server:
                raise InvalidTask(
                    "payload",
                    f"service_ms_on must map this server ({self.server_id!r}) to a "
                    f"service time, got {str(per_server)[:200]}",
                )
            return self._checked_ms(per_server[self.server_id])
        if "service_ms" not in request:
            return self.distribution.sample_ms(self._rng)
        return self._checked_ms(request["service_ms"])

    @staticmethod
    def _checked_ms(value: object) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise InvalidTask("payload", f"service_ms must be a number >= 0, got {value!r}")
        return float(value)

    def __repr__(self) -> str:
        return (
            f"EmulatedExecutor(server_id={self.server_id!r}, mode={self.mode!r}, "
            f"distribution={self.distribution!r})"
        )


async def _sleep_precisely(duration_s: float) -> None:
    """Sleep duration_s without blocking the loop, accurate to the loop's iteration time.

    The bulk is an ordinary asyncio sleep, ending 1 ms early where the loop rounds
    timeouts to whole ms (epoll, uvloop); the rest yields to the loop (sleep(0)) until
    perf_counter reaches the end. That costs CPU for < ~1 ms but never blocks other tasks,
    and both parts are cancellation points, so CancelledError arrives at once. On a
    select() loop (dense emulated servers) the sleep alone is exact: no polling.
    """
    deadline = time.perf_counter() + duration_s
    bulk_s = duration_s - timer_margin_s(asyncio.get_running_loop())
    if bulk_s > 0:
        await asyncio.sleep(bulk_s)
    # A polling yield on purpose: no event marks the moment, and the margin is < ~1 ms.
    while time.perf_counter() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0)


async def _spin(duration_s: float) -> None:
    """Burn CPU for duration_s in a worker thread, so the event loop keeps accepting tasks.

    The GIL is shared: the spinning thread and the loop take turns in switch-interval slices
    (5 ms by default), so loop latency grows while a task spins, as it would with real
    CPU-bound Python work. On cancellation the thread is told to stop at its next check.
    """
    deadline = time.perf_counter() + duration_s
    cancelled = threading.Event()
    try:
        await asyncio.to_thread(_spin_until, deadline, cancelled)
    finally:
        cancelled.set()
