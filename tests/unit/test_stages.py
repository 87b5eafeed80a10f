"""Multi-query requests: the stage SLO rules (gateway.stages) and their simulation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gateway.stages import STAGE_RULES, stage_slo_ms
from loadtests.sim.engine import simulate
from loadtests.sim.scenario import load_scenario, parse_scenario


def test_stage_slos_share_the_remaining_slo_as_documented() -> None:
    # 10 ms left, three stages to run with x_p^u 1, 2 and 3 ms: 4 ms of slack.
    assert stage_slo_ms("remaining", 10.0, [1.0, 2.0, 3.0]) == pytest.approx(5.0)
    assert stage_slo_ms("proportional", 10.0, [1.0, 2.0, 3.0]) == pytest.approx(1 + 4 / 6)
    assert stage_slo_ms("equal", 10.0, [1.0, 2.0, 3.0]) == pytest.approx(1 + 4 / 3)
    # The last stage gets all that is left under every rule.
    for rule in STAGE_RULES:
        assert stage_slo_ms(rule, 2.5, [1.0]) == pytest.approx(2.5)
    # Overspent: the stage's SLO falls below its x_p^u, so its tasks are already late.
    assert stage_slo_ms("equal", 2.0, [1.5, 1.5]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="stage rule"):
        stage_slo_ms("greedy", 1.0, [0.5])
    with pytest.raises(ValueError, match="unloaded_ms"):
        stage_slo_ms("equal", 1.0, [])


def scenario(stages: int, rule: str = "remaining", slo_ms: float = 40.0) -> object:
    return parse_scenario(
        {
            "servers": {"count": 10},
            "fanout": {"distribution": {"1": 0.5, "4": 0.5}},
            "classes": [{"name": "I", "percentile": 99, "slo_ms": slo_ms}],
            "service": {"kind": "exponential", "mean_ms": 1.0},
            "requests": {"stages": stages, "rule": rule},
            "run": {"policy": "tf-edfq", "queries": 6_000, "seed": 4},
        }
    )


def test_requests_run_their_stages_in_a_row_at_the_same_server_load() -> None:
    one, three = simulate(scenario(1), 0.5), simulate(scenario(3), 0.5)  # type: ignore[arg-type]
    assert three.measured_queries == pytest.approx(one.measured_queries / 3, rel=0.01)
    # Requests arrive at a third of the query rate: the servers are as busy.
    assert three.utilisation == pytest.approx(one.utilisation, rel=0.05)
    # Three stages one after another take about three queries' time.
    ratio = float(np.median(three.latency_ms) / np.median(one.latency_ms))
    assert 2.5 < ratio < 4.0
    assert three.fanout.max() == 4  # judged by the widest stage


def test_a_request_whose_slo_cannot_cover_its_stages_is_refused() -> None:
    res = simulate(scenario(3, slo_ms=2.0), 0.3)  # type: ignore[arg-type]
    # Three stages of x_p^u > 1 ms each cannot fit in 2 ms: every request gets the 422.
    assert res.rejected_queries == res.measured_queries and res.latency_ms.size == 0


def test_the_stage_rule_changes_deadlines_but_not_fifo(tailbench_dir: Path) -> None:
    scn = load_scenario(Path(__file__).parents[2] / "loadtests/scenarios/multi-query.toml")
    scn = scn.with_service(replace(scn.service, path=str(tailbench_dir / "masstree_quantiles.txt")))
    scn = replace(scn, run=replace(scn.run, queries=4_000))
    runs = {
        (p, r): simulate(replace(scn, requests=replace(scn.requests, rule=r)), 0.55, policy=p)
        for p in ("fifo", "tf-edfq")
        for r in ("remaining", "equal")
    }
    # FIFO never reads a deadline: the same latencies under any rule.
    np.testing.assert_array_equal(
        runs["fifo", "remaining"].latency_ms, runs["fifo", "equal"].latency_ms
    )
    # TF-EDFQ orders by them: the rule moves the tail.
    assert not np.array_equal(
        runs["tf-edfq", "remaining"].latency_ms, runs["tf-edfq", "equal"].latency_ms
    )
