"""Prometheus metrics of the gateway (always on an injected registry).

The query path only bumps plain counters (dict or list increments, one event-loop
thread); everything else (per-server windows, queue depths, CDF quantiles, the
autoscaler) is read at scrape time by `_GatewayCollector`.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.server_series import MetricSink, ServerSeries, server_text, servers_family
from gateway.server_windows import SERVER_WINDOW_S, ServerMissRatios
from taskserver.metrics import LiteHistogram, register_build_info

if TYPE_CHECKING:
    from gateway.config import ClassConfig
    from gateway.view import GatewayView

QUERY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

_ERROR_BOUNDS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
WAIT_ERROR_BUCKETS_S = (*(-b for b in reversed(_ERROR_BOUNDS_S)), 0.0, *_ERROR_BOUNDS_S)
"""Actual minus estimated queue wait: symmetric around 0, from 0.1 ms to 10 s either way."""

RECENT_LATENCIES = 50_000
"""Answered-query latencies kept per class between two history samples."""
UNNAMED_MODULE = "(unnamed)"
"""The module label of a drop whose error names no pipeline module."""
# The pipeline runtime's drop message (taskserver.pipeline.errors.PipelineDropped):
# "dropped at module <name> (id <id>): <reason>: ...".
_DROPPED_AT = re.compile(r"dropped at module (.+?) \(id ")


def dropped_module(error: str | None) -> str:
    """The pipeline module a DROPPED task's error names (UNNAMED_MODULE when none)."""
    found = _DROPPED_AT.search(error or "")
    return found.group(1) if found else UNNAMED_MODULE


def latency_buckets(slos_ms: Iterable[float]) -> tuple[float, ...]:
    """QUERY_BUCKETS_S with every class SLO (in seconds) added, sorted."""
    return tuple(sorted({*QUERY_BUCKETS_S, *(s / 1000.0 for s in slos_ms)}))


def fanout_bucket(k: int) -> str:
    """Label value for a fanout: 1, 2-9, 10-99, 100-999, 1000+."""
    if k == 1:
        return "1"
    if k < 10:
        return "2-9"
    if k < 100:
        return "10-99"
    if k < 1000:
        return "100-999"
    return "1000+"


class _ServersCollector(Collector):
    def __init__(self, snapshot: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self._snapshot = snapshot
        self.enabled = True
        """Off while GET /metrics renders the family in its slices (server_text)."""

    def collect(self) -> Iterable[GaugeMetricFamily]:
        if not self.enabled:
            return
        counts: dict[tuple[str, str], int] = {}
        for pool, state in self._snapshot():
            counts[(pool, state)] = counts.get((pool, state), 0) + 1
        yield servers_family(counts)


class _TaskCountsCollector(Collector):
    """Per-task counters and per-query gauges kept as plain values on the hot path, exported
    at scrape."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterable[Metric]:
        tasks = CounterMetricFamily(
            "tailgate_tasks", "Task outcomes seen by the gateway.", labels=["pool", "status"]
        )
        for (pool, status), n in sorted(self._m.task_counts.items()):
            tasks.add_metric([pool, status], n)
        yield tasks
        misses = CounterMetricFamily(
            "tailgate_task_deadline_misses",
            "Tasks dequeued after their deadline t_D.",
            labels=["class", "pool"],
        )
        for (cls, pool), n in sorted(self._m.miss_counts.items()):
            misses.add_metric([cls, pool], n)
        yield misses
        drops = CounterMetricFamily(
            "tailgate_task_drops",
            "Tasks a server dropped on purpose (PARD), by pool and the pipeline module that "
            "dropped them (as the task's error names it).",
            labels=["pool", "module"],
        )
        for (pool, module), n in sorted(self._m.drop_counts.items()):
            drops.add_metric([pool, module], n)
        yield drops
        # The error histogram has negative buckets, so it exports no _sum (a falling _sum
        # would read as a counter reset): the two sides' sums are counters of their own.
        estimated = CounterMetricFamily(
            "tailgate_wait_estimated_seconds",
            "Sum of the estimated queue waits behind tailgate_wait_estimate_error_seconds.",
            labels=["pool"],
        )
        actual = CounterMetricFamily(
            "tailgate_wait_actual_seconds",
            "Sum of the actual queue waits behind tailgate_wait_estimate_error_seconds.",
            labels=["pool"],
        )
        for pool, (est_ms, actual_ms) in sorted(self._m.wait_sums_ms.items()):
            estimated.add_metric([pool], est_ms / 1000.0)
            actual.add_metric([pool], actual_ms / 1000.0)
        yield estimated
        yield actual
        unloaded = GaugeMetricFamily(
            "tailgate_unloaded_latency_seconds",
            "Latest x_p^u(k_f) computed for a class and fanout bucket.",
            labels=["class", "fanout"],
        )
        for (cls, bucket), seconds in sorted(self._m.unloaded_s.items()):
            unloaded.add_metric([cls, bucket], seconds)
        yield unloaded
        yield GaugeMetricFamily(
            "tailgate_queries_inflight",
            "Queries dispatched and not yet answered.",
            value=self._m.inflight,
        )


class _GatewayCollector(Collector):
    """Figures read from the gateway service at scrape time, off the query path."""

    def __init__(self, metrics: GatewayMetrics, view: GatewayView) -> None:
        self._m = metrics
        self._view = view
        self.per_server = True
        """Collect the per-server families too (GET /metrics renders them itself:
        gateway.server_series)."""

    def collect(self) -> Iterable[Metric]:
        view, m = self._view, self._m
        now = view.clock()
        windows = m.server_windows
        windows.update(now)
        if self.per_server:
            sink = MetricSink()
            series = ServerSeries(view, windows, now, sink.emit)
            series.take_counts(sorted(windows.counts.items()))
            series.take_links(sorted(view.links.values(), key=lambda lk: lk.server_id))
            yield from sink.families
        pool_ratio = GaugeMetricFamily(
            "tailgate_pool_task_miss_ratio",
            "Task deadline-miss ratio of a pool over the last minute.",
            labels=["pool"],
        )
        for pool in windows.pools():
            pool_ratio.add_metric([pool], windows.pool_ratio(pool, now))
        yield pool_ratio
        yield from _group_metrics(view.groups_view())
        yield from _tenant_metrics(view.tenants_view())
        deferred = CounterMetricFamily(
            "tailgate_queries_deferred",
            "Admission DEFER decisions, by class and reason (a query held twice counts twice).",
            labels=["class", "reason"],
        )
        for (cls, reason), n in sorted(view.gate.controller.deferred.items()):
            deferred.add_metric([cls, reason], n)
        yield deferred
        scaler = view.autoscaler
        replicas = GaugeMetricFamily(
            "tailgate_autoscaler_replicas",
            "Servers of the autoscaled pool now registered.",
            labels=["pool"],
        )
        decisions = CounterMetricFamily(
            "tailgate_autoscaler_decisions",
            "Autoscaler decisions, by action (up, down, hold).",
            labels=["pool", "action"],
        )
        if scaler is not None:
            pool = scaler.config.pool
            replicas.add_metric([pool], scaler.replicas_now())
            for action, n in sorted(scaler.decisions.items()):
                decisions.add_metric([pool, action], n)
        yield replicas
        yield decisions


def _group_metrics(groups: list[dict[str, Any]]) -> Iterable[Metric]:
    """Request groups (QLM §4), as GET /v1/groups shows them."""
    labels = ["class", "pool", "cost_bucket"]
    queries = CounterMetricFamily(
        "tailgate_group_queries",
        "Queries admitted, by request group (class, pool, cost bucket in ms of server time).",
        labels=labels,
    )
    rate = GaugeMetricFamily(
        "tailgate_group_arrival_rate",
        "A request group's query arrival rate over the last ~10 s (per second).",
        labels=labels,
    )
    outstanding = GaugeMetricFamily(
        "tailgate_group_tasks_outstanding",
        "A request group's tasks dispatched and not yet ended.",
        labels=labels,
    )
    drain = GaugeMetricFamily(
        "tailgate_group_estimated_drain_seconds",
        "A request group's outstanding tasks' mean service over its pool's slots.",
        labels=labels,
    )
    for g in groups:
        lo, hi = g["cost_bucket"]
        key = [str(g["class"]), str(g["pool"]), f"{lo:g}-{hi:g}"]
        queries.add_metric(key, g["queries"])
        rate.add_metric(key, g["arrival_rate"])
        outstanding.add_metric(key, g["tasks_outstanding"])
        drain.add_metric(key, g["estimated_drain_ms"] / 1000.0)
    yield queries
    yield rate
    yield outstanding
    yield drain


class GatewayMetrics:
    """The gateway's metrics."""

    def __init__(self, registry: CollectorRegistry, slos_ms: Iterable[float] = ()) -> None:
        """`slos_ms`: the classes' SLOs, which become buckets of the latency histogram so
        that the share of queries within each SLO is exact (not interpolated)."""
        self.registry = registry
        register_build_info(registry, "gateway")
        self.queries = Counter(
            "tailgate_queries_total",
            "Queries answered, by class and outcome "
            "(met, missed_slo, failed, invalid, dropped, timeout, rejected, unreachable).",
            ["class", "outcome"],
            registry=registry,
        )
        self.query_latency = LiteHistogram(
            "tailgate_query_latency_seconds",
            "Query latency from arrival to the last task result.",
            ["class", "fanout"],
            latency_buckets(slos_ms),
            registry,
        )
        self.wait_error = LiteHistogram(
            "tailgate_wait_estimate_error_seconds",
            "Actual minus estimated queue wait of tasks that carried a wait estimate and ran "
            "(status ok), by pool.",
            ["pool"],
            WAIT_ERROR_BUCKETS_S,
            registry,
        )
        self.wait_sums_ms: dict[str, list[float]] = {}
        """pool -> [estimated, actual] queue waits summed over the same tasks, in ms."""
        self.task_counts: dict[tuple[str, str], int] = {}
        """(pool, status) -> tasks; exported as tailgate_tasks_total."""
        self.miss_counts: dict[tuple[str, str], int] = {}
        """(class, pool) -> deadline misses; exported as tailgate_task_deadline_misses_total."""
        self.drop_counts: dict[tuple[str, str], int] = {}
        """(pool, module) -> tasks dropped there; exported as tailgate_task_drops_total."""
        registry.register(_TaskCountsCollector(self))
        self.unloaded_s: dict[tuple[str, str], float] = {}
        """(class, fanout bucket) -> the latest x_p^u(k_f) in seconds; exported as
        tailgate_unloaded_latency_seconds (set per query: a dict store, not a locked gauge)."""
        self._unloaded_keys: dict[tuple[str, int], tuple[str, str]] = {}
        self.admission = Counter(
            "tailgate_admission_rejections_total",
            "Queries rejected by admission control, by class and reason.",
            ["class", "reason"],
            registry=registry,
        )
        self.saved_tasks = Counter(
            "tailgate_tasks_cancelled_after_drop_total",
            "Sibling tasks cancelled because a task of their query was dropped (PARD): work "
            "no server spends on a query that is already lost.",
            ["pool"],
            registry=registry,
        )
        self.task_retries = Counter(
            "tailgate_task_retries_total",
            "Tries of a task on another server of its pool after a server refused it busy "
            "(dispatch retry: Swayam's random dispatch with retries), by pool.",
            ["pool"],
            registry=registry,
        )
        self.wire_violations = Counter(
            "tailgate_wire_violations_total",
            "Connections to task servers closed because the server broke the Thrift protocol, "
            "by server and reason (string_length, container_length, undecodable, ...).",
            ["server", "reason"],
            registry=registry,
        )
        self.inflight = 0
        """Queries dispatched and not yet answered (tailgate_queries_inflight)."""
        self.server_windows = ServerMissRatios()
        """Per-server and per-pool task counts and windows."""
        self._collector: _GatewayCollector | None = None
        self._servers: _ServersCollector | None = None
        self._servers_of_view = False
        # labels() validates and locks on every call: the query path's children, found once.
        self._query_children: dict[tuple[str, str], Any] = {}
        self._unloaded_children: dict[tuple[str, int], Any] = {}
        self.recent_latency_ms: dict[str, deque[float]] = {}
        """Class -> latencies of answered queries since the history sampler last drained them."""

    def count_query(self, cls: str, outcome: str) -> None:
        """Count one query answered (tailgate_queries_total), its child looked up once."""
        key = (cls, outcome)
        child = self._query_children.get(key)
        if child is None:
            child = self._query_children[key] = self.queries.labels(cls, outcome)
        child.inc()

    def set_unloaded(self, cls: str, fanout: int, unloaded_ms: float) -> None:
        """The x_p^u(k_f) just computed for a query of this class and fanout."""
        key = self._unloaded_keys.get((cls, fanout))
        if key is None:
            key = self._unloaded_keys[(cls, fanout)] = (cls, fanout_bucket(fanout))
        self.unloaded_s[key] = unloaded_ms / 1000.0

    def query_answered(self, cls: str, fanout: int, latency_ms: float) -> None:
        """Count one query whose tasks all succeeded, with its latency."""
        self.query_latency.labels(cls, fanout_bucket(fanout)).observe(latency_ms / 1000.0)
        ring = self.recent_latency_ms.get(cls)
        if ring is None:
            ring = self.recent_latency_ms[cls] = deque(maxlen=RECENT_LATENCIES)
        ring.append(latency_ms)

    def drain_latencies(self) -> dict[str, list[float]]:
        """Latencies per class since the last drain, in milliseconds; empties the rings."""
        out = {cls: list(ring) for cls, ring in self.recent_latency_ms.items() if ring}
        for ring in self.recent_latency_ms.values():
            ring.clear()
        return out

    def task_done(self, pool: str, status: str) -> None:
        """Count one task outcome."""
        key = (pool, status)
        self.task_counts[key] = self.task_counts.get(key, 0) + 1

    def tasks_done(self, pool: str, status: str, n: int) -> None:
        """Count `n` task outcomes of one status (a frame of results)."""
        key = (pool, status)
        self.task_counts[key] = self.task_counts.get(key, 0) + n

    def task_dropped(self, pool: str, error: str | None) -> None:
        """Count one task dropped on purpose, under the module its error names."""
        key = (pool, dropped_module(error))
        self.drop_counts[key] = self.drop_counts.get(key, 0) + 1

    def wait_estimate_error(self, pool: str, actual_ms: float, estimated_ms: float) -> None:
        """Count one task's actual and estimated queue wait, and their difference."""
        self.wait_error.labels(pool).observe((actual_ms - estimated_ms) / 1000.0)
        sums = self.wait_sums_ms.get(pool)
        if sums is None:
            sums = self.wait_sums_ms[pool] = [0.0, 0.0]
        sums[0] += estimated_ms
        sums[1] += actual_ms

    def deadline_missed(self, cls: str, pool: str) -> None:
        """Count one task dequeued after its t_D."""
        self.deadlines_missed(cls, pool, 1)

    def deadlines_missed(self, cls: str, pool: str, n: int) -> None:
        """Count `n` tasks of a class dequeued after their t_D."""
        key = (cls, pool)
        self.miss_counts[key] = self.miss_counts.get(key, 0) + n

    def admission_rejected(self, cls: str, reason: str) -> None:
        """Count one query rejected by admission control."""
        self.admission.labels(cls, reason).inc()

    def bind_window(self, ratio: Callable[[str | None], float], classes: list[str]) -> None:
        """Export the windowed task deadline-miss ratio, overall and per class, at scrape time."""
        gauge = Gauge(
            "tailgate_task_miss_ratio",
            "Task deadline-miss ratio over the admission window.",
            ["class"],
            registry=self.registry,
        )
        gauge.labels("all").set_function(lambda: ratio(None))
        for c in classes:
            gauge.labels(c).set_function(lambda c=c: ratio(c))

    def bind_objectives(self, classes: Iterable[ClassConfig]) -> None:
        """Export each class's SLO, which alert rules and dashboards divide by: the error
        budget of a class is 1 - tailgate_class_slo_objective_ratio."""
        latency = Gauge(
            "tailgate_class_slo_latency_seconds",
            "A class's SLO latency x_p^SLO (the latency histogram has a bucket at it).",
            ["class"],
            registry=self.registry,
        )
        objective = Gauge(
            "tailgate_class_slo_objective_ratio",
            "A class's SLO percentile as a ratio (p99: 0.99): the share of its queries that "
            "must meet the SLO latency.",
            ["class"],
            registry=self.registry,
        )
        for c in classes:
            latency.labels(c.name).set(c.latency_ms / 1000.0)
            objective.labels(c.name).set(c.percentile / 100.0)

    def bind_servers(
        self, snapshot: Callable[[], Iterable[tuple[str, str]]], *, of_view: bool = False
    ) -> None:
        """Export the server registry's (pool, state) pairs at scrape time. `of_view`: they
        are those of the links of the view bound by bind_service, so GET /metrics may count
        them in its slices of those links instead."""
        self._servers = _ServersCollector(snapshot)
        self._servers_of_view = of_view
        self.registry.register(self._servers)

    def bind_service(
        self,
        view: GatewayView,
        window_s: float = SERVER_WINDOW_S,
        max_age_s: float | None = None,
    ) -> None:
        """Export per-server, per-pool and autoscaler figures read from the service at scrape."""
        self.server_windows = ServerMissRatios(window_s, max_age_s)
        self._collector = _GatewayCollector(self, view)
        self.registry.register(self._collector)

    async def exposition(self) -> bytes:
        """GET /metrics: the registry in the text format, the per-server families rendered
        a slice of servers at a time with the event loop run between slices."""
        collector = self._collector
        if collector is None:
            return generate_latest(self.registry)
        # The servers' families and tailgate_servers walk every server: they are rendered
        # after the rest, in slices, when this registry's tailgate_servers counts the
        # service's own links (bound by GatewayService).
        servers = self._servers
        sliced = servers is not None and servers.enabled and self._servers_of_view
        collector.per_server = False
        if sliced:
            servers.enabled = False
        try:
            head = generate_latest(self.registry)
        finally:
            collector.per_server = True
            if sliced:
                servers.enabled = True
        view = collector._view
        await asyncio.sleep(0)
        text = await server_text(view, self.server_windows, servers=bool(sliced))
        return head + text.encode()


def _tenant_metrics(tenants: dict[str, Any]) -> Iterable[Metric]:
    """The allocation layer's flows (tenants or classes), as GET /v1/tenants shows them."""
    admitted = CounterMetricFamily(
        "tailgate_tenant_queries_admitted",
        "Queries admitted, by allocation flow (tenant, or class with flows = class).",
        labels=["tenant"],
    )
    cost = CounterMetricFamily(
        "tailgate_tenant_admitted_cost_seconds",
        "Cost of the queries admitted (k_f x x_p^u or the client's cost hint), by flow.",
        labels=["tenant"],
    )
    rejected = CounterMetricFamily(
        "tailgate_tenant_queries_rejected",
        "Queries refused by admission, by flow and reason (tenant_share: refused to repay "
        "the flow's share debt).",
        labels=["tenant", "reason"],
    )
    queued = GaugeMetricFamily(
        "tailgate_tenant_queued_tasks",
        "A flow's tasks waiting in the gateway's central queues.",
        labels=["tenant"],
    )
    deficit = GaugeMetricFamily(
        "tailgate_tenant_deficit_seconds",
        "A flow's DRR deficit summed over the central queues (cost it may still release).",
        labels=["tenant"],
    )
    debt = GaugeMetricFamily(
        "tailgate_tenant_share_debt_seconds",
        "Cost a flow owes to the flows admitted on its account under overload.",
        labels=["tenant"],
    )
    for f in tenants["flows"]:
        name = [f["flow"]]
        admitted.add_metric(name, f["admitted"])
        cost.add_metric(name, f["admitted_cost_ms"] / 1000.0)
        for reason, n in f["rejected"].items():
            rejected.add_metric([f["flow"], reason], n)
        queued.add_metric(name, f["queued_tasks"])
        deficit.add_metric(name, f["deficit_ms"] / 1000.0)
        if "share" in f:
            debt.add_metric(name, f["share"]["debt_ms"] / 1000.0)
    yield from (admitted, cost, rejected, queued, deficit, debt)
