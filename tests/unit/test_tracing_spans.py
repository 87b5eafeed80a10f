"""The spans of a query, its tasks and the task servers' queue wait and service, recorded
by the OpenTelemetry SDK's in-memory exporter (the query path with fake links and a fake
clock; the task server's span recorder on wire Task structs)."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.tracing import Caller, GatewayTracer
from taskserver.tracecontext import TraceParent, parse_traceparent
from taskserver.tracing import TaskSpans, Tracing
from taskserver.wire import TaskStatus, thrift
from tests.unit.test_query_path import _query, _service, _started

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def _in_memory() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider, provider.get_tracer("tests"), "tests"), exporter


def _task(traceparent: Any = f"00-{TRACE}-{SPAN}-01", tracestate: Any = "rojo=1") -> Any:
    return thrift().Task("gw-q7", 2, 40.0, 90.0, 0, "A", b"{}", traceparent, tracestate)


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def test_queue_wait_and_service_are_children_of_the_gateway_task_span() -> None:
    tracing, exporter = _in_memory()
    spans = TaskSpans(tracing, "ts-3", clock=lambda: 10.0)
    assert spans.record(_task(), "ok", 9.0, 9.25, 0.5, True, None)
    got = _by_name(exporter.get_finished_spans())
    assert set(got) == {"tailgate.task.queue_wait", "tailgate.task.service"}
    for span in got.values():
        assert span.context is not None and span.parent is not None
        assert span.context.trace_id == int(TRACE, 16)
        assert span.parent.span_id == int(SPAN, 16) and span.parent.is_remote
        assert span.context.trace_state.get("rojo") == "1"
        assert span.attributes is not None
        assert span.attributes["tailgate.server_id"] == "ts-3"
        assert span.attributes["tailgate.query_id"] == "gw-q7"
        assert span.attributes["tailgate.task_index"] == 2
        assert span.attributes["tailgate.missed_deadline"] is True
        assert span.status.status_code is StatusCode.UNSET
    queue, service = got["tailgate.task.queue_wait"], got["tailgate.task.service"]
    # Timed by this host's clock: receipt 9.0 s, dequeue 9.25 s, done 9.75 s.
    assert queue.end_time - queue.start_time == 250_000_000  # type: ignore[operator]
    assert service.start_time == queue.end_time
    assert service.end_time - service.start_time == 500_000_000  # type: ignore[operator]


def test_a_task_that_never_ran_is_one_failed_queue_span() -> None:
    tracing, exporter = _in_memory()
    spans = TaskSpans(tracing, "ts-1", clock=lambda: 3.0)
    assert spans.record(_task(), "rejected", 3.0, 3.0, 0.0, False, "server is draining")
    (span,) = exporter.get_finished_spans()
    assert span.name == "tailgate.task.queue_wait"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "server is draining"


def test_no_span_without_a_sampled_valid_trace_context() -> None:
    tracing, exporter = _in_memory()
    spans = TaskSpans(tracing, "ts-1", clock=lambda: 3.0)
    for task in (
        _task(None, None),  # an untraced task (tracing off at the gateway, or an old one)
        _task(f"00-{TRACE}-{SPAN}-00"),  # the caller does not record this trace
        _task(f"00-{TRACE}-{'0' * 16}-01"),  # invalid
        _task(f"00-{TRACE}-{SPAN}-01" + "x" * 10_000),  # not the 55 characters of version 00
        _task(f"00-{TRACE}-{SPAN}-01".encode()),  # not UTF-8 text as sent: bytes
    ):
        assert not spans.record(task, "ok", 1.0, 2.0, 0.5, False, None)
    assert exporter.get_finished_spans() == ()
    # A tracestate that is not valid is dropped; the spans are still made.
    assert spans.record(_task(tracestate="Bad Key=1"), "ok", 1.0, 2.0, 0.5, False, None)
    assert all(len(s.context.trace_state) == 0 for s in exporter.get_finished_spans())  # type: ignore[union-attr]


async def test_a_query_is_one_span_with_a_span_per_task() -> None:
    svc, clock, links = await _service(3)
    tracing, exporter = _in_memory()
    svc.query.tracer = GatewayTracer(tracing, clock)
    caller = Caller("req-42", TraceParent(TRACE, SPAN, 1), "rojo=1")
    task = asyncio.create_task(svc.run_query(_query(3), clock(), caller))
    for _ in range(5):
        await asyncio.sleep(0)
    sent = [p for lk in links for p in lk.sent]
    assert len(sent) == 3 and all(p.trace is not None for p in sent)
    links[0].answer(clock)
    links[1].answer(clock, TaskStatus.FAILED, error="boom")
    answer = await task
    assert answer.outcome.value == "failed"

    spans = exporter.get_finished_spans()
    (query,) = [s for s in spans if s.name == "tailgate.query"]
    tasks = [s for s in spans if s.name == "tailgate.task"]
    assert len(tasks) == 3
    assert query.kind is SpanKind.SERVER and query.context is not None
    assert query.context.trace_id == int(TRACE, 16)  # the caller's trace goes on
    assert query.parent is not None and query.parent.span_id == int(SPAN, 16)
    assert query.attributes is not None
    assert dict(query.attributes) == {
        "tailgate.slo_ms": 300.0,
        "tailgate.request_id": "req-42",
        "tailgate.class": "B",
        "tailgate.pool": "default",
        "tailgate.fanout": 3,
        "tailgate.query_id": answer.summary["query_id"],
        "tailgate.outcome": "failed",
    }
    assert query.status.status_code is StatusCode.ERROR
    # The answer's traceparent names the query span.
    assert caller.answered_as == (f"00-{TRACE}-{query.context.span_id:016x}-01")
    by_index = {s.attributes["tailgate.task_index"]: s for s in tasks}  # type: ignore[index]
    for p in sent:
        span = by_index[p.index]
        assert span.kind is SpanKind.CLIENT
        assert span.parent is not None and span.parent.span_id == query.context.span_id
        # What goes out with the task names this task's span.
        assert p.trace is not None
        assert parse_traceparent(p.trace.traceparent) == TraceParent(
            TRACE,
            f"{span.context.span_id:016x}",
            1,  # type: ignore[union-attr]
        )
        assert p.trace.tracestate == "rojo=1"
        assert span.attributes["tailgate.server_id"] == p.server_id  # type: ignore[index]
        assert span.attributes["tailgate.deadline_budget_ms"] > 0  # type: ignore[index,operator]
    outcomes = {s.attributes["tailgate.outcome"] for s in tasks}  # type: ignore[index]
    assert outcomes == {"ok", "failed", "cancelled"}  # the third was cancelled as a sibling
    ok = next(s for s in tasks if s.attributes["tailgate.outcome"] == "ok")  # type: ignore[index]
    assert ok.attributes["tailgate.service_ms"] == 5.0  # type: ignore[index]
    assert ok.attributes["tailgate.retries"] == 0  # type: ignore[index]


async def test_tracing_off_makes_no_span_and_sends_no_context() -> None:
    svc, clock, links = await _service(2)
    assert svc.query.tracer is None
    task = await _started(svc, _query(2))
    sent = [p for lk in links for p in lk.sent]
    assert len(sent) == 2 and all(p.trace is None for p in sent)
    for lk in links:
        lk.answer(clock)
    assert (await task).outcome.value == "met"
