"""Prometheus metrics of a task server (always on an injected registry)."""

from __future__ import annotations

import importlib.metadata
import math
import platform
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from taskserver.heap import GC_PAUSE_BUCKETS_S, GcPauses, gc_pauses

# No `_created` series beside every counter and histogram: Prometheus does not use them and
# they double what a scrape carries (prometheus_client's switch is process-wide).
disable_created_metrics()

# Task times span sub-millisecond key-value lookups to second-long inference.
TASK_BUCKETS_S = (
    0.0001,
    0.00025,
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
)


def register_build_info(registry: CollectorRegistry, component: str) -> None:
    """`tailgate_build_info{version, python, component} 1`: what runs, for dashboards and
    alerts that join on it (the Prometheus convention for build metadata)."""
    try:
        version = importlib.metadata.version("tailgate")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    Gauge(
        "tailgate_build_info",
        "Tailgate's version, the Python it runs on and which process this is.",
        ["version", "python", "component"],
        registry=registry,
    ).labels(version, platform.python_version(), component).set(1)
    # The process's collector pauses beside it (taskserver.heap): once per registry.
    registry.register(GcPauseCollector(gc_pauses()))


class GcPauseCollector(Collector):
    """`tailgate_gc_pause_seconds{generation}`: the process's garbage-collector passes."""

    def __init__(self, pauses: GcPauses) -> None:
        self._pauses = pauses

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(
            "tailgate_gc_pause_seconds",
            "Garbage-collector passes of this process and how long each stopped it, by "
            "generation (2: a full pass over every object not frozen at start-up).",
            labels=["generation"],
        )
        p = self._pauses
        for g in range(p.GENERATIONS):
            cumulative, running = [], 0
            for bound, n in zip((*GC_PAUSE_BUCKETS_S, math.inf), p.buckets[g], strict=True):
                running += n
                cumulative.append((_le(bound), running))
            family.add_metric([str(g)], cumulative, p.total_s[g])
        yield family


class HistogramChild:
    """One label set of a LiteHistogram."""

    __slots__ = ("_bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self.counts[bisect_left(self._bounds, value)] += 1
        self.total += value


class LiteHistogram(Collector):
    """A Prometheus histogram for the per-task hot path.

    prometheus_client's Histogram takes a lock per bucket increment (~2 µs an
    observation); our services observe from one event-loop thread, so plain
    integer counts exported at scrape time are exact and ten times cheaper.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.bounds = tuple(sorted(buckets))
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        """The child for these label values (created on first use)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            child = self._children[values] = HistogramChild(self.bounds)
        return child

    def collect(self) -> Iterable[HistogramMetricFamily]:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in sorted(self._children.items()):
            cumulative, buckets = 0, []
            for bound, n in zip((*self.bounds, float("inf")), child.counts, strict=True):
                cumulative += n
                buckets.append((_le(bound), cumulative))
            fam.add_metric(list(values), buckets, child.total)
        yield fam


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class TaskServerMetrics:
    """Counters and gauges a task server exports at /metrics."""

    def __init__(self, registry: CollectorRegistry, server_id: str) -> None:
        self.registry = registry
        register_build_info(registry, "taskserver")
        labels = {"server": server_id}
        self.tasks = Counter(
            "tailgate_taskserver_tasks_total",
            "Tasks finished by this server, by final status.",
            ["server", "status"],
            registry=registry,
        )
        self._tasks_by_status = {
            s: self.tasks.labels(server=server_id, status=s)
            for s in ("ok", "failed", "cancelled", "rejected", "dropped")
        }
        self.deadline_misses = Counter(
            "tailgate_taskserver_deadline_misses_total",
            "Tasks dequeued after their TF-EDFQ deadline t_D.",
            ["server"],
            registry=registry,
        ).labels(**labels)
        self.queue_wait = LiteHistogram(
            "tailgate_taskserver_queue_wait_seconds",
            "Receipt to dequeue on this server.",
            ["server"],
            TASK_BUCKETS_S,
            registry,
        ).labels(server_id)
        self.service = LiteHistogram(
            "tailgate_taskserver_service_seconds",
            "Dequeue to executor done.",
            ["server"],
            TASK_BUCKETS_S,
            registry,
        ).labels(server_id)
        self.queue_depth = Gauge(
            "tailgate_taskserver_queue_depth",
            "Tasks waiting in the policy queue.",
            ["server"],
            registry=registry,
        ).labels(**labels)
        self.busy_slots = Gauge(
            "tailgate_taskserver_busy_slots",
            "Tasks executing now.",
            ["server"],
            registry=registry,
        ).labels(**labels)
        self.wire_violations = Counter(
            "tailgate_taskserver_wire_violations_total",
            "Connections closed because the peer broke the Thrift protocol, by reason "
            "(string_length, container_length, bad_message, ...).",
            ["server", "reason"],
            registry=registry,
        )
        self._server_id = server_id
        self.slots_reclaimed = Counter(
            "tailgate_taskserver_slots_reclaimed_total",
            "Slots the watchdog took back from tasks running past their budget plus the grace.",
            ["server"],
            registry=registry,
        ).labels(**labels)

    def bind_gauges(self, queued: Callable[[], float], busy: Callable[[], float]) -> None:
        """Read queue depth and busy slots at scrape time instead of on every change."""
        self.queue_depth.set_function(queued)
        self.busy_slots.set_function(busy)

    def task_done(self, status: str) -> None:
        """Count one finished task."""
        self._tasks_by_status[status].inc()

    def wire_violation(self, reason: str) -> None:
        """Count one connection closed for a protocol violation."""
        self.wire_violations.labels(self._server_id, reason).inc()


PIPELINE_OUTCOMES = ("on_time", "late", "dropped", "cancelled", "failed")
"""How a request leaves a pipeline: the `outcome` label of tailgate_pipeline_requests_total."""
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class PipelineCollector(Collector):
    """A pipeline executor's figures (PARD §5.1 metrics), read from its snapshot at scrape.

    Only counters, histograms and instantaneous gauges: goodput, drop rate, invalid rate
    and mean batch size are ratios of these counters that PromQL takes over any window
    (``rate(tailgate_pipeline_requests_total{outcome="on_time"}[5m])`` is the goodput).
    """

    def __init__(self, snapshot: Callable[[], dict], server_id: str) -> None:
        self._snapshot = snapshot
        self._server = server_id

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot()
        labels = [self._server, str(snap["pipeline"]), str(snap["dropper"])]
        names = ["server", "pipeline", "dropper"]
        requests = CounterMetricFamily(
            "tailgate_pipeline_requests",
            "Requests that left the pipeline, by outcome: on_time (within their budget: the "
            "goodput), late, dropped (by the dropping policy), cancelled, failed.",
            labels=[*names, "outcome"],
        )
        outcomes = snap["outcomes"]
        for outcome in PIPELINE_OUTCOMES:
            requests.add_metric([*labels, outcome], float(outcomes.get(outcome, 0)))
        yield requests
        in_flight = GaugeMetricFamily(
            "tailgate_pipeline_requests_in_flight",
            "Requests in the pipeline now (arrived and not yet finished).",
            labels=names,
        )
        in_flight.add_metric(labels, float(snap["in_flight"]))
        yield in_flight
        drops = CounterMetricFamily(
            "tailgate_pipeline_drops",
            "Requests dropped by the dropping policy, by the module that dropped them.",
            labels=[*names, "module"],
        )
        for module, n in sorted(snap["drops_by_module"].items()):
            drops.add_metric([*labels, str(module)], float(n))
        yield drops
        per_module = [*names, "module"]
        compute = CounterMetricFamily(
            "tailgate_pipeline_compute_seconds",
            "Model time a module spent on finished requests (a batch's time shared equally "
            "by its requests).",
            labels=per_module,
        )
        invalid = CounterMetricFamily(
            "tailgate_pipeline_invalid_compute_seconds",
            "The part of tailgate_pipeline_compute_seconds_total spent on requests finally "
            "dropped or late (PARD's invalid compute).",
            labels=per_module,
        )
        batch = HistogramMetricFamily(
            "tailgate_pipeline_batch_size",
            "Requests per batch a module ran.",
            labels=per_module,
        )
        scale = GaugeMetricFamily(
            "tailgate_pipeline_module_duration_scale",
            "Measured / profiled batch time the module's d_k follows (1: the profile's).",
            labels=per_module,
        )
        workers = GaugeMetricFamily(
            "tailgate_pipeline_module_workers",
            "Workers (model sessions, each with its own thread) of a module: ready ones "
            "serving, starting ones still loading or in their cold start.",
            labels=[*per_module, "state"],
        )
        scaling = CounterMetricFamily(
            "tailgate_pipeline_scaling_actions",
            "Workers the run-time scaler started and stopped at a module.",
            labels=[*per_module, "action"],
        )
        crashes = CounterMetricFamily(
            "tailgate_pipeline_worker_crashes",
            "Worker processes of a module lost while running a batch (killed, crashed, hung), "
            "each replaced by a new one; the batch's requests failed.",
            labels=per_module,
        )
        for module, m in sorted(snap["modules"].items()):
            key = [*labels, str(module)]
            if "worker_crashes" in m:
                crashes.add_metric(key, float(m["worker_crashes"]))
            compute.add_metric(key, float(m["compute_s"]))
            invalid.add_metric(key, float(m["invalid_s"]))
            sizes = {int(size): int(n) for size, n in m["batch_sizes"].items()}
            buckets = [
                (_le(bound), float(sum(n for size, n in sizes.items() if size <= bound)))
                for bound in (*BATCH_SIZE_BUCKETS, float("inf"))
            ]
            batch.add_metric(key, buckets, float(sum(s * n for s, n in sizes.items())))
            if "duration_scale" in m:
                scale.add_metric(key, float(m["duration_scale"]))
            if "workers" in m:
                workers.add_metric([*key, "ready"], float(m["workers"]))
                workers.add_metric([*key, "starting"], float(m.get("workers_starting", 0)))
            for action, n in sorted(m.get("scaling_actions", {}).items()):
                scaling.add_metric([*key, action], float(n))
        yield compute
        yield invalid
        yield batch
        yield scale
        yield workers
        yield scaling
        yield crashes
