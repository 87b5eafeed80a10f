"""Miss-ratio window arithmetic and the admission rules (TailGuard §III.D, cost ladder)."""

from __future__ import annotations

import pytest

from admission import (
    Action,
    AdmissionConfig,
    AdmissionController,
    AdmissionError,
    CostLadder,
    Decision,
    MissRatioWindow,
    PolicyValueError,
    Pressure,
    QueryInfo,
    Signal,
)

CLASSES = ["gold", "silver", "bronze"]  # most protected first: priorities 0, 1, 2
PRIORITY = {name: i for i, name in enumerate(CLASSES)}


def make_query(
    cls: str = "bronze",
    *,
    priority: int | None = None,
    fanout: int = 1,
    slo_ms: float = 2010.0,
    unloaded_ms: float = 10.0,
    waited_s: float = 0.0,
) -> QueryInfo:
    return QueryInfo(
        cls=cls,
        priority=PRIORITY[cls] if priority is None else priority,
        fanout=fanout,
        slo_ms=slo_ms,
        unloaded_ms=unloaded_ms,
        waited_s=waited_s,
    )


def create_controller(**kwargs: object) -> AdmissionController:
    kwargs.setdefault("classes", CLASSES)
    return AdmissionController(**kwargs)  # type: ignore[arg-type]


# -- MissRatioWindow ---------------------------------------------------------------------------


def test_count_window_keeps_the_last_n_tasks() -> None:
    w = MissRatioWindow(window_tasks=4)
    assert w.ratio(0.0) == 0.0 and w.count(0.0) == 0
    for missed in (False, True, False, False):
        w.record(missed, 0.0)
    assert (w.ratio(0.0), w.count(0.0)) == (0.25, 4)
    w.record(True, 1.0)  # evicts the first False: [T, F, F, T]
    assert w.ratio(1.0) == 0.5
    w.record(False, 2.0)  # evicts the first True: [F, F, T, F]
    assert (w.ratio(2.0), w.count(2.0)) == (0.25, 4)


def test_count_window_counts_each_class_separately_from_the_overall() -> None:
    w = MissRatioWindow(window_tasks=2)
    w.record(True, 0.0, "a")
    w.record(True, 1.0, "b")
    w.record(False, 2.0, "a")
    assert w.ratio(2.0) == 0.5  # overall: [b:T, a:F]
    assert w.ratio(2.0, "a") == 0.5  # a: [T, F]
    assert w.ratio(2.0, "b") == 1.0
    w.record(False, 3.0, "a")
    assert w.ratio(3.0) == 0.0  # overall: [a:F, a:F]
    assert (w.ratio(3.0, "a"), w.count(3.0, "a")) == (0.0, 2)
    assert (w.ratio(3.0, "b"), w.count(3.0, "b")) == (1.0, 1)  # b keeps its own last task
    assert (w.ratio(3.0, "nobody"), w.count(3.0, "nobody")) == (0.0, 0)


def test_time_window_holds_records_for_exactly_window_s() -> None:
    w = MissRatioWindow(window_s=10.0)
    w.record(True, 0.0)
    w.record(False, 5.0, "a")
    w.record(False, 9.5, "a")
    assert w.ratio(9.999) == 1 / 3
    assert w.count(9.999) == 3
    assert (w.ratio(10.0), w.count(10.0)) == (0.0, 2)  # the window is (now - 10, now]
    assert (w.count(15.0), w.count(15.0, "a")) == (1, 1)
    assert (w.ratio(19.5), w.count(19.5), w.count(19.5, "a")) == (0.0, 0, 0)


def test_a_record_with_an_earlier_now_counts_as_the_latest_time() -> None:
    w = MissRatioWindow(window_s=10.0)
    w.record(False, 8.0)
    w.record(True, 3.0)  # late clock read: taken at 8.0, so it lives until 18.0
    assert w.count(17.9) == 2
    assert w.count(18.0) == 0


def test_record_many_trims_a_straddling_batch_in_proportion() -> None:
    w = MissRatioWindow(window_tasks=10)
    w.record_many(3, 4, 0.0, "a")
    w.record_many(2, 8, 1.0, "a")
    # 12 tasks: 2 of the first batch leave; it keeps round(3 * 2 / 4) = 2 of its 3 misses.
    assert (w.count(1.0), w.ratio(1.0)) == (10, 0.4)
    assert w.ratio(1.0, "a") == 0.4
    big = MissRatioWindow(window_tasks=4)
    big.record_many(3, 8, 0.0)  # larger than the window: 4 tasks, round(1.5) = 2 misses
    assert (big.count(0.0), big.ratio(0.0)) == (4, 0.5)
    timed = MissRatioWindow(window_s=1.0)
    timed.record_many(1, 4, 0.0)
    timed.record(True, 0.5)
    assert timed.ratio(0.5) == 0.4
    assert (timed.ratio(1.0), timed.count(1.0)) == (1.0, 1)
    timed.record_many(0, 0, 1.0)  # nothing to count
    assert timed.count(1.0) == 1


def test_window_snapshot_reports_overall_and_classes() -> None:
    w = MissRatioWindow(window_tasks=100)
    w.record(True, 0.0, "gold")
    w.record_many(1, 3, 0.0, "bronze")
    assert w.snapshot(0.0) == {
        "ratio": 0.5,
        "tasks": 4,
        "misses": 2,
        "window_tasks": 100,
        "window_s": None,
        "classes": {
            "bronze": {"ratio": 1 / 3, "tasks": 3, "misses": 1},
            "gold": {"ratio": 1.0, "tasks": 1, "misses": 1},
        },
    }


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window_tasks": 5, "window_s": 1.0},
        {"window_tasks": None},
        {"window_tasks": 0},
        {"window_tasks": 2.5},
        {"window_s": 0.0},
        {"window_s": float("inf")},
    ],
)
def test_bad_window_sizes_are_refused(kwargs: dict) -> None:
    with pytest.raises(PolicyValueError):
        MissRatioWindow(**kwargs)


def test_bad_record_many_arguments_are_refused() -> None:
    w = MissRatioWindow()
    with pytest.raises(PolicyValueError, match="more than total"):
        w.record_many(3, 2, 0.0)
    with pytest.raises(ValueError, match="-1"):
        w.record_many(-1, 2, 0.0)
    assert w.count(0.0) == 0


# -- reject-all (TailGuard) ---------------------------------------------------------------------


def test_reject_all_rejects_above_the_threshold_until_the_ratio_falls_below_it() -> None:
    c = create_controller(threshold=0.02)
    q = make_query("gold")
    assert c.decide(q, Pressure(0.02), 0.0) == Decision(Action.ADMIT, "below_threshold", 1.0)
    d = c.decide(q, Pressure(0.025), 1.0)
    assert (d.action, d.reason) == (Action.REJECT, "miss_ratio_above_threshold")
    assert d.severity == pytest.approx(1.25)
    assert c.decide(q, Pressure(0.02), 2.0).action is Action.REJECT  # not yet below
    assert c.decide(q, Pressure(0.019), 3.0).action is Action.ADMIT
    assert c.rejected == {("gold", "miss_ratio_above_threshold"): 2}


def test_release_threshold_adds_hysteresis() -> None:
    c = create_controller(threshold=0.02, release_threshold=0.01)
    q = make_query()
    assert c.decide(q, Pressure(0.015), 0.0).action is Action.ADMIT
    assert c.decide(q, Pressure(0.025), 1.0).action is Action.REJECT
    assert (c.overloaded, c.overloaded_since) == (True, 1.0)
    assert c.decide(q, Pressure(0.015), 2.0).action is Action.REJECT  # above release
    assert c.decide(q, Pressure(0.01), 3.0).action is Action.REJECT  # not below it
    assert c.decide(q, Pressure(0.0099), 4.0).action is Action.ADMIT
    assert c.decide(q, Pressure(0.015), 5.0).action is Action.ADMIT  # not above threshold
    assert (c.overloaded, c.overloaded_since) == (False, None)


def test_rule_none_admits_everything() -> None:
    c = create_controller(rule="none")
    assert c.decide(make_query(), Pressure(1.0), 0.0).reason == "admission_off"


# -- lowest-class-first -------------------------------------------------------------------------


def test_lowest_class_first_climbs_one_class_per_step_and_spares_the_most_protected() -> None:
    c = create_controller(rule="lowest-class-first", threshold=0.25, ladder_step=0.5)

    def outcome(cls: str, ratio: float) -> tuple[Action, str]:
        d = c.decide(make_query(cls), Pressure(ratio), 0.0)
        return d.action, d.reason

    # Depth 1: above 0.25 and up to 0.25 * 1.5 inclusive: only bronze goes.
    for ratio in (0.3, 0.375):
        assert outcome("bronze", ratio) == (Action.REJECT, "lowest_class_first")
        assert outcome("silver", ratio) == (Action.ADMIT, "class_spared")
        assert outcome("gold", ratio) == (Action.ADMIT, "protected_class")
    # Depth 2 (above 0.375): silver goes too; gold never does.
    for ratio in (0.4, 1.0):
        assert outcome("silver", ratio) == (Action.REJECT, "lowest_class_first")
        assert outcome("bronze", ratio) == (Action.REJECT, "lowest_class_first")
        assert outcome("gold", ratio) == (Action.ADMIT, "protected_class")
    assert outcome("bronze", 0.1) == (Action.ADMIT, "below_threshold")
    assert c.rejected == {("bronze", "lowest_class_first"): 4, ("silver", "lowest_class_first"): 2}
    assert c.counts[("gold", "protected_class")] == 4


def test_lowest_class_first_takes_the_priority_each_query_carries() -> None:
    # No configured classes: the least protected class is the largest priority seen so far.
    c = AdmissionController(rule="lowest-class-first", threshold=0.25)
    alone = c.decide(make_query("silver", priority=1), Pressure(0.3), 0.0)
    assert alone.reason == "protected_class"  # the only class seen is the most protected
    c.decide(make_query("bronze", priority=7), Pressure(0.0), 1.0)
    assert c.decide(make_query("silver", priority=1), Pressure(0.3), 2.0).action is Action.ADMIT
    assert c.decide(make_query("bronze", priority=7), Pressure(0.3), 3.0).action is Action.REJECT
    assert c.snapshot(3.0)["classes"] == {"silver": 1, "bronze": 7}


# -- largest-fanout-first -----------------------------------------------------------------------


def test_largest_fanout_first_lowers_its_cut_as_the_overload_deepens() -> None:
    c = create_controller(rule="largest-fanout-first", threshold=0.25)
    for fanout in (1, 10, 100, 10):
        assert c.decide(make_query(fanout=fanout), Pressure(0.0), 0.0).action is Action.ADMIT

    def action(fanout: int, ratio: float) -> Action:
        return c.decide(make_query("gold", fanout=fanout), Pressure(ratio), 1.0).action

    assert action(100, 0.3) is Action.REJECT  # depth 1: cut at the largest fanout seen
    assert action(10, 0.3) is Action.ADMIT
    assert action(10, 0.4) is Action.REJECT  # depth 2: the next distinct fanout
    assert action(1, 0.4) is Action.ADMIT
    assert action(1, 1.0) is Action.REJECT  # deepest: down to the smallest, reject all
    assert action(500, 0.3) is Action.REJECT  # a new largest fanout is the cut at once
    assert c.rejected[("gold", "largest_fanout_first")] == 4
    assert c.counts[("gold", "fanout_below_cut")] == 2


# -- cost ladder --------------------------------------------------------------------------------


def queue_only_ladder(**kwargs: float) -> CostLadder:
    # severity = queue_pressure, so a test sets it directly
    return CostLadder(w_miss=0.0, w_queue=1.0, w_tail=0.0, **kwargs)


def test_severity_follows_the_documented_formula() -> None:
    c = create_controller(rule="cost-ladder", threshold=0.25)
    d = c.decide(make_query("gold"), Pressure(0.25, queue_pressure=0.5, tail_ratio=0.5), 0.0)
    assert d.severity == pytest.approx(0.5 * 1.0 + 0.2 * 0.5 + 0.3 * 0.5)
    assert CostLadder().severity(Pressure(-1.0, queue_pressure=-1.0), 0.5) == 0.0


def ladder_with_costs(fanouts: list[int], **kwargs: object) -> AdmissionController:
    """A queue-pressure-only cost ladder that has seen queries of these fanouts (10 ms each)."""
    c = create_controller(
        rule="cost-ladder",
        ladder=queue_only_ladder(**kwargs),  # type: ignore[arg-type]
        memory_queries=len(fanouts) + 1,
        max_defer_s=0.5,
    )
    for k in fanouts:
        assert c.decide(make_query(fanout=k), Pressure(0.0), 0.0).reason == "severity_below_ladder"
    return c


# Recent costs: fanout 1 (60 queries), 5 (20), 20 (15), 100 (5): short below rank 0.5, medium
# to 0.8, long to 0.95, extra-long above (ranks count ties half, the new query among them).
MIX = [1] * 60 + [5] * 20 + [20] * 15 + [100] * 5


def test_cost_ladder_climbs_the_papers_rungs_on_cost_buckets() -> None:
    c = ladder_with_costs(MIX)

    def decide(fanout: int, severity: float) -> tuple[Action, str]:
        d = c.decide(make_query(fanout=fanout), Pressure(0.0, queue_pressure=severity), 1.0)
        return d.action, d.reason

    assert decide(100, 0.44) == (Action.ADMIT, "severity_below_ladder")
    # Rung 1 (0.45): defer long and extra-long; medium and short pass.
    assert decide(100, 0.45) == (Action.DEFER, "cost_ladder_defer")
    assert decide(20, 0.45) == (Action.DEFER, "cost_ladder_defer")
    assert decide(5, 0.45) == (Action.ADMIT, "medium_bucket")
    assert decide(1, 0.45) == (Action.ADMIT, "smallest_bucket")
    # Rung 2 (0.65): reject extra-long; long still deferred.
    assert decide(100, 0.65) == (Action.REJECT, "cost_ladder_reject_xlong")
    assert decide(20, 0.65) == (Action.DEFER, "cost_ladder_defer")
    # Rung 3 (0.80): reject long too; the smallest bucket is never rejected nor deferred.
    assert decide(20, 0.8) == (Action.REJECT, "cost_ladder_reject_long")
    assert decide(5, 0.8) == (Action.ADMIT, "medium_bucket")
    assert decide(1, 50.0) == (Action.ADMIT, "smallest_bucket")
    assert c.rejected == {
        ("bronze", "cost_ladder_reject_xlong"): 1,
        ("bronze", "cost_ladder_reject_long"): 1,
    }
    assert c.overloaded


def test_uniform_and_reverse_shedding_are_the_papers_comparisons() -> None:
    rev = ladder_with_costs(MIX, shedding="reverse")
    p = Pressure(0.0, queue_pressure=0.9)
    # Stress-reversed: the cheapest are shed first and the costliest spared.
    assert rev.decide(make_query(fanout=1), p, 0.0).reason == "cost_ladder_reject_long"
    assert rev.decide(make_query(fanout=100), p, 0.0).reason == "smallest_bucket"
    uni = ladder_with_costs(MIX, shedding="uniform")
    # Cost-blind: at severity 0.625 (halfway from the defer rung to the last) about half of
    # every bucket is shed.
    half = Pressure(0.0, queue_pressure=0.625)
    for k in (1, 100):
        shed = sum(uni.decide(make_query(fanout=k), half, 0.0).action is Action.REJECT
                   for _ in range(2000))  # fmt: skip
        assert 850 < shed < 1150
    # Past the last rung it sheds all but the throttle's floor (2%), so a few queries keep
    # the signals fresh and the severity can fall again.
    top = Pressure(0.0, queue_pressure=5.0)
    kept = sum(uni.decide(make_query(fanout=1), top, 0.0).reason == "uniform_spared"
               for _ in range(5000))  # fmt: skip
    assert 50 < kept < 160


def test_a_deferral_is_bounded_by_max_defer_and_by_the_slo_slack() -> None:
    c = ladder_with_costs(MIX)
    p = Pressure(0.0, queue_pressure=0.5)

    def long_query(**kw: float) -> QueryInfo:
        return make_query(fanout=20, **kw)  # type: ignore[arg-type]

    assert c.decide(long_query(), p, 0.0).defer_s == 0.5  # slack 2 s: max_defer_s binds
    assert c.decide(long_query(waited_s=0.375), p, 0.0).defer_s == 0.125
    d = c.decide(long_query(waited_s=0.5), p, 0.0)
    assert (d.action, d.reason) == (Action.ADMIT, "defer_exhausted")
    # Slack x_p^SLO - x_p^u = 110 - 10 ms: at most half of it, 50 ms, over all deferrals (a
    # query asked again after 30 ms may wait 20 more, not another 50).
    assert c.decide(long_query(slo_ms=110.0), p, 0.0).defer_s == pytest.approx(0.05)
    again = c.decide(long_query(slo_ms=110.0, waited_s=0.03), p, 0.0)
    assert (again.action, again.defer_s) == (Action.DEFER, pytest.approx(0.02))


def test_snapshot_counts_per_class_and_reason_and_bounds_the_history() -> None:
    c = create_controller(threshold=0.02, history=3)
    for i, ratio in enumerate((0.0, 0.05, 0.05, 0.0, 0.0)):
        c.decide(make_query("silver" if i % 2 else "bronze"), Pressure(ratio), float(i))
    snap = c.snapshot(4.0)
    assert snap["rule"] == "reject-all"
    assert (snap["threshold"], snap["release_threshold"]) == (0.02, 0.02)
    assert snap["counts"] == {
        "bronze": {"below_threshold": 2, "miss_ratio_above_threshold": 1},
        "silver": {"below_threshold": 1, "miss_ratio_above_threshold": 1},
    }
    assert (snap["rejected"], snap["deferred"]) == (2, 0)
    assert [d["time"] for d in snap["decisions"]] == [2.0, 3.0, 4.0]
    assert snap["decisions"][0] == {
        "time": 2.0,
        "cls": "bronze",
        "fanout": 1,
        "action": "reject",
        "reason": "miss_ratio_above_threshold",
        "severity": 2.5,
        "defer_s": 0.0,
    }


@pytest.mark.parametrize(
    ("kwargs", "quoted"),
    [
        ({"rule": "reject-some"}, "'reject-some'"),
        ({"threshold": 0.0}, "0.0"),
        ({"threshold": 1.5}, "1.5"),
        ({"release_threshold": 0.05}, "0.05"),
        ({"max_defer_s": -1.0}, "-1.0"),
        ({"classes": ["a", "a"]}, "'a'"),
        ({"history": 0}, "0"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(kwargs: dict, quoted: str) -> None:
    with pytest.raises(PolicyValueError, match=quoted) as info:
        AdmissionController(**kwargs)
    assert isinstance(info.value, AdmissionError) and isinstance(info.value, ValueError)


def test_rule_names_are_forgiving_about_case_and_underscores() -> None:
    assert str(AdmissionController(rule="Lowest_Class_First").rule) == "lowest-class-first"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"defer_at": 0.7},  # above reject_xlong_at
        {"w_tail": -0.1},
        {"bucket_cuts": (0.5, 0.4, 0.9)},
        {"shedding": "random"},
        {"defer_slack_fraction": 1.5},
    ],
)
def test_bad_cost_ladders_are_refused(kwargs: dict) -> None:
    with pytest.raises(PolicyValueError):
        CostLadder(**kwargs)


# -- predictive (QLM §6's estimate, read against the class percentile) -------------------------


def test_predictive_rejects_below_the_class_percentile_with_a_retry_time() -> None:
    c = create_controller(rule="predictive")
    calm = Pressure(miss_ratio=0.0)
    q = QueryInfo("gold", 0, 100, 1.0, 0.6, percentile=99.0, meet_prob=0.985, wait_ms=1.5)
    d = c.decide(q, calm, 0.0)
    assert (d.action, d.reason) == (Action.REJECT, "predicted_miss")
    # The busiest target's 1.5 ms of expected wait against a 0.4 ms queueing budget.
    assert d.wait_ms == 1.5 and d.retry_after_s == pytest.approx(0.0011)
    ok = QueryInfo("gold", 0, 100, 1.0, 0.6, percentile=99.0, meet_prob=0.995, wait_ms=0.1)
    assert c.decide(ok, calm, 0.0).reason == "predicted_meet"
    # A p90 class admits the first query's prediction; a configured level overrides both.
    assert c.decide(QueryInfo("gold", 0, 1, 1.0, 0.6, percentile=90.0, meet_prob=0.985), calm,
                    0.0).action is Action.ADMIT  # fmt: skip
    strict = create_controller(rule="predictive", predictive_level=0.999)
    assert strict.decide(ok, calm, 0.0).reason == "predicted_miss"
    assert c.policy.snapshot()["predicted_rejects"] == 1


def test_predictive_passes_admitted_queries_to_its_backstop() -> None:
    c = create_controller(rule="predictive", predictive_backstop="reject-all", threshold=0.01)
    assert c.needs >= {Signal.WAIT, Signal.MISS_RATIO} and not c.clearly_admits(0.0)
    q = QueryInfo("bronze", 2, 10, 50.0, 10.0, meet_prob=1.0)
    assert c.decide(q, Pressure(miss_ratio=0.005), 0.0).reason == "predicted_meet"
    d = c.decide(q, Pressure(miss_ratio=0.02), 1.0)
    assert (d.action, d.reason) == (Action.REJECT, "miss_ratio_above_threshold")
    assert c.overloaded and c.overloaded_since == 1.0


def test_predictive_settings_are_checked() -> None:
    with pytest.raises(PolicyValueError, match="predictive_level"):
        create_controller(rule="predictive", predictive_level=1.0)
    with pytest.raises(PolicyValueError, match="predictive_backstop"):
        create_controller(rule="predictive", predictive_backstop="predictive")
    with pytest.raises(ValueError, match="predictive_backstop"):
        AdmissionConfig(rule="predictive", predictive_backstop="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="predictive_level"):
        AdmissionConfig(rule="predictive", predictive_level=0.0)
