"""The live replay's plan: the simulator's workload as time-scaled HTTP queries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from deploy.config import parse_config
from loadtests.live_plan import live_gateway_toml, plan_queries, server_ids
from loadtests.sim.scenario import load_scenario
from loadtests.sim.workload import make_workload

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data" / "tailbench"


def _scenario():  # the §IV.C scenario, Masstree's table
    from dataclasses import replace

    from taskserver.service_time import ServiceSpec

    scn = load_scenario(REPO / "loadtests" / "scenarios" / "fixed-fanout-two-classes.toml")
    scn = scn.with_service(
        ServiceSpec(kind="quantiles", path=str(SHARED / "masstree_quantiles.txt"))
    )
    return replace(scn, run=replace(scn.run, queries=200))


def test_the_plan_sends_the_simulators_queries_scaled() -> None:
    scn = _scenario()
    plan = plan_queries(scn, 0.5, 100.0, prefix="em")
    w = make_workload(scn, 0.5)
    assert len(plan) == w.queries == 200
    assert np.allclose([q.at_s for q in plan], w.arrival_ms * 100.0 / 1000.0)
    ids = server_ids(scn, "em")
    assert len(ids) == len(set(ids)) == scn.servers.count == 100
    assert ids[0] == "em-1-1" and ids[-1] == "em-4-25"  # 4 processes of 25
    q = plan[7]
    lo, hi = int(w.offsets[7]), int(w.offsets[8])
    servers = q.body["targets"]["servers"]
    assert servers == [ids[i] for i in w.task_server[lo:hi]] and q.fanout == hi - lo == 100
    times = q.body["task"]["service_ms_on"]
    assert times[servers[3]] == pytest.approx(w.task_service_ms[lo + 3] * 100.0)
    assert q.body["class"] == scn.classes[int(w.cls[7])].name


def test_servers_spread_evenly_over_processes() -> None:
    from loadtests.live_plan import process_counts

    assert process_counts(100, 25) == [25, 25, 25, 25]
    assert process_counts(101, 25) == [21, 20, 20, 20, 20]
    assert process_counts(1, 25) == [1]


def test_the_gateway_config_scales_slos_and_prior_and_loads() -> None:
    import tomllib

    scn = _scenario()
    text = live_gateway_toml(scn, 100.0, str(SHARED / "masstree_quantiles.txt"))
    cfg = parse_config(tomllib.loads(text)).gateway
    assert [c.latency_ms for c in cfg.classes] == [c.slo_ms * 100.0 for c in scn.classes]
    (pool,) = cfg.pools
    assert pool.queueing == scn.run.queueing and pool.policy == scn.run.policy
    assert pool.prior.scale == pytest.approx(100.0 * scn.service.scale)
    # The scenario has no admission control: the live gateway must not reject queries.
    assert not cfg.admission.enabled and not scn.admission.enabled
    adm = load_scenario(REPO / "loadtests" / "scenarios" / "admission.toml")
    live_adm = parse_config(tomllib.loads(live_gateway_toml(adm, 100.0, "t.txt"))).gateway.admission
    assert live_adm.rule == adm.admission.rule and live_adm.enabled
    assert live_adm.throttle_interval_s == pytest.approx(adm.admission.throttle_interval_s * 100)
    with pytest.raises(ValueError, match="scale: must be > 0"):
        plan_queries(scn, 0.5, 0.0)
