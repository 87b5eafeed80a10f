"""The process heap (taskserver.heap): `settle_heap` takes what is alive at start-up out of the
collector's sight; its passes are timed; servers that join later are frozen after a burst."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from taskserver import heap
from taskserver.heap import (
    GC_PAUSE_BUCKETS_S,
    YOUNG_THRESHOLD,
    GcPauses,
    Refreeze,
    gc_pauses,
    refreeze,
    settle_heap,
)
from taskserver.metrics import register_build_info


@pytest.fixture
def gc_state() -> Iterator[None]:
    """The collector as it was, afterwards (the test process's own heap is not frozen), and
    a process that has not settled its heap, before and after."""
    threshold = gc.get_threshold()
    settled = heap._settled
    heap._settled = False
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    heap._settled = settled


@pytest.mark.usefixtures("gc_state")
def test_settling_freezes_what_is_alive_and_raises_the_young_threshold() -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    settle_heap()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    later = [[i] for i in range(100)]  # a service started later in the same process
    collections = gc.get_stats()[2]["collections"]
    settle_heap()
    assert gc.get_stats()[2]["collections"] == collections  # only the first one collects
    assert gc.get_freeze_count() >= frozen + len(later)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)


@pytest.mark.usefixtures("gc_state")
def test_a_higher_threshold_already_set_is_kept() -> None:
    gc.set_threshold(50_000, 10, 10)
    settle_heap()
    assert gc.get_threshold()[0] == 50_000


@pytest.mark.usefixtures("gc_state")
def test_refreezing_needs_a_settled_heap() -> None:
    gc.unfreeze()
    assert not refreeze()  # a process that never settled (a test process hosting services)
    assert gc.get_freeze_count() == 0
    settle_heap()
    assert heap._settled
    frozen = gc.get_freeze_count()
    joined = [[i] for i in range(500)]  # the objects of servers that joined later
    assert refreeze()
    assert gc.get_freeze_count() >= frozen + len(joined)


def test_pauses_are_timed_by_generation() -> None:
    now = [0.0]
    pauses = GcPauses(clock=lambda: now[0])
    for gen, took in ((0, 0.00005), (0, 0.0003), (2, 0.52), (1, 0.002)):
        pauses("start", {"generation": gen})
        now[0] += took
        pauses("stop", {"generation": gen, "collected": 0, "uncollectable": 0})
    assert [pauses.passes(g) for g in range(3)] == [2, 1, 1]
    assert pauses.longest_s[2] == pytest.approx(0.52)
    assert pauses.total_s[0] == pytest.approx(0.00035)
    # 0.52 s is above 0.25 and below 1.0: the bucket of bound 1.0.
    assert pauses.buckets[2][GC_PAUSE_BUCKETS_S.index(1.0)] == 1


def test_a_pass_that_cannot_be_timed_is_counted_not_raised() -> None:
    """A collection at the recursion limit: the callback raises nothing, and a "stop"
    whose "start" went untimed is not taken as a pause from an older start."""
    now, fail = [0.0], [""]

    def clock() -> float:
        if fail[0]:
            raise RecursionError(f"maximum recursion depth exceeded {fail[0]}")
        return now[0]

    pauses = GcPauses(clock=clock)
    done = {"generation": 0, "collected": 0, "uncollectable": 0}
    pauses("start", {"generation": 0})
    now[0] += 0.001
    pauses("stop", done)
    fail[0] = "at the start"
    pauses("start", {"generation": 0})
    fail[0] = ""
    now[0] += 100.0
    pauses("stop", done)  # its start was not timed: no pause of 100 s
    fail[0] = "at the stop"
    pauses("start", {"generation": 0})
    pauses("stop", done)
    fail[0] = ""
    assert pauses.passes(0) == 1 and pauses.untimed == 2
    assert pauses.longest_s[0] == pytest.approx(0.001)
    pauses("start", {"generation": 2})
    now[0] += 0.25
    pauses("stop", {**done, "generation": 2})
    assert pauses.passes(2) == 1 and pauses.longest_s[2] == pytest.approx(0.25)


def test_every_process_exports_its_real_collector_passes() -> None:
    registry = CollectorRegistry()
    register_build_info(registry, "gateway")
    before = gc_pauses().passes(2)
    gc.collect()
    assert gc_pauses().passes(2) == before + 1
    text = generate_latest(registry).decode()
    line = next(x for x in text.splitlines() if x.startswith("tailgate_gc_pause_seconds_count"))
    assert line.startswith('tailgate_gc_pause_seconds_count{generation="0"}')
    full_pass = 'tailgate_gc_pause_seconds_count{generation="2"}'
    full = next(x for x in text.splitlines() if x.startswith(full_pass))
    assert float(full.rsplit(" ", 1)[1]) == before + 1


def test_a_burst_of_joins_is_frozen_once_it_has_been_quiet() -> None:
    r = Refreeze(quiet_s=2.0, min_new=3)
    assert r.joined(0.0) is None and r.joined(0.1) is None  # too few to bother
    assert r.joined(0.2) == 2.0  # enough: ask again in quiet_s
    assert not r.due(1.0)
    assert r.joined(1.5) == 2.0  # the burst goes on: the wait starts again
    assert not r.due(3.0)
    assert r.due(3.5)
    r.frozen()
    assert r.freezes == 1 and not r.due(10.0)  # nothing new since


@pytest.mark.parametrize(("quiet_s", "min_new"), [(-1.0, 3), (1.0, 0)])
def test_bad_refreeze_settings_are_refused(quiet_s: float, min_new: int) -> None:
    with pytest.raises(ValueError, match="quiet_s must be >= 0 and min_new >= 1"):
        Refreeze(quiet_s=quiet_s, min_new=min_new)
