"""The gateway's spans: one per query, one per task (OpenTelemetry, the `tracing` extra).

A query is a ``tailgate.query`` span (kind SERVER), a child of the caller's traceparent when
it sent a valid one, from the query's arrival to its answer; attributes ``tailgate.class``,
``.pool``, ``.fanout``, ``.slo_ms``, ``.query_id``, ``.request_id`` and, at the end,
``.outcome``. Each of its tasks is a ``tailgate.task`` span (kind CLIENT) from dispatch to
outcome, with ``tailgate.server_id``, ``.task_index``, ``.deadline_budget_ms`` (T_b) and, at
the end, ``.outcome``, ``.retries``, ``.queue_ms``, ``.service_ms``, ``.missed_deadline``; a
retry on another server adds a ``retry`` event. The task span's context travels to the task
server in the Task message, which hangs its queue-wait and service spans under it
(taskserver.tracing), so the straggler of a fanout is the longest task span of the trace.
A multi-query request is a ``tailgate.request`` span whose stages are its query spans.

The query path holds a `GatewayTracer` only when tracing is on; off, it tests one attribute
per task and makes no span object and no string.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taskserver.tracecontext import TraceParent
from taskserver.tracing import Tracing, TracingConfig, open_tracing, parent_context

__all__ = ["Caller", "GatewayTracer", "QuerySpan", "TaskSpan", "open_gateway_tracer"]


@dataclass(slots=True)
class Caller:
    """Who asked, as the HTTP request said it: its request id and its trace context.

    `answered_as` is set to the gateway's own span context (a traceparent value) by whoever
    makes the span for the request, for the answer's `traceparent` header.
    """

    request_id: str
    parent: TraceParent | None = None
    tracestate: str | None = None
    answered_as: str | None = None


def _traceparent(span: Any) -> str:
    sc = span.get_span_context()
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags) & 0xFF:02x}"


def _error(span: Any, message: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, message))


class TaskSpan:
    """A task's span, from dispatch to outcome; its context goes out with the task."""

    __slots__ = ("_ended", "_span", "traceparent", "tracestate")

    def __init__(self, span: Any, tracestate: str | None) -> None:
        self._span = span
        self._ended = False
        self.traceparent = _traceparent(span)
        """This span as a traceparent: the task server's spans are its children."""
        self.tracestate = tracestate

    def retried(self, server_id: str) -> None:
        """A busy server sent the task back and it went to `server_id` (Swayam §4.5)."""
        self._span.add_event("retry", {"tailgate.server_id": server_id})

    def end(
        self,
        outcome: str,
        server_id: str,
        retries: int,
        *,
        queue_ms: float | None = None,
        service_ms: float | None = None,
        missed: bool | None = None,
        error: str | None = None,
    ) -> None:
        """The task's outcome (once; later calls do nothing)."""
        if self._ended:
            return
        self._ended = True
        span = self._span
        span.set_attribute("tailgate.outcome", outcome)
        span.set_attribute("tailgate.server_id", server_id)
        span.set_attribute("tailgate.retries", retries)
        if queue_ms is not None:
            span.set_attribute("tailgate.queue_ms", queue_ms)
        if service_ms is not None:
            span.set_attribute("tailgate.service_ms", service_ms)
        if missed is not None:
            span.set_attribute("tailgate.missed_deadline", missed)
        if outcome != "ok":
            _error(span, error or outcome)
        span.end()


class QuerySpan:
    """A query's (or a multi-query request's) span, with its tasks' spans as children."""

    __slots__ = ("_context", "_ended", "_span", "_tasks", "_tracer", "traceparent", "tracestate")

    def __init__(self, tracer: Any, span: Any, tracestate: str | None) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context

        self._tracer = tracer
        self._span = span
        self._context = trace.set_span_in_context(span, Context())
        self._ended = False
        self._tasks: dict[int, TaskSpan] = {}
        self.traceparent = _traceparent(span)
        """This span as a traceparent (the answer's header, the parent of stage queries)."""
        self.tracestate = tracestate

    def describe(self, cls: str, pool: str, fanout: int, query_id: str) -> None:
        """What is known once the query has its servers."""
        span = self._span
        span.set_attribute("tailgate.class", cls)
        span.set_attribute("tailgate.pool", pool)
        span.set_attribute("tailgate.fanout", fanout)
        span.set_attribute("tailgate.query_id", query_id)

    def task(self, index: int, server_id: str, budget_ms: float) -> TaskSpan:
        """Start the span of task `index`, sent to `server_id` with task budget T_b."""
        from opentelemetry.trace import SpanKind

        span = self._tracer.start_span(
            "tailgate.task",
            context=self._context,
            kind=SpanKind.CLIENT,
            attributes={
                "tailgate.task_index": index,
                "tailgate.server_id": server_id,
                "tailgate.deadline_budget_ms": budget_ms,
            },
        )
        task = self._tasks[index] = TaskSpan(span, self.tracestate)
        return task

    def end_task(self, index: int, outcome: str, server_id: str, retries: int, error: str) -> None:
        """End task `index`'s span, if it has one, as given up (cancelled, timed out)."""
        task = self._tasks.get(index)
        if task is not None:
            task.end(outcome, server_id, retries, error=error)

    def end(self, outcome: str, error: str | None = None) -> None:
        """How the query ended (once): a QueryOutcome's value or an error code."""
        if self._ended:
            return
        self._ended = True
        self._span.set_attribute("tailgate.outcome", outcome)
        if error is not None:
            _error(self._span, error)
        self._span.end()


class GatewayTracer:
    """Starts the gateway's query and request spans (tracing on)."""

    def __init__(self, tracing: Tracing, clock: Callable[[], float]) -> None:
        self.tracing = tracing
        self._tracer = tracing.tracer
        self._clock = clock

    def _start(
        self, name: str, caller: Caller | None, t0: float, attributes: dict[str, Any]
    ) -> QuerySpan:
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind

        parent, tracestate = None, None
        if caller is not None:
            if caller.request_id:
                attributes["tailgate.request_id"] = caller.request_id
            if caller.parent is not None:
                tracestate = caller.tracestate
                parent = parent_context(caller.parent, tracestate)
        # Started at the query's arrival (t0 on the service clock), placed on the wall clock.
        start_ns = time.time_ns() - int((self._clock() - t0) * 1e9)
        span = self._tracer.start_span(
            name,
            context=parent if parent is not None else Context(),
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=start_ns,
        )
        qs = QuerySpan(self._tracer, span, tracestate)
        if caller is not None:
            caller.answered_as = qs.traceparent
        return qs

    def query(self, caller: Caller | None, t0: float, slo_ms: float) -> QuerySpan:
        """The span of a query that arrived at t0 (service clock)."""
        return self._start("tailgate.query", caller, t0, {"tailgate.slo_ms": slo_ms})

    def request(self, caller: Caller | None, t0: float, slo_ms: float, stages: int) -> QuerySpan:
        """The span of a multi-query request (its stages' query spans are its children)."""
        attributes = {"tailgate.slo_ms": slo_ms, "tailgate.stages": stages}
        return self._start("tailgate.request", caller, t0, attributes)

    def shutdown(self) -> None:
        """Export what is batched and stop (the gateway is stopping)."""
        self.tracing.shutdown()


def open_gateway_tracer(config: TracingConfig, clock: Callable[[], float]) -> GatewayTracer | None:
    """The gateway's tracer when tracing is enabled (ConfigError without the extra)."""
    if not config.enabled:
        return None
    return GatewayTracer(open_tracing(config, "tailgate-gateway", "tailgate.gateway"), clock)
