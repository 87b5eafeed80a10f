"""The lock-free histogram, and the gateway's metrics read at scrape time."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gateway.cdf import CdfBook
from gateway.config import GatewayConfig
from gateway.links import ServerLink
from gateway.metrics import GatewayMetrics
from gateway.server_windows import SERVER_WINDOW_S
from gateway.service import GatewayService
from taskserver.metrics import LiteHistogram


def test_lite_histogram_matches_prometheus_histogram_exposition() -> None:
    values = [0.0005, 0.001, 0.003, 0.003, 0.2, 7.0, 100.0]
    buckets = (0.001, 0.005, 0.1, 1.0, 10.0)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    lite = LiteHistogram("t_seconds", "doc", ["server"], buckets, ours)
    ref = Histogram("t_seconds", "doc", ["server"], buckets=buckets, registry=theirs)
    for v in values:
        lite.labels("a").observe(v)
        ref.labels("a").observe(v)

    def lines(reg: CollectorRegistry) -> list[str]:
        return [
            ln
            for ln in generate_latest(reg).decode().splitlines()
            if not ln.startswith("#") and "_created" not in ln
        ]

    assert lines(ours) == lines(theirs)


# -- the gateway's scrape-time metrics -------------------------------------------------------


class FakeLink:
    """What the collector reads of a server link."""

    def __init__(self, server_id: str, pool: str, outstanding: int) -> None:
        self.server_id = server_id
        self.pool = pool
        self.outstanding = {f"q{i}": None for i in range(outstanding)}
        self.slots = 1
        self.queue = None


def make_view(clock: list[float], **changes: Any) -> SimpleNamespace:
    book = CdfBook(window_size=100)
    book.add_server("ts-1", [float(i) for i in range(1, 101)])  # 1..100 ms
    view = SimpleNamespace(
        links={"ts-1": FakeLink("ts-1", "default", 3)},
        book=book,
        gate=SimpleNamespace(controller=SimpleNamespace(deferred=Counter())),
        autoscaler=None,
        clock=lambda: clock[0],
        groups_view=lambda: [],
        tenants_view=lambda: {"flows": []},
    )
    for k, v in changes.items():
        setattr(view, k, v)
    return view


def make_metrics(
    view: SimpleNamespace, *, window_s: float = 10.0, max_age_s: float | None = None
) -> tuple[GatewayMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    metrics.bind_service(view, window_s, max_age_s)
    return metrics, registry


def test_per_server_counters_and_windowed_ratios_move_with_tasks() -> None:
    clock = [10.0]
    view = make_view(clock)
    metrics, registry = make_metrics(view)
    value = registry.get_sample_value
    labels = {"server": "ts-1", "pool": "default"}
    assert value("tailgate_server_tasks_total", labels) is None  # nothing ran yet
    assert value("tailgate_server_task_miss_ratio", labels) == 0.0
    for missed in (True, False, False, False):
        metrics.server_windows.task("ts-1", "default", missed)
    assert value("tailgate_server_tasks_total", labels) == 4.0
    assert value("tailgate_server_task_deadline_misses_total", labels) == 1.0
    assert value("tailgate_server_task_miss_ratio", labels) == 0.25
    assert value("tailgate_pool_task_miss_ratio", {"pool": "default"}) == 0.25
    # The window holds the last 10 s: the miss leaves it, four more on time come in.
    clock[0] = 20.0
    for _ in range(4):
        metrics.server_windows.task("ts-1", "default", False)
    clock[0] = 21.0
    assert value("tailgate_server_tasks_total", labels) == 8.0
    assert value("tailgate_server_task_deadline_misses_total", labels) == 1.0
    assert value("tailgate_server_task_miss_ratio", labels) == 0.0


def test_a_window_with_no_new_task_is_forgotten_after_max_age() -> None:
    clock = [0.0]
    metrics, registry = make_metrics(make_view(clock), window_s=60.0, max_age_s=5.0)
    metrics.server_windows.task("ts-1", "default", True)
    assert registry.get_sample_value("tailgate_pool_task_miss_ratio", {"pool": "default"}) == 1.0
    clock[0] = 6.0
    assert registry.get_sample_value("tailgate_pool_task_miss_ratio", {"pool": "default"}) == 0.0
    # The counters never go back.
    assert (
        registry.get_sample_value(
            "tailgate_server_task_deadline_misses_total", {"server": "ts-1", "pool": "default"}
        )
        == 1.0
    )


def test_server_windows_keep_the_last_minute_and_forget_a_removed_server() -> None:
    clock = [0.0]
    view = make_view(clock)
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    metrics.bind_service(view)  # the gateway's own windows: the last SERVER_WINDOW_S
    windows = metrics.server_windows
    value = registry.get_sample_value
    labels = {"server": "ts-1", "pool": "default"}
    # Nearly three hours of one task and one update (scrape, sample, poll) a second.
    for i in range(10_000):
        clock[0] = float(i)
        windows.task("ts-1", "default", missed=i % 10 == 0)
        windows.update(clock[0])
    # Memory stays one column per update of the last minute (white box: per-server chunks
    # grew without bound under a 100,000-task count window).
    assert len(windows._columns) == SERVER_WINDOW_S == 60
    # The ratio covers that minute (9940..9999: six misses in 60), not the three hours.
    assert value("tailgate_server_task_miss_ratio", labels) == 0.1
    assert value("tailgate_pool_task_miss_ratio", {"pool": "default"}) == 0.1
    # A task after the last update, then the server is removed (deregister).
    windows.task("ts-1", "default", missed=True)
    view.links.clear()
    windows.forget("ts-1", clock[0])
    assert windows._row_of == {} and windows.counts == {}
    for name in (
        "tailgate_server_tasks_total",
        "tailgate_server_task_deadline_misses_total",
        "tailgate_server_task_miss_ratio",
    ):
        assert value(name, labels) is None
    # Its pool keeps what the server ran, the last task included.
    assert value("tailgate_pool_task_miss_ratio", {"pool": "default"}) == 7 / 61


async def test_deregister_forgets_the_server_windows() -> None:
    service = GatewayService(GatewayConfig())
    link = ServerLink(
        "ts-1",
        "127.0.0.1",
        9,
        pool="default",
        on_result=lambda *a: None,
        on_failure=lambda *a: None,
    )
    service.links["ts-1"] = link
    service.book.add_server("ts-1", [1.0, 2.0])
    service.metrics.server_windows.task("ts-1", "default", missed=True)
    value = service.registry.get_sample_value
    labels = {"server": "ts-1", "pool": "default"}
    assert value("tailgate_server_tasks_total", labels) == 1.0
    await service.deregister("ts-1")
    assert value("tailgate_server_tasks_total", labels) is None
    assert service.metrics.server_windows.counts == {}
    assert value("tailgate_pool_task_miss_ratio", {"pool": "default"}) == 1.0


def test_queue_depth_post_queuing_quantiles_and_deferrals_are_read_at_scrape() -> None:
    clock = [0.0]
    view = make_view(clock)
    _, registry = make_metrics(view)
    value = registry.get_sample_value
    assert value("tailgate_server_queue_depth", {"server": "ts-1", "pool": "default"}) == 3.0
    quantiles = {
        q: value("tailgate_server_post_queuing_seconds", {"server": "ts-1", "q": q})
        for q in ("0.5", "0.9", "0.99", "0.999")
    }
    assert 0.045 < quantiles["0.5"] < 0.055
    assert quantiles["0.5"] < quantiles["0.9"] < quantiles["0.99"] <= quantiles["0.999"]
    # QLM §6 at the back of the queue: two queued behind the one busy slot, plus the
    # residual E[S^2] / 2E[S] of the task in service (samples 1..100 ms: 33.5 ms).
    labels = {"server": "ts-1", "pool": "default"}
    wait_s = value("tailgate_server_estimated_wait_seconds", labels)
    assert wait_s == pytest.approx((2 * 50.5 + 33.5) / 1000.0)
    view.links["ts-1"].outstanding.clear()
    view.gate.controller.deferred[("C", "cost_ladder_defer")] += 2
    assert value("tailgate_server_queue_depth", {"server": "ts-1", "pool": "default"}) == 0.0
    assert value("tailgate_server_estimated_wait_seconds", labels) == 0.0
    deferred = {"class": "C", "reason": "cost_ladder_defer"}
    assert value("tailgate_queries_deferred_total", deferred) == 2.0


def test_request_groups_are_read_at_scrape() -> None:
    group = {
        "class": "A", "pool": "default", "cost_bucket": [16.0, 32.0], "queries": 7,
        "arrival_rate": 2.5, "mean_cost_ms": 20.0, "tasks_outstanding": 3,
        "mean_service_ms": 1.0, "estimated_drain_ms": 1.5,
    }  # fmt: skip
    view = make_view([0.0], groups_view=lambda: [group])
    _, registry = make_metrics(view)
    labels = {"class": "A", "pool": "default", "cost_bucket": "16-32"}
    value = registry.get_sample_value
    assert value("tailgate_group_queries_total", labels) == 7.0
    assert value("tailgate_group_arrival_rate", labels) == 2.5
    assert value("tailgate_group_tasks_outstanding", labels) == 3.0
    assert value("tailgate_group_estimated_drain_seconds", labels) == 0.0015


def test_autoscaler_replicas_and_decisions_appear_with_an_autoscaler() -> None:
    clock = [0.0]
    view = make_view(clock)
    _, registry = make_metrics(view)
    assert registry.get_sample_value("tailgate_autoscaler_replicas", {"pool": "default"}) is None
    view.autoscaler = SimpleNamespace(
        config=SimpleNamespace(pool="default"),
        decisions=Counter(up=2, hold=7),
        replicas_now=lambda: 3,
    )
    value = registry.get_sample_value
    assert value("tailgate_autoscaler_replicas", {"pool": "default"}) == 3.0
    for action, n in (("up", 2.0), ("hold", 7.0)):
        labels = {"pool": "default", "action": action}
        assert value("tailgate_autoscaler_decisions_total", labels) == n


def test_answered_latencies_feed_the_histogram_and_the_history_drain() -> None:
    metrics, registry = make_metrics(make_view([0.0]))
    metrics.query_answered("A", 4, 12.0)
    metrics.query_answered("A", 1, 30.0)
    labels = {"class": "A", "fanout": "2-9"}
    assert registry.get_sample_value("tailgate_query_latency_seconds_count", labels) == 1.0
    assert registry.get_sample_value("tailgate_query_latency_seconds_sum", labels) == 0.012
    assert metrics.drain_latencies() == {"A": [12.0, 30.0]}
    assert metrics.drain_latencies() == {}


def test_every_gateway_metric_name_follows_the_conventions() -> None:
    metrics, registry = make_metrics(make_view([0.0]))
    metrics.bind_window(lambda c: 0.0, ["A"])
    metrics.bind_servers(lambda: [("default", "up")])
    names = {m.name for m in registry.collect()}
    assert {
        "tailgate_server_task_deadline_misses",
        "tailgate_server_tasks",
        "tailgate_pool_task_miss_ratio",
        "tailgate_server_task_miss_ratio",
        "tailgate_queries_deferred",
        "tailgate_server_queue_depth",
        "tailgate_server_post_queuing_seconds",
        "tailgate_autoscaler_replicas",
        "tailgate_autoscaler_decisions",
    } <= names
    assert all(n.startswith("tailgate_") and not n.endswith("_ms") for n in names)


def test_the_latency_histogram_has_a_bucket_at_each_class_slo() -> None:
    from gateway.metrics import QUERY_BUCKETS_S, latency_buckets

    assert latency_buckets([]) == QUERY_BUCKETS_S
    got = latency_buckets([25.0, 100.0, 333.0])
    assert 0.025 in got and 0.333 in got and list(got) == sorted(set(got))
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, [333.0])
    metrics.query_answered("A", 1, 333.0)
    metrics.query_answered("A", 1, 334.0)
    text = generate_latest(registry).decode()
    assert 'tailgate_query_latency_seconds_bucket{class="A",fanout="1",le="0.333"} 1.0' in text


def test_per_query_gauges_are_plain_values_exported_at_scrape() -> None:
    registry = CollectorRegistry()
    m = GatewayMetrics(registry)
    m.inflight += 3
    m.set_unloaded("A", 10, 4.5)
    m.set_unloaded("A", 12, 5.0)  # the same fanout bucket (10-99): the latest wins
    m.set_unloaded("B", 1, 0.25)
    m.inflight -= 1
    assert registry.get_sample_value("tailgate_queries_inflight") == 2.0
    unloaded = "tailgate_unloaded_latency_seconds"
    assert registry.get_sample_value(unloaded, {"class": "A", "fanout": "10-99"}) == 0.005
    assert registry.get_sample_value(unloaded, {"class": "B", "fanout": "1"}) == 0.00025
    text = generate_latest(registry).decode()
    assert "# TYPE tailgate_queries_inflight gauge" in text
    assert "# TYPE tailgate_unloaded_latency_seconds gauge" in text
