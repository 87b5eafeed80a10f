"""Goodput, drop rate and invalid rate (PARD §5.1) on a hand-made event log."""

from __future__ import annotations

import pytest

from taskserver.pard import PardMetrics


def event_log() -> PardMetrics:
    """Pipeline tm (SLO 0.4 s) over modules A -> B."""
    m = PardMetrics(window_s=10.0)
    for i, rid in enumerate(("r1", "r2", "r3", "r4", "r5")):
        m.arrived(rid, "tm", slo_s=0.4, now=0.01 * i)
    m.dropped("r5", "A", now=0.05)  # dropped before any compute
    m.batch_executed("A", ["r1", "r2", "r3", "r4"], duration_s=0.04, now=0.1)  # 10 ms each
    m.dropped("r4", "B", now=0.1)  # 10 ms at A wasted
    m.batch_executed("B", ["r1", "r2", "r3"], duration_s=0.03, now=0.2)  # 10 ms each
    m.completed("r1", latency_s=0.3, now=0.3)
    m.completed("r2", latency_s=0.4, now=0.35)  # exactly the SLO: on time
    m.completed("r3", latency_s=0.5, now=0.5)  # late: counts as dropped, 20 ms wasted
    return m


def test_pipeline_figures_by_hand() -> None:
    s = event_log().pipeline("tm", now=1.0)
    assert (s.arrived, s.on_time, s.late, s.dropped, s.in_flight) == (5, 2, 1, 2, 0)
    assert s.drop_rate == pytest.approx(3 / 5)  # (2 dropped + 1 late) / 5
    assert s.compute_s == pytest.approx(0.07)
    assert s.invalid_s == pytest.approx(0.03)  # r3: 20 ms, r4: 10 ms
    assert s.invalid_rate == pytest.approx(3 / 7)
    assert s.goodput_rps == pytest.approx(2 / 10)
    assert s.drops_by_module == {"A": 1, "B": 1}


def test_goodput_counts_only_the_last_window() -> None:
    m = event_log()
    assert m.pipeline("tm", now=10.32).goodput_rps == pytest.approx(1 / 10)  # r1 (0.3) left
    assert m.pipeline("tm", now=10.4).goodput_rps == 0.0  # r2 (0.35) left too


def test_module_figures_by_hand() -> None:
    m = event_log()
    a, b = m.module("A"), m.module("B")
    assert (a.batches, a.drops) == (1, 1)
    assert a.compute_s == pytest.approx(0.04)
    assert a.invalid_s == pytest.approx(0.02)  # r3 (late) and r4 (dropped at B): 10 ms each
    assert a.invalid_rate == pytest.approx(0.5)
    assert (b.batches, b.drops) == (1, 1)
    assert b.invalid_rate == pytest.approx(1 / 3)  # r3's 10 ms of 30


def test_dag_branch_compute_after_a_drop_is_invalid_and_drops_count_once() -> None:
    m = PardMetrics()
    m.arrived("q", "da", slo_s=0.42, now=0.0)
    m.batch_executed("P", ["q"], duration_s=0.02, now=0.02)
    m.dropped("q", "F", now=0.05)  # face branch drops it
    m.dropped("q", "S", now=0.06)  # the pose branch's drop is the same request: ignored
    m.batch_executed("S", ["q", "unknown"], duration_s=0.02, now=0.07)  # wasted branch work
    s = m.pipeline("da", now=1.0)
    assert (s.dropped, s.drops_by_module) == (1, {"F": 1})
    assert s.compute_s == pytest.approx(0.03) and s.invalid_rate == pytest.approx(1.0)
    assert m.unattributed_s == pytest.approx(0.01)
    assert m.pipelines() == ["da"]


def test_in_flight_requests_do_not_count_yet() -> None:
    m = PardMetrics()
    m.arrived("a", "tm", slo_s=0.4, now=0.0)
    m.arrived("b", "tm", slo_s=0.4, now=0.0)
    m.batch_executed("A", ["a", "b"], duration_s=0.02, now=0.02)
    m.completed("a", latency_s=0.1, now=0.1)
    s = m.pipeline("tm", now=0.1)
    assert (s.in_flight, s.drop_rate, s.compute_s) == (1, 0.0, pytest.approx(0.01))


def test_bad_window() -> None:
    with pytest.raises(ValueError, match=r"window_s.*-2"):
        PardMetrics(window_s=-2)
