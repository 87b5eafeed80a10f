"""The chaos soak's pure parts: the seeded fault schedule, the query plan, the report."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

from loadtests.soak_plan import (
    KINDS,
    MAX_CONCURRENT,
    RECOVER_S,
    Fault,
    build_schedule,
    plan_queries,
)
from loadtests.soak_report import (
    ALLOWED_5XX,
    FAULT_TAIL_S,
    EdgeCheck,
    QueryRecord,
    fault_windows,
    lost_readings,
    problems,
    tally,
    timeline,
    to_markdown,
)

SERVERS = ["ts-1", "ts-2", "ts-3"]
AGENTS = ["edge-1", "edge-2"]


def _schedule(seed: int = 1, duration_s: float = 120.0, **kw: Any) -> list[Fault]:
    return build_schedule(seed, duration_s, SERVERS, AGENTS, "gw-b", **kw)


# -- the schedule --------------------------------------------------------------------------


def test_one_seed_gives_one_schedule_and_another_seed_another() -> None:
    assert _schedule(7) == _schedule(7)
    assert _schedule(7, 1800.0) == _schedule(7, 1800.0)
    assert _schedule(7) != _schedule(8)


@pytest.mark.parametrize("seed", range(1, 21))
def test_two_minutes_cover_every_fault_of_every_tier(seed: int) -> None:
    faults = _schedule(seed)
    pairs = {(f.tier, f.kind) for f in faults}
    assert pairs == {(t, k) for t, kinds in KINDS.items() for k in kinds}
    assert {f.target for f in faults if f.tier == "gateway"} == {"gw-b"}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_faults_respect_the_window_and_the_overlap_limits(seed: int) -> None:
    duration, warmup, quiet = 1800.0, 10.0, 20.0
    faults = _schedule(seed, duration, warmup_s=warmup, quiet_s=quiet)
    assert len(faults) > 60  # a fault every ~15 s after the coverage round
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    for f in faults:
        assert warmup <= f.at_s and f.busy_until_s <= duration - quiet
        assert f.busy_until_s == pytest.approx(f.at_s + f.hold_s + RECOVER_S)
        active = [g for g in faults if g.at_s <= f.at_s < g.busy_until_s]
        assert len(active) <= MAX_CONCURRENT
        # One fault per target at a time; a tier never loses all of its targets.
        assert len({g.target for g in active}) == len(active)
        tier = [g for g in active if g.tier == f.tier]
        assert len(tier) <= {"server": 2, "agent": 1, "gateway": 1}[f.tier]
    assert all(f.hold_s == 0.0 for f in faults if f.kind == "restart")
    assert all(1.0 <= f.hold_s <= 5.0 for f in faults if f.kind == "stop" and f.tier != "gateway")
    assert all(f.hold_s <= 3.0 for f in faults if f.tier == "gateway")


def test_a_run_too_short_for_any_fault_has_none_and_bad_values_are_refused() -> None:
    assert _schedule(1, 25.0) == []
    assert build_schedule(1, 120.0, [], [], "gw-b") != []  # the replica alone
    with pytest.raises(ValueError, match="mean_gap_s"):
        _schedule(1, 120.0, mean_gap_s=0.0)


# -- the queries ---------------------------------------------------------------------------


def test_the_query_plan_is_seeded_poisson_with_the_documented_mix() -> None:
    plan = plan_queries(3, 20.0, 600.0, 3, 2)
    assert plan == plan_queries(3, 20.0, 600.0, 3, 2)
    assert plan != plan_queries(4, 20.0, 600.0, 3, 2)
    n = len(plan)
    assert abs(n - 12000) < 5 * math.sqrt(12000)  # Poisson: mean 12000, sd ~110
    times = [q.at_s for q in plan]
    assert times == sorted(times) and 0 < times[0] and times[-1] < 600.0
    pools = Counter(q.pool for q in plan)
    assert abs(pools["edge"] / n - 0.3) < 0.02
    classes = Counter(q.body["class"] for q in plan)
    assert abs(classes["A"] / n - 0.175) < 0.02
    assert {q.body["targets"]["fanout"] for q in plan if q.pool == "default"} == {1, 2}
    assert {q.body["task"]["op"] for q in plan if q.pool == "edge"} == {"latest", "range"}
    assert abs(sum(q.replica for q in plan) / n - 0.5) < 0.02
    assert {q.slo_s for q in plan if q.body["class"] == "C"} == {1.0}


def test_without_agents_no_edge_query_is_planned() -> None:
    plan = plan_queries(1, 50.0, 60.0, 4, 0)
    assert plan and {q.pool for q in plan} == {"default"}
    assert max(q.body["targets"]["fanout"] for q in plan) == 3
    with pytest.raises(ValueError, match="rate_per_s"):
        plan_queries(1, 0.0, 60.0, 3, 2)


# -- the report ----------------------------------------------------------------------------


def _records() -> list[QueryRecord]:
    return [
        QueryRecord(1.0, "default", 200, met_slo=True, latency_s=0.004),
        QueryRecord(2.0, "default", 200, met_slo=False, latency_s=0.5, failovers=["refused"]),
        QueryRecord(20.5, "default", 502, "task_failed", message="task on server ts-2 lost"),
        QueryRecord(21.0, "edge", 503, "pool_owned_elsewhere", failovers=["owner", "owner"]),
        QueryRecord(22.0, "edge", 200, met_slo=True, latency_s=0.02, failovers=["owner"]),
        QueryRecord(23.0, "default", 400, "invalid_request"),
        QueryRecord(24.0, "default", hung=True),
        QueryRecord(90.0, "default", 500, "internal"),
        QueryRecord(91.0, "edge", 0, failovers=["refused", "disconnected"]),
    ]


def test_the_tally_counts_what_the_user_saw_after_failover() -> None:
    events = [{"started_s": 20.0, "ended_s": 24.0, "recovered_s": 25.0}]
    windows = fault_windows(events)
    assert windows == [(19.5, 25.0 + FAULT_TAIL_S)]
    t = tally(_records(), windows)
    assert t["sent"] == 9
    assert t["answered"] == 7  # the hung and the unanswered ones have no status
    assert t["2xx"] == 3 and t["met_slo"] == 2
    assert t["4xx"] == {"400 invalid_request": 1}
    assert t["5xx"] == {
        "500 internal": 1,
        "502 task_failed": 1,
        "503 pool_owned_elsewhere": 1,
    }
    assert t["5xx_total"] == 3
    assert t["5xx_undocumented"] == {"500 internal": 1}
    assert t["hung"] == 1 and t["no_answer"] == 1
    assert t["failovers"] == {"disconnected": 1, "owner": 3, "refused": 2}
    assert t["queries_with_failover"] == 4
    # Outside every fault window: the 500 at 90 s and the unanswered one at 91 s.
    assert t["errors_outside_faults"] == {"500 internal": 1, "no_answer": 1}
    assert t["examples"]["502 task_failed"] == "task on server ts-2 lost"
    assert t["client_latency_ms_200"] == {"n": 3, "p50": 20.0, "p99": 500.0, "max": 500.0}
    assert t["by_pool"]["edge"] == {"200": 1, "503 pool_owned_elsewhere": 1, "no_answer": 1}
    assert "500 internal" not in ALLOWED_5XX and "502 task_failed" in ALLOWED_5XX


def test_the_timeline_bins_queries_by_send_time() -> None:
    bins = timeline(_records(), 10.0)
    assert [b["t_s"] for b in bins] == [0.0, 20.0, 90.0]
    assert bins[0] == {"t_s": 0.0, "sent": 2, "labels": {"200": 2}}
    assert sum(b["sent"] for b in bins) == 9


def test_lost_readings_are_those_committed_before_and_missing_after() -> None:
    before = {(1, 100), (1, 101), (2, 100)}
    assert lost_readings(before, before | {(1, 102)}) == 0
    assert lost_readings(before, {(1, 100), (1, 102)}) == 2


def _report(**over: Any) -> dict[str, Any]:
    records = [QueryRecord(1.0, "default", 200, met_slo=True, latency_s=0.01)]
    check = EdgeCheck(30.0, "edge-1", "kill", 50, 53, 0, "ok", 3)
    report: dict[str, Any] = {
        "config": {
            "command": "python -m loadtests.soak --minutes 2",
            "minutes": 2.0,
            "seed": 1,
            "rate_per_s": 20.0,
            "servers": 3,
            "agents": 2,
            "history_store": "sqlite",
            "hang_margin_s": 10.0,
        },
        "queries": tally(records),
        "timeline": timeline(records, 5.0),
        "events": [
            {
                "at_s": 30.0,
                "started_s": 30.0,
                "ended_s": 32.0,
                "recovered_s": 32.5,
                "kind": "kill",
                "target": "edge-1",
                "hold_s": 2.0,
                "errors": 0,
                "note": "",
            }
        ],
        "gateway_rss": {
            "gw-a": {"start_mib": 78.0, "end_mib": 79.0, "max_mib": 79.5, "restarts": 0}
        },
        "edge_checks": [check.to_json()],
        "stores": {"edge-1.db": {"integrity_check": "ok", "readings": 53}},
    }
    report.update(over)
    report["problems"] = problems(report)
    report["ok"] = not report["problems"]
    return report


def test_a_clean_run_passes_and_renders() -> None:
    report = _report()
    assert report["problems"] == []
    page = to_markdown(report)
    assert "Verdict: **PASS**" in page
    assert "| gw-a | 78.0 | 79.0 | +1.0 | 79.5 | 0 |" in page
    assert "| 30.0 | edge-1 | kill | 50 | 53 | 3 | 0 | ok |" in page


def test_hung_lost_corrupt_and_undocumented_answers_each_fail_the_run() -> None:
    hung = tally([QueryRecord(1.0, "default", hung=True)])
    assert problems(_report(queries=hung)) == [
        "1 queries hung (no answer within the client timeout)"
    ]
    bad = tally([QueryRecord(1.0, "default", 500, "internal")])
    assert problems(_report(queries=bad)) == [
        "5xx outside the documented failure modes: {'500 internal': 1}"
    ]
    lost = EdgeCheck(30.0, "edge-1", "kill", 50, 49, 1, "ok", 2).to_json()
    assert problems(_report(edge_checks=[lost])) == ["edge-1: 1 committed readings lost at kill"]
    corrupt = EdgeCheck(30.0, "edge-1", "kill", 50, 50, 0, "*** page 3 is never used", 1)
    assert problems(_report(edge_checks=[corrupt.to_json()])) == [
        "edge-1: integrity_check after kill: *** page 3 is never used"
    ]
    stalled = EdgeCheck(30.0, "edge-1", "restart", 50, 50, 0, "ok", 0).to_json()
    assert problems(_report(edge_checks=[stalled])) == [
        "edge-1: stored no new reading after its restart"
    ]
    store = {"gateway-history.db": {"integrity_check": "database disk image is malformed"}}
    assert problems(_report(stores=store)) == [
        "gateway-history.db: integrity_check at the end: database disk image is malformed"
    ]
    failed = {**_report()["events"][0], "start_failed": True, "note": "did not start again: x"}
    assert problems(_report(events=[failed])) == [
        "edge-1 after kill at 30.0 s: did not start again: x"
    ]
    page = to_markdown(_report(queries=hung))
    assert "Verdict: **FAIL**" in page and "- 1 queries hung" in page
