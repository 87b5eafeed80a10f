"""Distributed tracing with OpenTelemetry (the optional `tracing` extra), OTLP over HTTP.

Off by default, and then nothing of OpenTelemetry is imported and nothing is done per task.
On (``[tracing] enabled = true``), a process opens one tracer provider that exports spans in
batches to an OTLP/HTTP endpoint (Jaeger, Tempo, an OpenTelemetry Collector: port 4318).
The gateway makes a span per query and one per task (gateway.tracing); the task's span
context travels in the Task message (`traceparent`, `tracestate` in tailgate.thrift), and
the task server records the task's queue wait and its service as two child spans of it
(`TaskSpans`), timed by the task server's own clock: hosts share no clock, and a span's
start and end come from one host each.

Configuration (`TracingConfig`, the ``[tracing]`` table, shared by the gateway and the task
servers) is completed from the OpenTelemetry environment by the loader (`with_env`); the
exporter's other settings (``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TIMEOUT``,
``..._COMPRESSION``, ``..._CERTIFICATE``), ``OTEL_BSP_*`` and ``OTEL_RESOURCE_ATTRIBUTES`` are
read by the SDK itself when the provider opens.

Enabled without the extra installed, `open_tracing` raises one ConfigError naming the key
and the install command: a process that was asked to trace does not start untraced.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from taskserver.tomlconfig import ConfigError
from taskserver.tracecontext import (
    TRACEPARENT_CHARS,
    TraceParent,
    parse_traceparent,
    parse_tracestate,
)

__all__ = ["TaskSpans", "Tracing", "TracingConfig", "open_tracing", "parent_context", "with_env"]

DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
"""OTLP/HTTP's default traces endpoint (the SDK's own default too)."""
INSTALL_HINT = "pip install -e '.[tracing]'"


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """The ``[tracing]`` table: OpenTelemetry spans of queries and tasks, exported by OTLP."""

    enabled: bool = False
    """Trace queries and tasks (needs the `tracing` extra)."""
    otlp_endpoint: str = ""
    """OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces; "" takes
    $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces,
    else http://localhost:4318/v1/traces."""
    service_name: str = ""
    """service.name of the spans; "" takes $OTEL_SERVICE_NAME, else tailgate-gateway or
    tailgate-taskserver."""
    sample_ratio: float = 1.0
    """Share of new traces recorded (0..1); a caller's traceparent decides for its own trace
    (its sampled flag)."""

    def __post_init__(self) -> None:
        if self.otlp_endpoint and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise ValueError(
                f"otlp_endpoint: expected an http:// or https:// URL (OTLP over HTTP), "
                f"got {self.otlp_endpoint!r}"
            )
        if not (math.isfinite(self.sample_ratio) and 0.0 <= self.sample_ratio <= 1.0):
            raise ValueError(f"sample_ratio: must be in 0..1, got {self.sample_ratio}")

    def endpoint(self) -> str:
        """The traces URL spans go to."""
        return self.otlp_endpoint or DEFAULT_ENDPOINT


def with_env(config: TracingConfig, env: Mapping[str, str]) -> TracingConfig:
    """`config` completed from the OpenTelemetry environment (the loader calls it once).

    OTEL_SDK_DISABLED=true turns tracing off; OTEL_SERVICE_NAME and the OTLP endpoints fill
    what the file leaves empty (the file wins); an OTLP protocol other than http/protobuf is
    refused, since only the OTLP/HTTP exporter is used.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return replace(config, enabled=False)
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = env.get(name, "").strip()
        if protocol:
            if config.enabled and protocol != "http/protobuf":
                raise ConfigError(
                    name, f"only http/protobuf is supported (OTLP over HTTP), got {protocol!r}"
                )
            break
    changes: dict[str, str] = {}
    if not config.service_name and env.get("OTEL_SERVICE_NAME", "").strip():
        changes["service_name"] = env["OTEL_SERVICE_NAME"].strip()
    if not config.otlp_endpoint:
        traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        if traces:
            changes["otlp_endpoint"] = traces
        elif base:
            changes["otlp_endpoint"] = base.rstrip("/") + "/v1/traces"
    if not changes:
        return config
    try:
        return replace(config, **changes)
    except ValueError as exc:
        raise ConfigError("OTEL_EXPORTER_OTLP_ENDPOINT", str(exc)) from None


class Tracing:
    """One process's tracer provider (batching, OTLP/HTTP export) and its tracer."""

    __slots__ = ("_provider", "service_name", "tracer")

    def __init__(self, provider: Any, tracer: Any, service_name: str) -> None:
        self._provider = provider
        self.tracer = tracer
        """The OpenTelemetry tracer spans are started with."""
        self.service_name = service_name

    def shutdown(self) -> None:
        """Export what is still batched, then stop the exporter (at process exit)."""
        self._provider.shutdown()


def open_tracing(config: TracingConfig, default_service: str, scope: str) -> Tracing:
    """A tracer provider exporting to the configured OTLP/HTTP endpoint; ConfigError when the
    `tracing` extra is not installed."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise ConfigError(
            "tracing.enabled",
            f"true needs the OpenTelemetry SDK and its OTLP/HTTP exporter, which do not import "
            f"here ({exc}): {INSTALL_HINT}",
        ) from None
    name = config.service_name or default_service
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: name}),
        sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint())))
    return Tracing(provider, provider.get_tracer(scope), name)


def parent_context(tp: TraceParent, tracestate: str | None) -> Any:
    """An OpenTelemetry context whose (remote) parent is the span a traceparent names, with a
    valid tracestate. Call only with tracing on (it imports the SDK)."""
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    state = TraceState.from_header([tracestate]) if tracestate else None
    span_context = SpanContext(
        trace_id=int(tp.trace_id, 16),
        span_id=int(tp.parent_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(tp.flags & 0xFF),
        trace_state=state,
    )
    return trace.set_span_in_context(NonRecordingSpan(span_context), Context())


class TaskSpans:
    """The task server's spans of a traced task: its queue wait (receipt to dequeue) and its
    service (dequeue to executor done), children of the gateway's span for the task.

    Recorded when the task's outcome is sent, from the durations the result reports, so the
    hot path is unchanged: an untraced task costs one attribute test. Times are this host's:
    a local monotonic reading is placed on the wall clock once per task.
    """

    __slots__ = ("_clock", "_tracer", "server_id")

    def __init__(self, tracing: Tracing, server_id: str, clock: Callable[[], float]) -> None:
        self._tracer = tracing.tracer
        self._clock = clock
        self.server_id = server_id

    def record(
        self,
        task: Any,
        outcome: str,
        received_s: float,
        dequeued_s: float,
        service_s: float,
        missed: bool,
        error: str | None,
    ) -> bool:
        """Record the task's spans if it carries a sampled trace context; whether it did.

        The wire carries version-00 traceparents only (55 characters): anything else, and a
        tracestate that is not valid, is ignored, as the W3C spec asks.
        """
        traceparent = task.traceparent
        if type(traceparent) is not str or len(traceparent) != TRACEPARENT_CHARS:
            return False
        tp = parse_traceparent(traceparent)
        if tp is None or not tp.sampled:
            return False
        raw_state = task.tracestate
        tracestate = parse_tracestate(raw_state) if type(raw_state) is str else None
        parent = parent_context(tp, tracestate)
        now_s, now_ns = self._clock(), time.time_ns()

        def wall_ns(t: float) -> int:
            return now_ns - int((now_s - t) * 1e9)

        attributes = {
            "tailgate.server_id": self.server_id,
            "tailgate.query_id": str(task.query_id),
            "tailgate.task_index": int(task.task_index),
            "tailgate.outcome": outcome,
            "tailgate.missed_deadline": missed,
        }
        if isinstance(task.deadline_budget_ms, float):
            attributes["tailgate.deadline_budget_ms"] = task.deadline_budget_ms
        queue = self._tracer.start_span(
            "tailgate.task.queue_wait",
            context=parent,
            start_time=wall_ns(received_s),
            attributes=attributes,
        )
        # The queue wait failed only for a task that never ran (rejected, expired, cancelled).
        self._end(queue, wall_ns(dequeued_s), "ok" if service_s > 0.0 else outcome, error)
        if service_s > 0.0:
            service = self._tracer.start_span(
                "tailgate.task.service",
                context=parent,
                start_time=wall_ns(dequeued_s),
                attributes=attributes,
            )
            self._end(service, wall_ns(dequeued_s + service_s), outcome, error)
        return True

    @staticmethod
    def _end(span: Any, end_ns: int, outcome: str, error: str | None) -> None:
        if outcome != "ok":
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error or outcome))
        span.end(end_time=end_ns)
