"""The shipped Prometheus rules: loaded by the shipped config, on metrics we export.

promtool runs them on input series in tests/e2e/test_prometheus_rules.py.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.conftest import REPO_ROOT
from tests.unit.test_grafana_dashboard import _NAME, exported_names

PROMETHEUS_DIR = REPO_ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "tailgate-rules.yml"
_RECORDED = re.compile(r"(?<![\w:])[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+")
"""A recording rule's name (level:metric:operations) in PromQL."""
BUILTIN_SERIES = {"up"}
"""Series Prometheus makes itself for each target."""


def load_rules() -> list[dict[str, Any]]:
    """Every rule of the shipped rules file, recording and alerting."""
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    """Alerting rules by name."""
    return {r["alert"]: r for r in load_rules() if "alert" in r}


def test_the_shipped_prometheus_config_loads_the_rules() -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == [RULES.name]


def test_every_metric_the_rules_read_is_one_we_export() -> None:
    """Rule expressions and their annotations name only metrics the gateway, the task
    servers or the edge agents export, or series the rules themselves record."""
    exported = exported_names()
    rules = load_rules()
    recorded = {r["record"] for r in rules if "record" in r}
    missing, unrecorded, read = set(), set(), set()
    for rule in rules:
        name = rule.get("alert") or rule["record"]
        texts = [rule["expr"], *rule.get("annotations", {}).values()]
        for text in texts:
            names = set(_NAME.findall(text))
            read |= names
            missing |= {f"{name}: {n}" for n in names if n not in exported}
            unrecorded |= {f"{name}: {n}" for n in _RECORDED.findall(text) if n not in recorded}
        if re.search(r"(?<![\w:])up\{", rule["expr"]):
            read |= BUILTIN_SERIES
    assert not missing, f"rules read metrics nothing exports: {sorted(missing)}"
    assert not unrecorded, f"rules read series no rule records: {sorted(unrecorded)}"
    # The rules cover the gateway, the task servers' pipelines and the edge agents.
    for needed in (
        "tailgate_queries_total",
        "tailgate_class_slo_objective_ratio",
        "tailgate_servers",
        "tailgate_admission_rejections_total",
        "tailgate_edge_agent_last_sample_timestamp_seconds",
        "tailgate_pipeline_requests_total",
        "up",
    ):
        assert needed in read, needed


def test_slo_alerts_are_the_workbooks_window_pairs_and_burn_rates() -> None:
    """Google SRE workbook, multi-window multi-burn-rate alerts on a 30-day budget."""
    got = {}
    for name, rule in alerts().items():
        if not name.startswith("TailgateSLO"):
            continue
        labels = rule["labels"]
        long_w, short_w = labels["long_window"], labels["short_window"]
        m = re.fullmatch(
            rf"class:tailgate_slo_burn:rate{long_w} > ([\d.]+) and "
            rf"class:tailgate_slo_burn:rate{short_w} > ([\d.]+)",
            rule["expr"],
        )
        assert m and m[1] == m[2], (name, rule["expr"])
        got[(long_w, short_w, float(m[1]))] = labels["severity"]
    assert got == {
        ("1h", "5m", 14.4): "page",
        ("6h", "30m", 6.0): "page",
        ("1d", "2h", 3.0): "ticket",
        ("3d", "6h", 1.0): "ticket",
    }


def test_every_burn_rate_divides_by_the_class_error_budget() -> None:
    recorded = {r["record"]: r["expr"] for r in load_rules() if "record" in r}
    budget = recorded["class:tailgate_slo_error_budget:ratio"]
    assert budget == "1 - max by (class) (tailgate_class_slo_objective_ratio)"
    for window in ("5m", "30m", "1h", "2h", "6h", "1d", "3d"):
        burn = recorded[f"class:tailgate_slo_burn:rate{window}"]
        assert burn == (
            f"class:tailgate_slo_errors:ratio_rate{window} "
            "/ on (class) class:tailgate_slo_error_budget:ratio"
        )
        errors = recorded[f"class:tailgate_slo_errors:ratio_rate{window}"]
        assert errors.count(f"[{window}]") == 3, errors
        assert 'outcome!~"met|rejected|invalid"' in errors
        assert 'outcome!~"rejected|invalid"' in errors


def test_every_alert_says_what_broke_and_what_to_do() -> None:
    rules = alerts()
    assert {
        "TailgateSLOFastBurn",
        "TailgateSLOSlowBurn",
        "TailgateTaskServersDown",
        "TailgatePoolHasNoServerUp",
        "TailgateScrapeTargetDown",
        "TailgateAdmissionRejecting",
        "TailgateEdgeAgentStale",
        "TailgateEdgeAgentStoreFull",
        "TailgatePipelineDropRateHigh",
    } <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("page", "ticket"), name
        notes = rule["annotations"]
        assert set(notes) == {"summary", "description"}, name
        assert "\n" not in notes["summary"] and len(notes["description"]) > 150, name
