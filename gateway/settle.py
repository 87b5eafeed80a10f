"""A frame of results into its queries: each task's outcome, and the frame's counts.

The query path (`QueryPath._record`) hands every frame of results a link decoded here, and
feeds the counts this returns to the CDF book, the miss windows and the metrics once per
frame. `settle_py` is the reference; gateway/_hotpath.c's ``settle`` is its twin, compared
with it on random frames in the tests (tests/unit/test_settle.py), and runs where it is
built. It calls back into Python for the rare parts, in the order the twin does: a task's
wait-estimate error (QLM §6), its tenant's gate, a drop's module (PARD), its span. Given
`RUN_INLINE`, it also does what `QueryRun.complete` does for a QueryRun itself (each task's
outcome into its query, the query decided), without the call; a subclass, or a `complete`
replaced since, is called.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from gateway.queries import OK, QueryRun, TaskOutcome
from taskserver.native import require_native
from taskserver.wire import TaskStatus

if TYPE_CHECKING:
    from gateway.queries import PendingTask

__all__ = ["IMPLEMENTATION", "RUN_INLINE", "Settled", "settle", "settle_py", "take", "take_py"]

Settled = tuple[
    dict[str, int],
    list[float],
    dict[str, list[int]],
    dict[tuple[str, str, int], list[float]],
]
"""A frame's counts by status, the post-queuing times of the tasks that ran (for the CDF
book), [misses, tasks] by class of the tasks that ran, and [tasks ended, service ms summed,
tasks that ran] by request group."""

LABELS = [TaskStatus(i).label for i in range(len(TaskStatus))]
"""TaskStatus -> the API's status name, by index (an IntEnum indexes a list in C)."""
_OK, _DROPPED = TaskStatus.OK, TaskStatus.DROPPED


def settle_py(
    batch: list[tuple[PendingTask, Any]],
    now: float,
    central: bool,
    note_tenants: bool,
    server_id: str,
    pool: str,
    metrics: Any,
    tenants: Any,
    labels: Sequence[str] = LABELS,
    ok: TaskStatus = _OK,
    dropped: TaskStatus = _DROPPED,
    outcome_type: type[TaskOutcome] = TaskOutcome,
) -> Settled:
    """Each (task, report) of one server's frame into its query (`QueryRun.complete`), in
    order; `metrics` and `tenants` are told what only a single task can say."""
    statuses: dict[str, int] = {}
    post_queue: list[float] = []
    by_class: dict[str, list[int]] = {}
    by_group: dict[tuple[str, str, int], list[float]] = {}
    last_group: tuple[str, str, int] | None = None
    ended: list[float] = []
    for p, r in batch:
        # TaskReport is a tuple: unpacked at once, this runs once per task.
        code, r_queue_ms, service_ms, server_ms, r_missed, result, error = r
        status = labels[code]
        if central:
            # The dequeue happened here, when the task was sent (TailGuard §III.C.2).
            post_queue_ms = (now - p.sent_s) * 1000.0
            queue_ms = p.gateway_queue_ms + r_queue_ms
            missed = bool(p.missed_deadline)
        else:
            # No shared clock: split the round trip into server time and network time,
            # and charge the server's post-dequeue part plus the return half.
            net_ms = (now - p.sent_s) * 1000.0 - server_ms
            if net_ms < 0.0:
                net_ms = 0.0
            post_queue_ms = (server_ms - r_queue_ms) + net_ms / 2.0
            queue_ms = r_queue_ms + net_ms / 2.0
            missed = bool(r_missed)
        statuses[status] = statuses.get(status, 0) + 1
        est_wait_ms = p.est_wait_ms
        ran = code is ok
        if ran:
            if est_wait_ms is not None:
                # The server's own queue wait (server queueing: no network in it).
                metrics.wait_estimate_error(pool, queue_ms if central else r_queue_ms, est_wait_ms)
            post_queue.append(post_queue_ms)
            cls = p.class_name
            counts = by_class.get(cls)
            if counts is None:
                counts = by_class[cls] = [0, 0]
            counts[0] += missed
            counts[1] += 1
            if note_tenants:
                tenants.note_task(p.flow, missed, cls)
        elif code is dropped:
            metrics.task_dropped(pool, error)
        # Positional: this runs once per task (field order of TaskOutcome).
        outcome = outcome_type(
            server_id,
            status,
            queue_ms,
            service_ms,
            post_queue_ms,
            server_ms,
            missed,
            result,
            error,
            est_wait_ms,
            p.retries,
        )
        if p.trace is not None:
            p.trace.end(
                status,
                server_id,
                p.retries,
                queue_ms=queue_ms,
                service_ms=service_ms,
                missed=missed,
                error=error,
            )
        run = p.run
        run.complete(p.index, outcome, now)
        group = run.group
        if group is not None:
            if group != last_group:  # the tasks of a frame are mostly of one group
                ended = by_group.get(group)  # type: ignore[assignment]
                if ended is None:
                    ended = by_group[group] = [0, 0.0, 0]
                last_group = group
            ended[0] += 1
            if ran and 0.0 <= service_ms < math.inf:
                ended[1] += service_ms
                ended[2] += 1
    return statuses, post_queue, by_class, by_group


def take_py(
    items: list[tuple[str, int, Any]], outstanding: dict[str, PendingTask], rejected: TaskStatus
) -> tuple[list[tuple[PendingTask, Any]], bool]:
    """The (task, report) of each decoded result (query id, task index, report) whose task
    is outstanding, taken out of `outstanding`, in order; and whether any report's status
    is `rejected`. A result for no task outstanding is dropped: its query already ended
    (failed, timed out, or cancelled)."""
    batch: list[tuple[PendingTask, Any]] = []
    refused = False
    for query_id, index, report in items:
        p = outstanding.get(query_id)
        if p is None or p.index != index:
            continue
        del outstanding[query_id]
        if report[0] is rejected:
            refused = True
        batch.append((p, report))
    return batch, refused


try:
    require_native()  # TAILGATE_PURE_PYTHON=1: the Python twins
    from gateway._hotpath import settle as _c_settle
    from gateway._hotpath import take as _c_take
except ImportError:  # built at install when a C compiler is there; the Python above otherwise
    _c_settle = _c_take = None

IMPLEMENTATION: Literal["c", "python"] = "python" if _c_settle is None else "c"
"""Which one runs."""

RUN_INLINE = (QueryRun, QueryRun.complete, OK)
"""What the C side needs to run `QueryRun.complete` itself for a QueryRun (the class, the
function it replaces, checked on each call, and the status it counts as success)."""


def settle(
    batch: list[tuple[PendingTask, Any]],
    now: float,
    central: bool,
    note_tenants: bool,
    server_id: str,
    pool: str,
    metrics: Any,
    tenants: Any,
) -> Settled:
    """`settle_py`, in C where it is built (a frame the C side declines: in Python)."""
    if _c_settle is not None:
        settled = _c_settle(
            batch, now, central, note_tenants, server_id, pool, metrics, tenants,
            LABELS, _OK, _DROPPED, TaskOutcome, RUN_INLINE,
        )  # fmt: skip
        if settled is not None:
            return settled
    return settle_py(batch, now, central, note_tenants, server_id, pool, metrics, tenants)


def take(
    items: list[tuple[str, int, Any]], outstanding: dict[str, PendingTask], rejected: TaskStatus
) -> tuple[list[tuple[PendingTask, Any]], bool]:
    """`take_py`, in C where it is built (items the C side declines: in Python)."""
    if _c_take is not None:
        taken = _c_take(items, outstanding, rejected)
        if taken is not None:
            return taken
    return take_py(items, outstanding, rejected)
