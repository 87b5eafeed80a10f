"""The event-driven engine: admission and autoscaling see each task's outcome in time."""

from __future__ import annotations

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
