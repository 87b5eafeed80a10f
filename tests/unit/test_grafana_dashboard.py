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

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "tailgate-dashboard.json"
SOURCES = ("gateway", "admission", "taskserver", "edge_agent")
"""Packages whose source may define metric names (scanned as text, not imported)."""
_NAME = re.compile(r"\btailgate_[a-zA-Z0-9_]+")
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


def _pipeline_snapshot() -> dict[str, Any]:
    return {
        "pipeline": "traffic",
        "dropper": "pard",
        "goodput_rps": 1.0,
        "drop_rate": 0.0,
        "invalid_rate": 0.0,
        "drops_by_module": {"1": 2},
        "modules": {"1": {"name": "object_detection", "mean_batch": 1.5}},
    }


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
    server.register(PipelineCollector(_pipeline_snapshot, "gpu-1"))
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
        "tailgate_task_miss_ratio",
        "histogram_quantile(0.99, sum by (le, class) "
        "(rate(tailgate_query_latency_seconds_bucket[1m])))",
        "rate(tailgate_admission_rejections_total[1m])",
        "tailgate_server_queue_depth",
        "tailgate_taskserver_queue_depth",
        'tailgate_server_post_queuing_seconds{q="$quantile"}',
        "tailgate_servers",
        "tailgate_autoscaler_replicas",
        "increase(tailgate_autoscaler_decisions_total[5m])",
        "tailgate_unloaded_latency_seconds",
        "tailgate_pipeline_drops_total",
        "tailgate_pipeline_goodput_rps",
        "tailgate_pipeline_invalid_rate",
        "tailgate_pipeline_mean_batch",
    ):
        assert needed in exprs, needed
    miss = next(p for p in load_dashboard()["panels"] if p["title"].startswith("Task deadline"))
    steps = miss["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps[1:]] == [0.005, 0.015, 0.017]
    assert miss["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "line"


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
