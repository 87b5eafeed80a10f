"""The lock-free histogram exports what prometheus_client's Histogram would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

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
