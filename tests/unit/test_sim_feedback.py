"""The event-driven engine: admission and autoscaling see each task's outcome in time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadtests.sim.engine import simulate
from loadtests.sim.scenario import Scenario, parse_scenario


def scenario(**sections: Any) -> Scenario:
    doc: dict[str, Any] = {
        "servers": {"count": 20, "slots": 1},
        "fanout": {"distribution": {"1": 0.7, "5": 0.3}},
        "classes": [
            {"name": "I", "percentile": 99, "slo_ms": 8.0},
            {"name": "II", "percentile": 99, "slo_ms": 16.0},
        ],
        "service": {"kind": "exponential", "mean_ms": 1.0},
        "run": {"policy": "tf-edfq", "queries": 20_000, "seed": 5},
    }
    doc.update(sections)
    return parse_scenario(doc)


@pytest.mark.parametrize("policy", ["fifo", "priq", "t-edfq", "tf-edfq"])
@pytest.mark.parametrize("queueing", ["server", "central"])
def test_the_event_engine_serves_as_the_vectorised_one_when_nothing_is_rejected(
    policy: str, queueing: str
) -> None:
    """Same queries, same policy queue: with admission that never fires, every task starts
    at the very time the per-server engine starts it."""
    overhead = {"dispatch_ms": 0.05, "return_ms": 0.05}
    base = scenario(run={"policy": policy, "queries": 8_000, "seed": 5, "queueing": queueing})
    base = parse_scenario({**_doc(base), "overhead": overhead})
    quiet = parse_scenario({**_doc(base), "admission": {"rule": "reject-all", "threshold": 0.999}})
    a, b = simulate(base, 0.8), simulate(quiet, 0.8)
    assert b.admission_rejected == 0
    # Equal but for float rounding: (service + dispatch) + return is added in another order.
    np.testing.assert_allclose(a.latency_ms, b.latency_ms, rtol=1e-12, atol=1e-12)
    assert a.missed == b.missed


def _doc(scn: Scenario) -> dict[str, Any]:
    return {
        "servers": {"count": scn.servers.count, "slots": scn.servers.slots},
        "fanout": {"distribution": {"1": 0.7, "5": 0.3}},
        "classes": [
            {"name": c.name, "percentile": c.percentile, "slo_ms": c.slo_ms} for c in scn.classes
        ],
        "service": {"kind": "exponential", "mean_ms": 1.0},
        "overhead": {
            "dispatch_ms": scn.overhead.dispatch_ms,
            "return_ms": scn.overhead.return_ms,
        },
        "run": {
            "policy": scn.run.policy,
            "queries": scn.run.queries,
            "seed": scn.run.seed,
            "queueing": scn.run.queueing,
        },
    }


def test_reject_all_turns_queries_away_only_while_the_window_is_above_threshold() -> None:
    base = scenario()
    bare = simulate(base, 1.2)
    assert bare.miss_ratio > 0.05  # overloaded without admission
    scn = parse_scenario(
        {
            **_doc(base),
            "admission": {"rule": "reject-all", "threshold": 0.02, "window_tasks": 0,
                          "window_s": 0.05},
        }
    )  # fmt: skip
    res = simulate(scn, 1.2)
    assert 0 < res.admission_rejected < res.measured_queries
    assert res.accepted_load < 1.2
    assert res.miss_ratio < bare.miss_ratio


def test_a_deferred_query_is_asked_again_and_dispatched_later() -> None:
    """The cost ladder defers the least protected class: those queries wait at the gateway
    (their tasks reach the servers later, their deadlines stay), or are rejected."""
    scn = parse_scenario(
        {
            **_doc(scenario()),
            "admission": {"rule": "cost-ladder", "threshold": 0.01, "max_defer_ms": 5.0},
        }
    )
    res = simulate(scn, 1.1)
    assert res.deferred > 0
    assert res.latency_ms.size + res.rejected_queries == res.measured_queries


def test_vertical_scaling_speeds_up_the_tasks_that_start_after_it() -> None:
    scn = parse_scenario(
        {
            **_doc(scenario()),
            "autoscaling": {
                "enabled": True,
                "upper": 0.02,
                "lower": 0.001,
                "window_tasks": 2_000,
                "up_cooldown_ms": 50.0,
                "down_cooldown_ms": 500.0,
                "max_steps_up": 3,
                "max_steps_down": 1,
            },
        }
    )
    on = simulate(scn, 1.0)
    assert on.scaling and on.scaling[0]["to_scale"] < 1.0  # stepped up: 20% faster service
    off = simulate(parse_scenario(_doc(scenario())), 1.0)
    assert on.miss_ratio < off.miss_ratio


def _run(scn: Scenario, load: float, policy: str, record: bool) -> tuple[Any, Any, Any]:
    from loadtests.sim.engine import build_book, query_budgets
    from loadtests.sim.events import run_with_feedback
    from loadtests.sim.waits import SimWaits
    from loadtests.sim.workload import make_workload

    w = make_workload(scn, load)
    book, ids = build_book(scn)
    budget = query_budgets(scn, w, book, ids)
    slo = np.array([c.slo_ms for c in scn.classes])
    waits = SimWaits.of(book, ids, w.tasks, record=True) if record else None
    return w, run_with_feedback(scn, w, policy, budget, slo[w.cls] - budget, None, waits), waits


@pytest.mark.parametrize("policy", ["fifo", "tf-edfq"])
def test_estimating_waits_leaves_the_schedule_alone_and_fifo_means_are_unbiased(
    policy: str,
) -> None:
    scn = scenario(run={"policy": policy, "queries": 6_000, "seed": 3})
    w, plain, _ = _run(scn, 0.7, policy, record=False)
    _, recorded, waits = _run(scn, 0.7, policy, record=True)
    np.testing.assert_array_equal(plain.start, recorded.start)
    assert waits is not None
    tq = np.repeat(np.arange(w.queries), w.fanout)
    actual = recorded.start - w.arrival_ms[tq]
    queued = waits.est_mean > 0
    assert queued.mean() > 0.3  # most tasks found their server busy at load 0.7
    if policy == "fifo":
        # Exponential service, one slot: given n in the system the wait is Erlang(n), so the
        # estimate is the conditional mean and the two means agree.
        assert waits.est_mean[queued].mean() == pytest.approx(actual[queued].mean(), rel=0.05)
        np.testing.assert_array_equal(waits.est_mean, waits.base_mean)  # nothing overtakes
    else:
        # Class II tasks are overtaken by later class-I ones: QLM's estimate falls short of
        # the actual mean, and adding the overtaking arrivals closes most of the gap.
        ii = queued & (w.cls[tq] == 1)
        short_qlm = actual[ii].mean() - waits.base_mean[ii].mean()
        short_ours = actual[ii].mean() - waits.est_mean[ii].mean()
        assert short_qlm > 0.1 * actual[ii].mean()
        assert abs(short_ours) < 0.5 * short_qlm


def test_predictive_admission_turns_away_what_would_miss() -> None:
    doc = {"admission": {"rule": "predictive"}}
    base = scenario(run={"policy": "tf-edfq", "queries": 6_000, "seed": 3})
    pred = parse_scenario({**_doc(base), **doc})
    calm = simulate(pred, 0.3)
    assert calm.admission_rejected < 0.03 * calm.measured_queries  # a few find a long queue
    hot, bare = simulate(pred, 1.5), simulate(base, 1.5)
    assert bare.admission_rejected == 0
    # Offered 1.5x what the servers can do: the rule keeps the accepted load below 1 and
    # the p99 of admitted queries near their SLOs instead of growing without bound.
    assert 0.3 * hot.measured_queries < hot.admission_rejected < hot.measured_queries
    assert hot.accepted_load < 1.0
    for i, c in enumerate(pred.classes):
        assert np.percentile(hot.latency_ms[hot.cls == i], 99) < 2 * c.slo_ms
        assert np.percentile(bare.latency_ms[bare.cls == i], 99) > 10 * c.slo_ms


def test_least_wait_choice_beats_random_on_a_heterogeneous_pool(tailbench_dir: Path) -> None:
    from dataclasses import replace

    from loadtests.sim.scenario import load_scenario

    scn = load_scenario(Path(__file__).parents[2] / "loadtests/scenarios/least-wait.toml")
    scn = scn.with_service(replace(scn.service, path=str(tailbench_dir / "masstree_quantiles.txt")))
    scn = replace(scn, run=replace(scn.run, queries=4_000))
    rand = simulate(replace(scn, run=replace(scn.run, pick="random")), 0.6)
    least = simulate(scn, 0.6)
    assert scn.run.pick == "least-wait"
    assert least.accepted_load == pytest.approx(rand.accepted_load)
    # The same queries: least-wait keeps them off busy and slow servers, so the tail of
    # the same offered load is a fraction of random choice's.
    p99 = [float(np.percentile(r.latency_ms, 99)) for r in (rand, least)]
    assert p99[1] < 0.5 * p99[0]
    assert least.utilisation < rand.utilisation  # more work lands on the fast pool


def test_cost_information_levels_give_admission_the_costs_they_promise() -> None:
    from dataclasses import replace

    from loadtests.sim.events import _cost_hints
    from loadtests.sim.workload import make_workload

    scn = scenario(run={"policy": "tf-edfq", "queries": 2_000, "seed": 3})
    w = make_workload(scn, 0.5)
    unloaded = np.where(w.fanout == 1, 2.0, 5.0)

    def hints(level: str) -> np.ndarray | None:
        return _cost_hints(replace(scn, run=replace(scn.run, cost_information=level)), w,
                           unloaded)  # fmt: skip

    assert hints("estimate") is None  # the rules' own k_f * x_p^u
    assert np.all(hints("none") == 1.0)
    exact = hints("exact")
    assert exact is not None
    q = int(np.flatnonzero(w.fanout == 5)[0])
    lo, hi = int(w.offsets[q]), int(w.offsets[q + 1])
    assert exact[q] == pytest.approx(w.task_service_ms[lo:hi].sum())
    by_class = hints("class")
    assert by_class is not None
    for c in (0, 1):
        mine = w.cls == c
        assert np.all(by_class[mine] == pytest.approx((w.fanout * unloaded)[mine].mean()))
