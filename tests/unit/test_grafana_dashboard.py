"""The Grafana dashboard: well-formed, and every metric its panels query is one we export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from edge_agent.metrics import SamplerCollector
from gateway.config import GatewayConfig
from gateway.service import GatewayService
from taskserver.metrics import PipelineCollector, TaskServerMetrics
from tests.conftest import REPO_ROOT
from tests.unit.test_pipeline_exposition import make_snapshot

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "tailgate-dashboard.json"
SOURCES = ("gateway", "admission", "taskserver", "edge_agent")
"""Packages whose source may define metric names (scanned as text, not imported)."""
_NAME = re.compile(r"(?<![\w:])tailgate_[a-zA-Z0-9_]+(?![\w:])")
"""A metric name in PromQL (not a part of a recording rule's level:metric:operation name)."""
_LITERAL = re.compile(r"""["'](tailgate_[a-z0-9_]+)["']""")


def _samples(family: str, kind: str) -> set[str]:
    """Sample names a metric family shows in an exposition, by its type."""
    if kind == "counter":
        return {f"{family}_total", f"{family}_created"}
    if kind == "histogram":
        return {f"{family}_{s}" for s in ("bucket", "sum", "count", "created")}
    if kind == "summary":
        return {family, f"{family}_sum", f"{family}_count", f"{family}_created"}
    if kind == "unknown":  # a name found in the source: whatever its type turns out to be
        return {family} | {f"{family}_{s}" for s in ("total", "bucket", "sum", "count")}
    return {family}


def _sampler_status() -> dict[str, Any]:
    return {
        "reader": "simulated",
        "samples": 3,
        "readings": 6,
        "reader_faults": 0,
        "store_faults": 0,
        "last_fault": None,
        "last_sample_ts": 1_700_000_000,
    }


def exported_names() -> set[str]:
    """Every sample name the gateway, task servers and edge agents export.

    Built from the metrics objects on a fresh registry, wired as the services wire them,
    plus the metric names written out in the source (families a collector only yields
    once there is something to report, e.g. with an autoscaler running).
    """
    registry, server = CollectorRegistry(), CollectorRegistry()  # one per process, as run
    GatewayService(GatewayConfig(storage_url=""), registry=registry)
    TaskServerMetrics(server, "ts-1")
    server.register(PipelineCollector(make_snapshot, "gpu-1"))
    registry.register(SamplerCollector(_sampler_status, "edge-1", "lab"))
    names: set[str] = set()
    for family in [*registry.collect(), *server.collect()]:
        names |= _samples(family.name, family.type)
        names |= {s.name for s in family.samples}
    for package in SOURCES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            for literal in _LITERAL.findall(path.read_text()):
                names |= _samples(literal, "unknown")
    return names


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    """The dashboard JSON."""
    return json.loads(path.read_text())


def panel_exprs(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Panel title -> its PromQL expressions."""
    return {
        p["title"]: [t["expr"] for t in p.get("targets", ())]
        for p in dashboard["panels"]
        if p["type"] != "row"
    }


def test_dashboard_is_an_importable_grafana_dashboard() -> None:
    dash = load_dashboard()
    assert 36 <= dash["schemaVersion"] <= 41
    assert dash["uid"] == "tailgate" and dash["title"] == "Tailgate"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"].strip() and t["refId"] for t in p["targets"])
        assert p.get("description"), p["title"]


def test_dashboard_covers_the_issue_panels() -> None:
    exprs = " ".join(e for es in panel_exprs(load_dashboard()).values() for e in es)
    for needed in (
        'tailgate_task_miss_ratio{class=~"$class|all"}',
        "histogram_quantile(0.99, sum by (le, class) "
        '(rate(tailgate_query_latency_seconds_bucket{class=~"$class"}[$__rate_interval])))',
        "rate(tailgate_admission_rejections_total",
        "tailgate_server_queue_depth",
        "tailgate_taskserver_queue_depth",
        'tailgate_server_post_queuing_seconds{q="$quantile"}',
        "tailgate_servers",
        "tailgate_autoscaler_replicas",
        "increase(tailgate_autoscaler_decisions_total",
        "tailgate_unloaded_latency_seconds",
        "tailgate_pipeline_drops_total",
        'rate(tailgate_pipeline_requests_total{outcome="on_time"',
        "rate(tailgate_pipeline_invalid_compute_seconds_total",
        "rate(tailgate_pipeline_compute_seconds_total",
        "rate(tailgate_pipeline_batch_size_sum",
        "rate(tailgate_pipeline_batch_size_count",
    ):
        assert needed in exprs, needed
    miss = next(p for p in load_dashboard()["panels"] if p["title"].startswith("Task deadline"))
    steps = miss["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps[1:]] == [0.005, 0.015, 0.017]
    assert miss["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "line"


_RANGE_FN = re.compile(r"\b(?:rate|irate|increase|delta|[a-z]+_over_time)\(")
_WINDOW = re.compile(r"\[([^\]]*)\]")
_VARIABLE = re.compile(r"\$(\w+)")
GRAFANA_BUILTINS = {"__rate_interval", "__range", "__interval"}


def test_every_rate_and_increase_takes_the_rate_interval() -> None:
    """$__rate_interval fits the scrape interval and the zoom; a fixed [1m] does neither. A
    stat tile that totals the dashboard's range may use $__range instead."""
    checked = 0
    for p in load_dashboard()["panels"]:
        for t in p.get("targets", ()):
            expr = t["expr"]
            windows = _WINDOW.findall(expr)
            assert len(windows) == len(_RANGE_FN.findall(expr)), (p["title"], expr)
            allowed = {"$__rate_interval", "$__range"} if p["type"] == "stat" else set()
            for window in windows:
                assert window in allowed | {"$__rate_interval"}, (p["title"], expr)
                checked += 1
    assert checked >= 25


def test_pool_class_and_job_variables_exist_and_panels_use_them() -> None:
    dash = load_dashboard()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    exprs = [e for es in panel_exprs(dash).values() for e in es]
    for name, source in (
        ("pool", "tailgate_servers"),
        ("class", "tailgate_queries_total"),
        ("job", "up"),
    ):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"] == {
            "type": "prometheus",
            "uid": "${datasource}",
        }
        assert v["query"]["query"] == f"label_values({source}, {name})"
        assert v["multi"] and v["includeAll"] and v["allValue"] == ".*"
        users = [e for e in exprs if f'{name}=~"${name}' in e]
        assert len(users) >= 3, f"${name} filters only {users}"
    used = {m for e in exprs for m in _VARIABLE.findall(e)}
    assert used - GRAFANA_BUILTINS <= set(variables), used - GRAFANA_BUILTINS - set(variables)


def _panel(title: str) -> dict[str, Any]:
    return next(p for p in load_dashboard()["panels"] if p["title"] == title)


def test_the_latency_panel_draws_each_class_slo_as_a_dashed_line() -> None:
    panel = _panel("Query p99 latency per class")
    slo = [t for t in panel["targets"] if "tailgate_class_slo_latency_seconds" in t["expr"]]
    assert len(slo) == 1 and slo[0]["legendFormat"] == "{{class}} SLO"
    (override,) = panel["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byFrameRefID", "options": slo[0]["refId"]}
    style = {p["id"]: p["value"] for p in override["properties"]}
    assert style["custom.lineStyle"]["fill"] == "dash"
    assert panel["fieldConfig"]["defaults"]["unit"] == "s"


def test_stat_tiles_show_the_service_level_at_a_glance() -> None:
    stats = {
        p["title"]: " ".join(t["expr"] for t in p["targets"])
        for p in load_dashboard()["panels"]
        if p["type"] == "stat"
    }
    assert set(stats) == {
        "SLO attainment per class",
        "Error budget left per class",
        "Queries/s",
        "Servers up",
        "Admission state",
    }
    assert 'outcome="met"' in stats["SLO attainment per class"]
    assert "tailgate_class_slo_objective_ratio" in stats["Error budget left per class"]
    assert "rate(tailgate_queries_total" in stats["Queries/s"]
    assert 'tailgate_servers{state="up"' in stats["Servers up"]
    assert "tailgate_admission_rejections_total" in stats["Admission state"]
    # The SLO tiles count good and bad as the alert rules do: rejected and invalid
    # queries are out.
    for title in ("SLO attainment per class", "Error budget left per class"):
        assert 'outcome!~"rejected|invalid"' in stats[title], title


def test_no_panel_reads_a_removed_pipeline_gauge() -> None:
    exprs = " ".join(e for es in panel_exprs(load_dashboard()).values() for e in es)
    for gone in ("goodput_rps", "drop_rate", "invalid_rate", "mean_batch", "module_invalid_rate"):
        assert f"tailgate_pipeline_{gone}" not in exprs


def test_every_metric_a_panel_queries_is_exported() -> None:
    exported = exported_names()
    missing = {
        f"{title}: {name}"
        for title, exprs in panel_exprs(load_dashboard()).items()
        for expr in exprs
        for name in _NAME.findall(expr)
        if name not in exported
    }
    assert not missing, f"panels query metrics nothing exports: {sorted(missing)}"
