"""Prometheus metrics of the gateway (always on an injected registry)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from taskserver.metrics import LiteHistogram

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

    def collect(self) -> Iterable[GaugeMetricFamily]:
        fam = GaugeMetricFamily(
            "tailgate_servers",
            "Registered task servers by pool and state.",
            labels=["pool", "state"],
        )
        counts: dict[tuple[str, str], int] = {}
        for pool, state in self._snapshot():
            counts[(pool, state)] = counts.get((pool, state), 0) + 1
        for (pool, state), n in sorted(counts.items()):
            fam.add_metric([pool, state], n)
        yield fam


class _TaskCountsCollector(Collector):
    """Per-task counters kept as plain dict increments on the hot path, exported at scrape."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterable[CounterMetricFamily]:
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


class GatewayMetrics:
    """The gateway's first set of metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.queries = Counter(
            "tailgate_queries_total",
            "Queries answered, by class and outcome "
            "(met, missed_slo, failed, dropped, timeout, rejected, unreachable).",
            ["class", "outcome"],
            registry=registry,
        )
        self.query_latency = LiteHistogram(
            "tailgate_query_latency_seconds",
            "Query latency from arrival to the last task result.",
            ["class", "fanout"],
            QUERY_BUCKETS_S,
            registry,
        )
        self.task_counts: dict[tuple[str, str], int] = {}
        """(pool, status) -> tasks; exported as tailgate_tasks_total."""
        self.miss_counts: dict[tuple[str, str], int] = {}
        """(class, pool) -> deadline misses; exported as tailgate_task_deadline_misses_total."""
        registry.register(_TaskCountsCollector(self))
        self.unloaded_latency = Gauge(
            "tailgate_unloaded_latency_seconds",
            "Latest x_p^u(k_f) computed for a class and fanout bucket.",
            ["class", "fanout"],
            registry=registry,
        )
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
        self.inflight = Gauge(
            "tailgate_queries_inflight",
            "Queries dispatched and not yet answered.",
            registry=registry,
        )

    def task_done(self, pool: str, status: str) -> None:
        """Count one task outcome."""
        key = (pool, status)
        self.task_counts[key] = self.task_counts.get(key, 0) + 1

    def deadline_missed(self, cls: str, pool: str) -> None:
        """Count one task dequeued after its t_D."""
        key = (cls, pool)
        self.miss_counts[key] = self.miss_counts.get(key, 0) + 1

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

    def bind_servers(self, snapshot: Callable[[], Iterable[tuple[str, str]]]) -> None:
        """Export the server registry's (pool, state) pairs at scrape time."""
        self.registry.register(_ServersCollector(snapshot))
