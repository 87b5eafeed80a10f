"""Task frames out and result frames in, for the gateway's links, without Thrift objects.

Why: at zero service time the gateway's own work per task is the limit, and building a
thriftpy2 ``Task`` per task, then a ``TaskResult`` per result (each a Python ``__init__``),
checking each result field by field and copying it into a ``TaskReport`` cost more than the
rest of a task's bookkeeping. Here a task goes out as a plain tuple and a frame of results
comes back as ``(query_id, task_index, TaskReport)`` tuples, in one C call each way
(``gateway/_hotpath.c``, built at install when a C compiler is there).

What, exactly:

- `encode_tasks` writes the framed oneway ``submit`` (one task) or ``submit_batch`` messages
  that ``taskserver.wire.Batcher.submit().encode`` writes for the same tasks, byte for byte,
  cut into frames by the same rule (MAX_BATCH_BYTES).
- `ResultFrames.decode` takes a framed oneway ``result`` or ``result_batch`` message whole, or
  not at all: a frame that is anything else or holds anything unusual (another message, a
  field it does not know or twice, a string that is not UTF-8, a status that is not a
  TaskStatus, a duration outside 0..MAX_DURATION_MS, a queue wait above the server time, a
  bound of taskserver.framecheck passed) gives None, and the link decodes it the general
  way (framecheck, thriftpy2, then taskserver.messages.result_problem), which keeps every
  verdict on bad frames as it was.
  What it does take, it takes as the general way would read it.

This module is the reference: the same functions in Python over thriftpy2, used when the
extension is missing, and compared with it on random and fuzzed inputs in the tests
(tests/unit/test_hotpath.py). ``IMPLEMENTATION`` says which one runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, Literal

from taskserver.framecheck import WireLimits, check_frame
from taskserver.messages import MAX_DURATION_MS
from taskserver.native import require_native
from taskserver.wire import (
    MAX_BATCH_BYTES,
    ONEWAY,
    Batcher,
    ProtocolViolation,
    TaskStatus,
    decode_message,
    gateway_body_types,
    thrift,
)

__all__ = [
    "IMPLEMENTATION",
    "ResultFrames",
    "ResultItem",
    "TaskItem",
    "encode_tasks",
    "encode_tasks_py",
]

TaskItem = tuple[str, int, float, float, int, str | None, bytes | None, str | None, str | None]
"""A task as it goes out, in the IDL's field order: query_id, task_index,
deadline_budget_ms, slo_budget_ms, priority, class_name, payload, traceparent, tracestate."""
ResultItem = tuple[str, int, Any]
"""A result as it comes in: query_id, task_index and the report (the link's TaskReport)."""

STATUSES = [TaskStatus(i) for i in range(len(TaskStatus))]
"""TaskStatus by wire value: what a report's status is."""
_MIN_DEPTH = 3
"""A result_batch nests the message's struct, its list and each result's struct."""


@cache
def _batcher() -> Batcher:
    return Batcher.submit()


def encode_tasks_py(items: list[TaskItem], max_batch_bytes: int = MAX_BATCH_BYTES) -> bytes:
    """The framed submit/submit_batch messages for these tasks, through thriftpy2."""
    if not items:
        return b""
    task = thrift().Task
    batcher = _batcher()
    if max_batch_bytes != MAX_BATCH_BYTES:
        raise ValueError("encode_tasks_py: only MAX_BATCH_BYTES frames are written")
    return batcher.encode([task(*item) for item in items])


def _results_py(
    frame: bytes,
    max_string: int,
    max_items: int,
    max_depth: int,
    max_duration_ms: float,
    report_type: Callable[..., Any] | None,
    statuses: Sequence[TaskStatus],
) -> list[ResultItem] | None:
    """The results of a frame the general way, or None where the C decoder takes no frame
    (same signature as the C one)."""
    if max_depth < _MIN_DEPTH:
        return None
    limits = WireLimits(max_string_bytes=max_string, max_container_items=max_items,
                        max_depth=max_depth)  # fmt: skip
    if check_frame(frame, limits) is not None:
        return None
    try:
        name, mtype, _, body = decode_message(frame, gateway_body_types(), limits)
    except ProtocolViolation:
        return None
    if mtype != ONEWAY:
        return None
    if name == "result":
        results = None if body.result is None else [body.result]
    elif name == "result_batch":
        results = body.results
    else:
        return None
    if results is None:
        return None
    out: list[ResultItem] = []
    for r in results:
        durations = (r.queue_ms, r.service_ms, r.server_ms)
        if not (
            type(r.query_id) is str
            and type(r.task_index) is int
            and type(r.status) is int
            and 0 <= r.status < len(statuses)
            and all(type(d) is float and 0.0 <= d <= max_duration_ms for d in durations)
            and r.queue_ms <= r.server_ms  # else result_problem's verdict
            and type(r.missed_deadline) is bool
            and (r.result is None or type(r.result) is bytes)
            and (r.error is None or type(r.error) is str)
        ):
            return None
        fields = (statuses[r.status], *durations, r.missed_deadline, r.result, r.error)
        report = fields if report_type is None else report_type(*fields)
        out.append((r.query_id, r.task_index, report))
    return out


try:
    require_native()  # TAILGATE_PURE_PYTHON=1: the Python twin
    from gateway._hotpath import decode_results as _c_decode
    from gateway._hotpath import encode_tasks as _c_encode
except ImportError:  # built at install when a C compiler is there; the Python above otherwise
    _c_decode = _c_encode = None

IMPLEMENTATION: Literal["c", "python"] = "python" if _c_encode is None else "c"
"""Which encoder and decoder run."""


def encode_tasks(items: list[TaskItem]) -> bytes:
    """The framed submit/submit_batch messages for these tasks (the C writer when built)."""
    if _c_encode is not None:
        try:
            return _c_encode(items, MAX_BATCH_BYTES)
        except (TypeError, OverflowError):
            pass  # a value the C writer does not take: thriftpy2 says what is wrong with it
    return encode_tasks_py(items)


class TaskFrames:
    """The encoder of a link's tasks (what taskserver.wire.ThriftConnection's `batcher` is)."""

    __slots__ = ()

    def encode(self, items: list[TaskItem]) -> bytes:
        """Framed oneway messages carrying the tasks, in order."""
        return encode_tasks(items)


class ResultFrames:
    """The decoder of one connection's result frames: `decode(frame)` gives the results of a
    oneway result/result_batch frame it takes whole, else None."""

    __slots__ = ("_args", "_decode")

    def __init__(
        self,
        limits: WireLimits,
        report_type: Callable[..., Any] | None = None,
        *,
        implementation: Literal["c", "python"] = IMPLEMENTATION,
    ) -> None:
        if implementation == "c" and _c_decode is None:
            raise RuntimeError("gateway._hotpath is not built")
        self._decode = _c_decode if implementation == "c" else _results_py
        self._args = (
            limits.max_string_bytes,
            limits.max_container_items,
            limits.max_depth,
            MAX_DURATION_MS,
            report_type,
            STATUSES,
        )

    def decode(self, frame: bytes) -> list[ResultItem] | None:
        """The frame's results, or None: the caller decodes it the general way."""
        return self._decode(frame, *self._args)
