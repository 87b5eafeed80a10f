"""A query in flight: its tasks' outcomes and the moment it is decided."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import orjson

from taskserver import jsonbody
from taskserver.native import require_native
from taskserver.wire import TaskStatus

if TYPE_CHECKING:
    from gateway.tracing import TaskSpan

# Task outcome statuses as the API reports them: the IDL's TaskStatus in lower case, and two
# of the gateway's own (the server was lost; the query's deadline bound passed).
OK = TaskStatus.OK.label
FAILED = TaskStatus.FAILED.label
CANCELLED = TaskStatus.CANCELLED.label
REJECTED = TaskStatus.REJECTED.label
DROPPED = TaskStatus.DROPPED.label
LOST = "lost"
TIMEOUT = "timeout"


class QueryOutcome(StrEnum):
    """How a query ended; the HTTP shell (gateway.app) picks the status for each."""

    MET = "met"
    """Every task OK, within the SLO."""
    MISSED_SLO = "missed_slo"
    """Every task OK, later than the SLO."""
    DROPPED = "dropped"
    """A task was dropped on purpose (PARD): it could not meet its deadline."""
    DRAINING = "draining"
    """The gateway stopped before the query completed."""
    TIMEOUT = "timeout"
    """Not complete at SLO + grace."""
    REJECTED = "rejected"
    """Every task at fault was refused by its server (draining, queue full...)."""
    FAILED = "failed"
    """A task failed or its server was lost."""
    INVALID = "invalid"
    """Every task at fault failed as invalid (taskserver.abc.InvalidTask: the client's
    payload, its field named by the server): a client error, not a server's failure."""

    @property
    def metric(self) -> str:
        """The `outcome` label of tailgate_queries_total."""
        return "rejected" if self is QueryOutcome.DRAINING else self.value

    @property
    def may_retry(self) -> bool:
        """A later try may succeed: the answer is 503 with Retry-After."""
        return self in (QueryOutcome.DROPPED, QueryOutcome.DRAINING, QueryOutcome.REJECTED)


@dataclass(slots=True)
class TaskOutcome:
    """What happened to one task, with its timings in milliseconds."""

    server: str
    status: str
    queue_ms: float | None = None
    service_ms: float | None = None
    post_queue_ms: float | None = None
    server_ms: float | None = None
    missed_deadline: bool | None = None
    result: bytes | None = None
    """The executor's raw result (JSON for the built-in executors)."""
    error: str | None = None
    estimated_wait_ms: float | None = None
    """The queue wait estimated for it before dispatch (QLM §6), when estimates were made."""
    retries: int = 0
    """Times it was sent to another server after one refused it busy (Swayam §4.5); its
    timings are the last try's."""

    def to_json(self) -> dict[str, Any]:
        """The task's entry in the query answer."""
        return self.entry(decode_result(self.result))

    def entry(self, result: Any) -> dict[str, Any]:
        """The task's entry in the query answer, with its result already rendered."""
        # Once per task of every answer: _ms inlined (a task that ran has all four timings).
        q, s, p, t = self.queue_ms, self.service_ms, self.post_queue_ms, self.server_ms
        out: dict[str, Any] = {
            "server": self.server,
            "status": self.status,
            "queue_ms": None if q is None else round(q, 4),
            "service_ms": None if s is None else round(s, 4),
            "post_queue_ms": None if p is None else round(p, 4),
            "server_ms": None if t is None else round(t, 4),
            "missed_deadline": self.missed_deadline,
            "result": result,
        }
        if self.error is not None:
            out["error"] = self.error
        if self.estimated_wait_ms is not None:
            out["estimated_wait_ms"] = _ms(self.estimated_wait_ms)
        if self.retries:
            out["retries"] = self.retries
        return out


def _ms(v: float | None) -> float | None:
    """Milliseconds to 0.1 µs: finer digits are clock noise."""
    return None if v is None else round(v, 4)


def decode_result(raw: bytes | None) -> Any:
    """A task result as JSON when it is JSON, else as text (decoded only for the answer)."""
    if not raw:
        return None
    try:
        return jsonbody.loads(raw)
    except jsonbody.JsonError:  # not JSON, or nested too deeply to render
        return {"raw": raw.decode("utf-8", "replace")}


def render_answer(
    head: Mapping[str, Any], outcomes: Iterable[TaskOutcome], tail: Mapping[str, Any]
) -> bytes:
    """A query answer as JSON bytes: `head`'s keys, every task's entry under "tasks", then
    `tail`'s. Each distinct result is read once, and one that is JSON goes into the answer
    as its server wrote it (checked, not decoded and encoded again). The tasks are written
    by gateway/_hotpath.c where it is built (`render_tasks`, the same bytes as
    `render_answer_py`, without a dict per task)."""
    outcomes = list(outcomes)
    if _c_render is not None:
        try:
            tasks = _c_render(outcomes, *_C_RENDER_ARGS)
            if tasks is not None:
                return orjson.dumps({**head, "tasks": orjson.Fragment(tasks), **tail})
        except TypeError:
            # What orjson refuses (a string with a lone surrogate): the standard library's.
            return _render_stdlib(head, outcomes, tail)
    return render_answer_py(head, outcomes, tail)


def render_answer_py(
    head: Mapping[str, Any], outcomes: list[TaskOutcome], tail: Mapping[str, Any]
) -> bytes:
    """render_answer in Python: a dict per task entry (TaskOutcome.entry), then orjson."""
    seen: dict[bytes, Any] = {}
    tasks = []
    try:
        for o in outcomes:
            raw = o.result
            result = None
            if raw:
                result = seen.get(raw)
                if result is None:
                    result = seen[raw] = orjson.Fragment(_embedded_json(raw))
            tasks.append(o.entry(result))
        return orjson.dumps({**head, "tasks": tasks, **tail})
    except TypeError:
        return _render_stdlib(head, outcomes, tail)


def _render_stdlib(
    head: Mapping[str, Any], outcomes: list[TaskOutcome], tail: Mapping[str, Any]
) -> bytes:
    """What orjson refuses and the standard library writes (a string with a lone surrogate,
    from a result only the standard library could read)."""
    body = {**head, "tasks": [o.to_json() for o in outcomes], **tail}
    return json.dumps(body).encode()


def _embedded_json(raw: bytes) -> bytes:
    """A result's JSON text in an answer: its own bytes when they are JSON of at most
    jsonbody.MAX_DEPTH levels, else the JSON of what `decode_result` reads (TypeError where
    orjson cannot write that)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:  # not strict JSON (NaN, a lone surrogate, ...) or not JSON
        return orjson.dumps(decode_result(raw))
    if raw.count(b"[") + raw.count(b"{") > jsonbody.MAX_DEPTH:
        try:
            jsonbody.check_depth(value)
        except jsonbody.JsonError:
            return orjson.dumps({"raw": raw.decode("utf-8", "replace")})
    return raw


def _json_text(s: str) -> bytes:
    """A string as orjson writes it (render_tasks' escapes)."""
    return orjson.dumps(s)


def _json_ms(x: float) -> bytes:
    """round(x, 4) as orjson writes it (render_tasks' ties and large values)."""
    return orjson.dumps(_ms(x))


try:
    require_native()  # TAILGATE_PURE_PYTHON=1: the Python twin
    from gateway._hotpath import render_tasks as _c_render
except ImportError:  # built at install when a C compiler is there; render_answer_py otherwise
    _c_render = None
_C_RENDER_ARGS = (orjson.loads, jsonbody.MAX_DEPTH, _embedded_json, _json_text, _json_ms)


class QueryRun:
    """Collects the outcomes of a query's k_f tasks.

    ``done`` resolves when every task succeeded, or at the first task that did
    not: the query is lost then, and waiting for its siblings only wastes them.
    """

    __slots__ = (
        "done",
        "expired",
        "failed",
        "fanout",
        "group",
        "outcomes",
        "query_id",
        "remaining",
        "t0",
        "t_last",
        "t_sent",
        "timer",
    )

    def __init__(self, query_id: str, fanout: int, t0: float) -> None:
        self.query_id = query_id
        self.fanout = fanout
        self.t0 = t0
        self.t_sent = t0
        """When the last task was handed to its link (dispatch done)."""
        self.t_last = t0
        """When the outcome that decided the query arrived."""
        self.outcomes: list[TaskOutcome | None] = [None] * fanout
        self.group: tuple[str, str, int] | None = None
        """Its request group (class, pool, cost bucket), QLM §4."""
        self.remaining = fanout
        self.failed = False
        self.expired = False
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.timer: asyncio.TimerHandle | None = None
        """Its next deadline timer: at the SLO, then at SLO + grace (gateway.query_path)."""

    def complete(self, index: int, outcome: TaskOutcome, now: float = 0.0) -> None:
        """Record one task's outcome (``now``: when it arrived)."""
        if self.outcomes[index] is not None:
            return
        self.outcomes[index] = outcome
        self.remaining -= 1
        if outcome.status != OK:
            self.failed = True
        if (self.failed or self.remaining == 0) and not self.done.done():
            self.t_last = now
            self.done.set_result(None)

    def expire(self) -> None:
        """SLO + grace has passed: decide the query with what it has."""
        if not self.done.done():
            self.expired = True
            self.done.set_result(None)


@dataclass(slots=True, eq=False)
class PendingTask:
    """A task of a running query, from dispatch until its outcome."""

    run: QueryRun
    index: int
    server_id: str
    deadline_s: float
    """Gateway-local t_D = t0 + T_b (TailGuard eq. (4))."""
    slo_deadline_s: float
    """Gateway-local t0 + SLO (the T-EDFQ key)."""
    priority: int
    class_name: str
    payload: bytes
    enqueued_s: float = 0.0
    sent_s: float = 0.0
    gateway_queue_ms: float = 0.0
    """Central queueing: time spent in the gateway's queue for this server."""
    missed_deadline: bool | None = None
    """Central queueing: decided at the gateway's dequeue; None: the server decides."""
    est_wait_ms: float | None = None
    """The queue wait estimated for it at admission (gateway.waits); None: not estimated."""
    flow: str = ""
    """The allocation layer's flow it belongs to (its tenant or class; gateway.allocation)."""
    cost: float = 1.0
    """Its share of its query's cost (cost units: ms of server time), for the allocation."""
    retries: int = 0
    """Times a busy server sent it back and it went to another one (Swayam §4.5); the same
    object travels, so `server_id` names the server that holds it now."""
    trace: TaskSpan | None = None
    """Its span when tracing is on (gateway.tracing); its context goes out with the task."""
