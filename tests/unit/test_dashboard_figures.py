"""What the dashboard's new panels read: outcomes, pipeline goodput and drops per module, edge
agents per cluster, the executor a server names, and the files the gateway serves."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from gateway.config import GatewayConfig
from gateway.dashboard import STATIC_FILES, static_file
from gateway.history import Figures, HistorySampler, read_figures, read_figures_spread
from gateway.links import ServerLink
from gateway.metrics import UNNAMED_MODULE, dropped_module
from gateway.queries import QueryOutcome
from gateway.service import GatewayService
from taskserver.pipeline.errors import PipelineDropped
from taskserver.wire import TaskStatus
from tests.unit.loop_ticks import turns_during
from tests.unit.test_query_path import _query, _service, _started

T0 = 1_767_225_600.0


def figures(**changes: Any) -> Figures:
    base: dict[str, Any] = {
        "miss": {"all": 0.0},
        "pool_miss": {},
        "latencies_ms": {},
        "percentiles": {"A": 99.0},
        "queries": {},
        "deferred": {},
        "queue": {},
        "servers": {},
        "replicas": {},
    }
    base.update(changes)
    return Figures(**base)


def test_a_sample_keeps_every_outcome_per_class_as_a_rate() -> None:
    sampler = HistorySampler(now=0.0)
    queries = {
        ("A", "met"): 30.0,
        ("A", "missed_slo"): 5.0,
        ("A", "rejected"): 10.0,
        ("A", "dropped"): 2.0,
        ("A", "failed"): 1.0,
        ("A", "timeout"): 2.0,
    }
    first = sampler.sample(figures(queries=queries), now=5.0, wall=T0)
    assert first["outcome_per_s"] == {
        "A": {
            "dropped": 0.4,
            "failed": 0.2,
            "met": 6.0,
            "missed_slo": 1.0,
            "rejected": 2.0,
            "timeout": 0.4,
        }
    }
    more = {**queries, ("A", "met"): 40.0}
    second = sampler.sample(figures(queries=more), now=7.0, wall=T0 + 2)
    assert second["outcome_per_s"]["A"]["met"] == 5.0  # 10 more in 2 s
    assert second["outcome_per_s"]["A"]["rejected"] == 0.0


def test_pipeline_goodput_and_drops_per_module_are_rates_that_survive_a_restart() -> None:
    sampler = HistorySampler(now=0.0, top_servers=2)
    first = sampler.sample(
        figures(goodput={"gpu-1": 20, "gpu-2": 10, "gpu-3": 1}, drops={"detect": 4}),
        now=2.0,
        wall=T0,
    )
    # The busiest pipeline servers only; drops summed per module.
    assert first["goodput_per_s"] == {"gpu-1": 10.0, "gpu-2": 5.0}
    assert first["drops_per_s"] == {"detect": 2.0}
    # gpu-2 was removed and came back: its count starts again from zero.
    second = sampler.sample(
        figures(goodput={"gpu-1": 30, "gpu-2": 4}, drops={"detect": 4, "ocr": 2}),
        now=4.0,
        wall=T0 + 2,
    )
    assert second["goodput_per_s"] == {"gpu-1": 5.0, "gpu-2": 2.0}
    assert second["drops_per_s"] == {"detect": 0.0, "ocr": 1.0}


def test_edge_clusters_keep_their_worst_p99_and_longest_silence() -> None:
    sampler = HistorySampler(now=0.0)
    s = sampler.sample(
        figures(edge={"lab": (42.123456, 0.25), "roof": (None, 7.5)}), now=1.0, wall=T0
    )
    assert s["edge_p99_ms"] == {"lab": 42.123}  # no CDF yet: no point (a gap, not a zero)
    assert s["edge_silent_s"] == {"lab": 0.25, "roof": 7.5}


def _link(service: GatewayService, server_id: str, executor: str | None, **kw: Any) -> ServerLink:
    link = ServerLink(
        server_id,
        "127.0.0.1",
        9,
        on_result=lambda *a: None,
        on_failure=lambda *a: None,
        clock=service.clock,
        **kw,
    )
    link._on_status(SimpleNamespace(executor=executor, policy=None, draining=False, owner=None))
    service.links[server_id] = link
    return link


def test_read_figures_tells_pipeline_servers_and_edge_agents_by_their_executor() -> None:
    service = GatewayService(GatewayConfig(storage_url=""))
    _link(service, "ts-1", "emulated", pool="default")
    _link(service, "gpu-1", "pipeline", pool="default")
    _link(service, "pi-1", "sensing", pool="edge", cluster="lab")
    _link(service, "pi-2", "sensing", pool="edge", cluster="lab")
    _link(service, "pi-3", "sensing", pool="edge")  # no cluster: its pool stands for one
    # The heartbeat named what each server runs; /v1/servers shows it.
    assert service.server_view(service.links["gpu-1"])["executor"] == "pipeline"
    windows = service.server_windows
    for missed in (False, False, True):
        windows.task("gpu-1", "default", missed)
    windows.task("ts-1", "default", False)
    service.metrics.task_dropped("default", str(PipelineDropped("1", "detect", 9, 5, "late")))
    service.metrics.task_dropped("other", str(PipelineDropped("1", "detect", 9, 5, "late")))
    service.metrics.task_dropped("default", "queue full")
    for sid in ("pi-1", "pi-2"):
        service.book.add_server(sid, [float(i) for i in range(1, 101)])
    f = read_figures(service)
    assert f.goodput == {"gpu-1": 2}  # ran on time; the emulated server is not a pipeline
    assert f.drops == {"detect": 2, UNNAMED_MODULE: 1}
    assert set(f.edge) == {"lab", "edge"}
    p99, silent = f.edge["lab"]
    assert p99 == service.book.cdf_of("pi-1").quantile(0.99)
    assert 0.0 <= silent < 60.0
    assert f.edge["edge"][0] is None  # pi-3 has no CDF in the book


async def test_the_spread_pass_reads_what_one_pass_reads_and_lets_the_loop_run() -> None:
    service = GatewayService(GatewayConfig(storage_url=""))
    kinds = ["emulated", "pipeline", "sensing", None]
    for i in range(23):
        _link(service, f"s{i:02d}", kinds[i % 4], pool=f"p{i % 3}", cluster=f"c{i % 2}")
        service.server_windows.tasks(f"s{i:02d}", f"p{i % 3}", i + 1, i % 3)
    service.book.add_server("s02", [float(i) for i in range(1, 101)])
    spread, between = await turns_during(read_figures_spread(service, slice_size=5))
    whole = read_figures(service)
    # Five slices, four pauses: the other task ran in each.
    assert between >= 4
    # Latencies were drained by the first read; silences grow with the clock; everything
    # else is the same.
    for name in Figures.__slots__:
        if name not in ("latencies_ms", "edge"):
            assert getattr(spread, name) == getattr(whole, name), name
    assert {c: p99 for c, (p99, _) in spread.edge.items()} == {
        c: p99 for c, (p99, _) in whole.edge.items()
    }
    assert sum(whole.servers.values()) == 23 and len(whole.goodput) == 6


def test_a_server_that_names_no_executor_keeps_the_last_one_named() -> None:
    service = GatewayService(GatewayConfig(storage_url=""))
    link = _link(service, "ts-1", None, pool="default")
    assert link.executor is None
    link._on_status(SimpleNamespace(executor="pipeline", policy=None, draining=False, owner=None))
    link._on_status(SimpleNamespace(executor=None, policy=None, draining=False, owner=None))
    assert link.executor == "pipeline"


def test_the_dropping_module_is_read_from_the_pipeline_runtime_message() -> None:
    err = PipelineDropped("2", "face recognition", 31.5, 20.0, "estimate over budget")
    assert dropped_module(str(err)) == "face recognition"
    assert dropped_module("budget spent at detect") == UNNAMED_MODULE
    assert dropped_module(None) == UNNAMED_MODULE


async def test_a_dropped_task_is_counted_under_its_module_and_exported() -> None:
    svc, clock, links = await _service(1)
    task = await _started(svc, _query(1))
    message = str(PipelineDropped("1", "object_detection", 12.0, 6.0, "estimate over budget"))
    links[0].answer(clock, TaskStatus.DROPPED, error=message)
    answer = await task
    assert answer.outcome is QueryOutcome.DROPPED
    assert svc.metrics.drop_counts == {("default", "object_detection"): 1}
    labels = {"pool": "default", "module": "object_detection"}
    assert svc.registry.get_sample_value("tailgate_task_drops_total", labels) == 1.0


def test_the_dashboard_serves_the_vendored_chart_library_and_no_cdn() -> None:
    for name in STATIC_FILES:
        assert static_file(name), name
    js = static_file("vendor/uplot/uPlot.iife.min.js").decode()
    assert "uPlot" in js
    assert b"MIT" in static_file("vendor/uplot/LICENSE")
    page = static_file("dashboard.html").decode()
    assert 'src="dashboard/vendor/uplot/uPlot.iife.min.js"' in page
    assert 'href="dashboard/vendor/uplot/uPlot.min.css"' in page
    # Every script, style and link is served by the gateway: no absolute URL anywhere.
    for name in ("dashboard.html", "dashboard.js", "dashboard.css"):
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", static_file(name).decode())
