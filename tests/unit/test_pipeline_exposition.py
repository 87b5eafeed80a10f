"""A pipeline task server's /metrics: counters and histograms that PromQL takes rates of."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from taskserver.metrics import PipelineCollector, TaskServerMetrics

KEY = {"server": "gpu-1", "pipeline": "traffic", "dropper": "pard"}


def make_snapshot(**changes: Any) -> dict[str, Any]:
    """A pipeline executor's snapshot with the fields the collector reads."""
    snap: dict[str, Any] = {
        "pipeline": "traffic",
        "dropper": "pard",
        "in_flight": 3,
        "outcomes": {"on_time": 40, "late": 2, "dropped": 5, "cancelled": 1, "failed": 0},
        "drops_by_module": {"1": 4, "3": 1},
        "modules": {
            "1": {
                "name": "object_detection",
                "batch_sizes": {"1": 2, "3": 1, "8": 1},
                "compute_s": 1.5,
                "invalid_s": 0.25,
                "duration_scale": 1.2,
            },
            "3": {
                "name": "text_recognition",
                "batch_sizes": {},
                "compute_s": 0.0,
                "invalid_s": 0.0,
            },
        },
    }
    snap.update(changes)
    return snap


def collected(snapshot: dict[str, Any]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(PipelineCollector(lambda: snapshot, "gpu-1"))
    return registry


def test_requests_leave_the_pipeline_as_counters_by_outcome() -> None:
    registry = collected(make_snapshot())
    got = {
        outcome: registry.get_sample_value(
            "tailgate_pipeline_requests_total", {**KEY, "outcome": outcome}
        )
        for outcome in ("on_time", "late", "dropped", "cancelled", "failed")
    }
    assert got == {"on_time": 40, "late": 2, "dropped": 5, "cancelled": 1, "failed": 0}
    assert registry.get_sample_value("tailgate_pipeline_requests_in_flight", KEY) == 3
    assert registry.get_sample_value("tailgate_pipeline_drops_total", {**KEY, "module": "1"}) == 4


def test_batch_sizes_are_a_histogram_whose_mean_is_sum_over_count() -> None:
    registry = collected(make_snapshot())
    one = {**KEY, "module": "1"}

    def bucket(le: str) -> float | None:
        return registry.get_sample_value("tailgate_pipeline_batch_size_bucket", {**one, "le": le})

    # Sizes 1, 1, 3 and 8: cumulative counts per upper bound.
    assert [bucket(le) for le in ("1.0", "2.0", "4.0", "8.0", "16.0", "+Inf")] == [2, 2, 3, 4, 4, 4]
    assert registry.get_sample_value("tailgate_pipeline_batch_size_count", one) == 4
    assert registry.get_sample_value("tailgate_pipeline_batch_size_sum", one) == 13
    empty = {**KEY, "module": "3"}
    assert registry.get_sample_value("tailgate_pipeline_batch_size_count", empty) == 0


def test_compute_and_invalid_compute_are_counters_per_module() -> None:
    registry = collected(make_snapshot())
    one = {**KEY, "module": "1"}
    assert registry.get_sample_value("tailgate_pipeline_compute_seconds_total", one) == 1.5
    assert registry.get_sample_value("tailgate_pipeline_invalid_compute_seconds_total", one) == 0.25
    assert registry.get_sample_value("tailgate_pipeline_module_duration_scale", one) == 1.2
    no_scale = {**KEY, "module": "3"}
    assert registry.get_sample_value("tailgate_pipeline_module_duration_scale", no_scale) is None


def test_no_windowed_rate_or_mean_is_exported_as_a_gauge() -> None:
    registry = CollectorRegistry()
    TaskServerMetrics(registry, "gpu-1")
    registry.register(PipelineCollector(make_snapshot, "gpu-1"))
    text = generate_latest(registry).decode()
    assert "tailgate_pipeline_requests_total{" in text
    for gone in ("goodput_rps", "drop_rate", "invalid_rate", "mean_batch"):
        assert f"tailgate_pipeline_{gone}" not in text
        assert f"tailgate_pipeline_module_{gone}" not in text
    gauges = {
        m.name
        for m in registry.collect()
        if m.name.startswith("tailgate_pipeline_") and m.type == "gauge"
    }
    # The only gauges left hold a value now, not a rate or a mean over a window.
    assert gauges == {
        "tailgate_pipeline_requests_in_flight",
        "tailgate_pipeline_module_duration_scale",
        "tailgate_pipeline_module_workers",
    }
