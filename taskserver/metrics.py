"""Prometheus metrics of a task server (always on an injected registry)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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


class TaskServerMetrics:
    """Counters and gauges a task server exports at /metrics."""

    def __init__(self, registry: CollectorRegistry, server_id: str) -> None:
        self.registry = registry
        labels = {"server": server_id}
        self.tasks = Counter(
            "tailgate_taskserver_tasks_total",
            "Tasks finished by this server, by final status.",
            ["server", "status"],
            registry=registry,
        )
        self._tasks_by_status = {
            s: self.tasks.labels(server=server_id, status=s)
            for s in ("ok", "failed", "cancelled", "rejected")
        }
        self.deadline_misses = Counter(
            "tailgate_taskserver_deadline_misses_total",
            "Tasks dequeued after their TF-EDFQ deadline t_D.",
            ["server"],
            registry=registry,
        ).labels(**labels)
        self.queue_wait = Histogram(
            "tailgate_taskserver_queue_wait_seconds",
            "Receipt to dequeue on this server.",
            ["server"],
            buckets=TASK_BUCKETS_S,
            registry=registry,
        ).labels(**labels)
        self.service = Histogram(
            "tailgate_taskserver_service_seconds",
            "Dequeue to executor done.",
            ["server"],
            buckets=TASK_BUCKETS_S,
            registry=registry,
        ).labels(**labels)
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

    def bind_gauges(self, queued: Callable[[], float], busy: Callable[[], float]) -> None:
        """Read queue depth and busy slots at scrape time instead of on every change."""
        self.queue_depth.set_function(queued)
        self.busy_slots.set_function(busy)

    def task_done(self, status: str) -> None:
        """Count one finished task."""
        self._tasks_by_status[status].inc()
