"""Query mixes and SLO outcomes of the Locust users (the pure part; locust not imported)."""

from __future__ import annotations

from loadtests.locust_mix import ClassTally, classify, fanout_query, format_summary


def test_answers_sort_into_slo_outcomes_and_only_real_errors_fail() -> None:
    met = classify(200, {"class": "A", "met_slo": True, "latency_ms": 12.5})
    assert (met.name, met.ok, met.latency_ms) == ("met", True, 12.5)
    assert classify(200, {"met_slo": False, "latency_ms": 150.0}).name == "missed"
    rejected = classify(
        503,
        {"error": {"code": "admission_rejected"}, "reason": "miss_ratio_above_threshold"},
    )
    assert (rejected.name, rejected.ok, rejected.message) == (
        "rejected",
        True,
        "miss_ratio_above_threshold",
    )
    assert classify(503, {"error": {"code": "servers_down"}}).name == "rejected"
    assert classify(503, {"error": {"code": "task_dropped"}}).name == "dropped"
    timeout = classify(504, {"error": {"code": "query_timeout", "message": "not complete"}})
    assert (timeout.name, timeout.ok) == ("timeout", False)
    assert timeout.message == "HTTP 504 query_timeout: not complete"
    failed = classify(400, {"error": {"code": "invalid_request", "message": "unknown pool"}})
    assert (failed.name, failed.ok) == ("failed", False) and "unknown pool" in failed.message
    assert classify(502, "not json").name == "failed"
    gone = classify(0, None, "connection refused")
    assert (gone.name, gone.ok, gone.message) == ("failed", False, "connection refused")


def test_fanout_mix_shrinks_fanout_10_to_the_pool() -> None:
    assert fanout_query("fanout 10", "default", 4)["targets"] == {"pool": "default", "fanout": 4}
    assert fanout_query("fanout 10", "default", 32)["targets"]["fanout"] == 10
    body = fanout_query("fanout all", "default", 4, service_ms=3.0)
    assert body == {
        "class": "B",
        "targets": {"pool": "default", "all": True},
        "task": {"service_ms": 3.0},
    }
    assert fanout_query("fanout 1", "p", 0)["targets"]["fanout"] == 1


def test_a_class_meets_its_slo_when_the_met_share_reaches_its_percentile() -> None:
    ok = ClassTally("A", {"met": 99, "missed": 1, "rejected": 50}, percentile=99.0, slo_ms=100.0)
    assert ok.judged == 100 and ok.meets is True  # rejections are reported, not judged
    bad = ClassTally("B", {"met": 98, "missed": 1, "failed": 1}, percentile=99.0, slo_ms=300.0)
    assert bad.meets is False
    assert ClassTally("C", {"rejected": 3}, percentile=95.0).meets is None
    assert ClassTally("D", {"met": 3}).meets is None
    text = format_summary({"B": bad, "A": ok})
    lines = text.splitlines()
    assert lines[1].startswith("  class A: met 99, missed 1, rejected 50; met 99.00%")
    assert "target p99 <= 100 ms" in lines[1] and lines[1].endswith("MEETS its SLO")
    assert lines[2].endswith("MISSES its SLO")


def test_too_few_judged_queries_leave_a_class_undecided() -> None:
    # p99 allows one miss in 100: below 100 judged queries, one slow query would decide.
    few = ClassTally("A", {"met": 98, "missed": 1}, percentile=99.0, slo_ms=100.0)
    assert few.min_judged == 100 and few.meets is None
    assert ClassTally("A", {"met": 99}, percentile=99.0).meets is None
    assert ClassTally("A", {"met": 99, "timeout": 1}, percentile=99.0).meets is True
    assert ClassTally("A", {"met": 98, "failed": 2}, percentile=99.0).meets is False
    # p95: 20 queries.
    assert ClassTally("C", {"met": 18, "missed": 1}, percentile=95.0).meets is None
    assert ClassTally("C", {"met": 19, "missed": 1}, percentile=95.0).meets is True
    assert ClassTally("C", {"met": 18, "missed": 2}, percentile=95.0).meets is False
    line = format_summary({"A": few}).splitlines()[1]
    assert line.endswith("not judged (fewer than 100 judged queries)")
