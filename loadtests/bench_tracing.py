"""What tracing costs per task, on the caller's thread: ``python -m loadtests.bench_tracing``.

Tracing on, each task costs the gateway a `tailgate.task` span (started at dispatch with its
traceparent formatted for the wire, ended with its outcome) and the task server its
`queue_wait` and `service` spans. Spans go to the SDK's BatchSpanProcessor, as in service;
its exporter here drops them, so what is timed is the work on the event loop's thread, not
the export (a background thread's, batched). Tracing off, the same paths test one attribute.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from gateway.tracing import Caller, GatewayTracer
from taskserver.tracecontext import TraceParent
from taskserver.tracing import TaskSpans, Tracing
from taskserver.wire import thrift


class _Dropped(SpanExporter):
    """Takes every batch and keeps nothing: the export is not what is measured."""

    def export(self, spans: Sequence[object]) -> SpanExportResult:  # type: ignore[override]
        return SpanExportResult.SUCCESS


def _per_call_us(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    """Print the per-task cost of tracing on the gateway and on a task server."""
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench_tracing")
    parser.add_argument("-n", type=int, default=20_000, help="tasks per round (20000)")
    args = parser.parse_args(argv)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Dropped(), max_queue_size=1 << 16))
    tracing = Tracing(provider, provider.get_tracer("bench"), "bench")
    clock = time.perf_counter
    tracer = GatewayTracer(tracing, clock)
    caller = Caller("bench", TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"))
    query = tracer.query(caller, clock(), 100.0)

    def gateway_task() -> None:
        span = query.task(0, "ts-1", 42.0)
        span.end("ok", "ts-1", 0, queue_ms=1.0, service_ms=2.0, missed=False)

    task = thrift().Task("q", 0, 40.0, 90.0, 0, "A", b"{}", query.traceparent, None)
    spans = TaskSpans(tracing, "ts-1", clock)

    def server_task() -> None:
        now = clock()
        spans.record(task, "ok", now - 0.003, now - 0.002, 0.002, False, None)

    class _Off:
        trace = None

    off = _Off()

    def untraced() -> None:
        if off.trace is not None:
            raise AssertionError

    rows = [
        ("gateway, per task (task span)", _per_call_us(gateway_task, args.n)),
        ("task server, per task (2 spans)", _per_call_us(server_task, args.n)),
        ("tracing off, per test", _per_call_us(untraced, args.n)),
    ]
    for name, us in rows:
        print(f"{name:34s} {us:8.2f} us")
    provider.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
