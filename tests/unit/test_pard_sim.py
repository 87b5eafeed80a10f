"""The PARD pipeline simulator on hand-checkable runs: batching, where requests drop, DAG merges."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from loadtests.sim.pipeline import (
    DROPPED,
    LATE,
    ON_TIME,
    PipelineModel,
    PipelineRun,
    SimConfig,
    nexus_batch_sizes,
    simulate_pipeline,
)


class ConstProfile:
    """Each module takes the same time whatever its batch size."""

    def __init__(self, ms: Mapping[str, float]) -> None:
        self.ms = dict(ms)

    def duration_ms(self, module_id: str, batch: int) -> float:
        return self.ms[module_id]


class LinearProfile:
    """duration_ms = base + slope * batch for every module."""

    def __init__(self, base: float, slope: float) -> None:
        self.base, self.slope = base, slope

    def duration_ms(self, module_id: str, batch: int) -> float:
        return self.base + self.slope * batch


def make_model(
    subs: Mapping[str, Sequence[str]],
    ms: Mapping[str, float],
    *,
    slo_s: float = 0.4,
    sizes: Sequence[int] = (1, 2, 4),
) -> PipelineModel:
    modules = {*subs, *(s for v in subs.values() for s in v)}
    return PipelineModel("p", subs, slo_s, ConstProfile(ms), {m: sizes for m in modules})


def run(
    model: PipelineModel,
    arrivals: Sequence[float],
    dropper: str,
    max_batch: int = 4,
    **kw: object,
) -> PipelineRun:
    cfg = SimConfig(max_batch=dict.fromkeys(model.modules, max_batch), duration_cv=0.0, **kw)  # type: ignore[arg-type]
    return simulate_pipeline(model, arrivals, dropper, cfg)


def chain_abc(slo_s: float) -> PipelineModel:
    return make_model({"A": ["B"], "B": ["C"]}, {"A": 100.0, "B": 100.0, "C": 100.0}, slo_s=slo_s)


def test_one_module_batches_collect_while_the_previous_one_runs() -> None:
    model = make_model({"A": []}, {"A": 10.0})
    out = run(model, [0.0] * 10, "none")
    # The first request finds the worker idle and runs alone; the others fill batches of 4.
    assert [b.size for b in out.batches] == [1, 4, 4, 1]
    assert [b.start_s for b in out.batches] == pytest.approx([0.0, 0.01, 0.02, 0.03])
    assert sorted(out.latency_s) == pytest.approx([0.01] + [0.02] * 4 + [0.03] * 4 + [0.04])
    assert (out.outcome == ON_TIME).all()
    assert out.summary.on_time == 10 and out.summary.drop_rate == 0.0


def test_batches_never_exceed_the_batch_size_and_use_profiled_sizes_under_load() -> None:
    model = make_model({"A": []}, {"A": 10.0}, sizes=(1, 2, 4, 8))
    arrivals = np.arange(400) * 0.001  # 1000 req/s against 800 req/s at b = 8
    out = run(model, arrivals, "none", max_batch=8)
    sizes = [b.size for b in out.batches]
    assert max(sizes) == 8 and set(sizes) <= {1, 2, 4, 8}  # feasible targets, as live
    # Saturated: full batches but the first and the drain (7 left run as 4, 2, 1).
    assert sizes[0] == 1 and sizes[-3:] == [4, 2, 1]
    assert sizes.count(8) == len(sizes) - 4
    assert sum(sizes) == 400


def test_the_open_batch_grows_with_the_backlog_and_outdated_decisions_are_rechecked() -> None:
    # d(b) = 10 + 10 b ms. r0 runs alone (0-20 ms); r1 joins the open batch at target 1
    # (ends 40 ms: 40 ms <= 65 ms). r2-r4 at 10 ms grow the target to 4 (ends 70 ms, 60 ms
    # for them). At the start (20 ms) r1, decided at a smaller target, is decided again with
    # d(4): 70 ms > 65 ms, so A drops it as the live worker's recheck does; 3 run.
    model = PipelineModel("p", {"A": []}, 0.065, LinearProfile(10.0, 10.0), {"A": (1, 2, 4)})
    cfg = SimConfig(max_batch={"A": 4}, duration_cv=0.0)
    out = simulate_pipeline(model, [0.0, 0.0, 0.01, 0.01, 0.01], "nexus", cfg)
    assert [(b.start_s, b.size) for b in out.batches] == [(0.0, 1), (0.02, 3)]
    assert list(out.outcome) == [ON_TIME, DROPPED, ON_TIME, ON_TIME, ON_TIME]
    assert out.finish_s[1] == pytest.approx(0.02)
    assert out.latency_s[2:] == pytest.approx([0.05] * 3)


def test_nexus_rule_picks_the_largest_batch_whose_worst_case_fits_the_share() -> None:
    model = PipelineModel(
        "p", {"A": ["B"]}, 0.4, LinearProfile(10.0, 5.0), {"A": (1, 4, 16, 32), "B": (1, 4, 16)}
    )
    # Shares: A 400 * 170 / 260 = 261.5 ms, B 400 * 90 / 260 = 138.5 ms; 2 d(b) within them.
    assert nexus_batch_sizes(model) == {"A": 16, "B": 4}


def test_pard_drops_a_hopeless_request_at_the_first_module() -> None:
    # r2 arrives 30 ms after r1 and waits 70 ms behind it at A: L = 0.07 + 0.1 + 0.2 + w_1
    # with w_1 = 0.045 (lambda = 0.1 of two U[0, 0.1] waits) > 0.35, and indeed it would
    # finish at 0.4 (latency 0.37).
    arrivals = [0.0, 0.03]
    pard = run(chain_abc(0.35), arrivals, "pard", max_batch=1)
    assert pard.dropped_at == [None, "A"]
    assert list(pard.outcome) == [ON_TIME, DROPPED]
    # PARD-back sees only L_pre + L_cur: it keeps r2 until C, after 0.2 s of compute.
    back = run(chain_abc(0.35), arrivals, "back", max_batch=1)
    assert back.dropped_at == [None, "C"]
    # No dropping: r2 completes, late.
    none = run(chain_abc(0.35), arrivals, "none", max_batch=1)
    assert list(none.outcome) == [ON_TIME, LATE]
    assert none.latency_s[1] == pytest.approx(0.37)


def test_goodput_drop_rate_and_invalid_rate_of_the_small_run() -> None:
    arrivals = [0.0, 0.03]
    figures = {}
    for dropper in ("pard", "back", "none"):
        s = run(chain_abc(0.35), arrivals, dropper, max_batch=1).summary
        figures[dropper] = (s.on_time, s.drop_rate, s.invalid_rate)
    assert figures["pard"] == (1, 0.5, 0.0)  # dropped before any compute
    assert figures["back"] == pytest.approx((1, 0.5, 0.2 / 0.5))  # A and B of r2 wasted
    assert figures["none"] == pytest.approx((1, 0.5, 0.3 / 0.6))  # late: all of r2 wasted
    out = run(chain_abc(0.35), arrivals, "pard", max_batch=1)
    assert [(p.time_s, p.goodput_rps, p.on_time, p.dropped) for p in out.timeline] == [
        (1.0, 1.0, 1, 1)
    ]
    assert out.drops_by_module() == {"A": 1, "B": 0, "C": 0}


def dag(slo_s: float) -> PipelineModel:
    subs = {"A": ["B", "C"], "B": ["D"], "C": ["D"]}
    return make_model(subs, {"A": 10.0, "B": 50.0, "C": 150.0, "D": 10.0}, slo_s=slo_s)


def test_dag_merge_waits_for_both_branches() -> None:
    out = run(dag(0.4), [0.0], "pard")
    by_module = {b.module_id: b for b in out.batches}
    assert by_module["B"].start_s == pytest.approx(0.01)
    assert by_module["C"].start_s == pytest.approx(0.01)
    assert by_module["D"].start_s == pytest.approx(0.16)  # after C, the slower branch
    assert len(out.batches) == 4
    assert out.latency_s[0] == pytest.approx(0.17)


def test_a_drop_in_one_branch_counts_once_and_cancels_the_sibling() -> None:
    # r1 waits at C behind r0 (Nexus: it would end at 0.31 > 0.2) and is dropped there;
    # its sibling, already collected into B's next batch, leaves it, so B runs one batch.
    out = run(dag(0.2), [0.0, 0.0], "nexus", max_batch=1)
    assert list(out.outcome) == [ON_TIME, DROPPED]
    assert out.dropped_at == [None, "C"]
    assert [b.module_id for b in out.batches].count("B") == 1
    assert out.summary.dropped == 1 and out.summary.drops_by_module == {"C": 1}
    assert "D" not in {b.module_id for b in out.batches if b.start_s > 0.16}


def test_a_running_sibling_of_a_dropped_request_is_wasted_compute() -> None:
    # SLO 0.1: C (150 ms) can never make it, B's branch runs and is thrown away at the merge.
    out = run(dag(0.1), [0.0], "nexus")
    assert out.dropped_at == ["C"]
    assert {b.module_id for b in out.batches} == {"A", "B"}
    assert out.summary.invalid_rate == 1.0 and out.summary.drop_rate == 1.0


def test_requests_spread_over_workers() -> None:
    model = make_model({"A": []}, {"A": 10.0})
    out = run(model, [0.0, 0.0], "none", workers=2)
    assert sorted((b.worker, b.start_s) for b in out.batches) == [(0, 0.0), (1, 0.0)]
    assert out.latency_s == pytest.approx([0.01, 0.01])


@pytest.mark.parametrize("dropper", ["none", "nexus", "clipper++", "pard", "lbf-only", "fcfs"])
def test_every_request_ends_once_under_overload(dropper: str) -> None:
    subs = {"A": ["B", "C"], "B": ["D"], "C": ["D"]}
    model = PipelineModel(
        "p", subs, 0.2, LinearProfile(2.0, 2.5), dict.fromkeys("ABCD", (1, 2, 4, 8, 16))
    )
    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0.0, 3.0, size=1500))  # 500 req/s, 1.3x the 381 req/s at b = 16
    out = simulate_pipeline(model, arrivals, dropper, SimConfig(seed=1))
    assert (out.outcome > 0).all()
    s = out.summary
    assert s.arrived == 1500 and s.in_flight == 0
    assert s.on_time + s.late + s.dropped == 1500
    assert s.dropped == sum(d is not None for d in out.dropped_at)
    assert sum(out.drops_by_module().values()) == s.dropped
    if dropper == "none":
        assert s.dropped == 0 and s.late > 0
    else:
        assert s.dropped > 0
    assert np.nanmax(out.latency_s[out.outcome == ON_TIME]) <= 0.2
    assert len(out.timeline) >= 3


def test_runs_are_deterministic() -> None:
    model = PipelineModel(
        "p", {"A": ["B"]}, 0.1, LinearProfile(2.0, 1.0), {"A": (1, 8), "B": (1, 8)}
    )
    arrivals = np.random.default_rng(0).uniform(0, 2, size=800)
    a = simulate_pipeline(model, arrivals, "pard", SimConfig(seed=4))
    b = simulate_pipeline(model, arrivals, "pard", SimConfig(seed=4))
    assert a.dropped_at == b.dropped_at
    assert np.array_equal(a.finish_s, b.finish_s, equal_nan=True)


def test_bad_settings_are_refused() -> None:
    model = make_model({"A": []}, {"A": 10.0})
    with pytest.raises(ValueError, match="workers"):
        simulate_pipeline(model, [0.0], "none", SimConfig(workers={"A": 0}))
    with pytest.raises(ValueError, match="unknown 'nope'"):
        simulate_pipeline(model, [0.0], "nope")
    with pytest.raises(ValueError, match="arrivals_s"):
        simulate_pipeline(model, [-1.0], "none")
    with pytest.raises(ValueError, match="one source"):
        PipelineModel("p", {"A": ["C"], "B": ["C"]}, 0.4, ConstProfile({}))
