"""The live replay's plan: the simulator's workload as time-scaled HTTP queries."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from deploy.config import parse_config
from loadtests.live_plan import (
    POOLED_CDF_WINDOW,
    gateway_picks,
    live_gateway_toml,
    plan_queries,
    pool_of_servers,
    server_ids,
)
from loadtests.sim.scenario import load_scenario
from loadtests.sim.tailbench import TAILBENCH_DIR
from loadtests.sim.workload import make_workload
from taskserver.service_time import ServiceSpec

REPO = Path(__file__).resolve().parents[2]
SHARED = TAILBENCH_DIR


def _scenario(name: str = "fixed-fanout-two-classes", **run):  # Masstree's table
    scn = load_scenario(REPO / "loadtests" / "scenarios" / f"{name}.toml")
    scn = scn.with_service(
        ServiceSpec(kind="quantiles", path=str(SHARED / "masstree_quantiles.txt"))
    )
    return replace(scn, run=replace(scn.run, **{"queries": 200, **run}))


def _pooled(pick: str = "least-wait", **run):
    """The least-wait scenario: a fast pool of 50 and a 2x slower one of 50."""
    return _scenario("least-wait", pick=pick, **run)


def test_the_plan_sends_the_simulators_queries_scaled() -> None:
    scn = _scenario()
    plan = plan_queries(scn, 0.5, 100.0, prefix="em")
    w = make_workload(scn, 0.5)
    assert len(plan) == w.queries == 200
    assert np.allclose([q.at_s for q in plan], w.arrival_ms * 100.0 / 1000.0)
    ids = server_ids(scn, "em")
    assert len(ids) == len(set(ids)) == scn.servers.count == 100
    assert ids[0] == "em-1-1" and ids[-1] == "em-4-25"  # 4 processes of 25
    assert not gateway_picks(scn)  # no pools, random pick: the simulator's very servers
    q = plan[7]
    lo, hi = int(w.offsets[7]), int(w.offsets[8])
    servers = q.body["targets"]["servers"]
    assert servers == [ids[i] for i in w.task_server[lo:hi]] and q.fanout == hi - lo == 100
    assert q.body["targets"].keys() == {"servers"}
    times = q.body["task"]["service_ms_on"]
    assert list(times) == servers
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


def test_a_pooled_scenario_lets_the_gateway_pick_and_times_every_server() -> None:
    scn = _pooled()
    plan = plan_queries(scn, 0.5, 100.0, prefix="em")
    w = make_workload(scn, 0.5)
    ids = server_ids(scn, "em")
    assert gateway_picks(scn) and len(plan) == 200
    assert np.allclose([q.at_s for q in plan], w.arrival_ms * 100.0 / 1000.0)
    for i, q in enumerate(plan):
        assert q.body["targets"] == {"pool": "default", "fanout": int(w.fanout[i])}
        assert q.fanout == int(w.fanout[i]) and q.body["class"] == q.cls == "I"
        assert list(q.body["task"]["service_ms_on"]) == ids  # all N servers, in order
    assert {q.fanout for q in plan} == {1, 10}
    # Servers are numbered pool by pool: em-1-*, em-2-* fast, em-3-*, em-4-* slow.
    pools = pool_of_servers(scn, "em")
    assert [pools[s] for s in ids] == ["fast"] * 50 + ["slow"] * 50
    # The slow pool's servers get service_scale (2) times the base draw, the fast ones 1 x:
    # the same scenario with equal pools gives the base draws themselves.
    equal = replace(
        scn,
        servers=replace(
            scn.servers, pools=tuple(replace(p, service_scale=1.0) for p in scn.servers.pools)
        ),
    )
    base = plan_queries(equal, 0.5, 100.0, prefix="em")
    for q, b in zip(plan, base, strict=True):
        got, ref = q.body["task"]["service_ms_on"], b.body["task"]["service_ms_on"]
        for s in ids:
            want = ref[s] * (2.0 if pools[s] == "slow" else 1.0)
            assert got[s] == pytest.approx(want, abs=2e-3)
    # Distinct draws per (query, server), on the scaled Masstree law (~0.2 ms x 100).
    first = np.array([base[0].body["task"]["service_ms_on"][s] for s in ids])
    assert np.unique(first).size > 50 and 5.0 < float(np.median(first)) < 60.0


def test_both_picks_and_every_load_see_the_same_draws() -> None:
    least = plan_queries(_pooled("least-wait"), 0.5, 100.0)
    rand = plan_queries(_pooled("random"), 0.5, 100.0)
    higher = plan_queries(_pooled("least-wait"), 0.8, 100.0)
    assert [q.body for q in least] == [q.body for q in rand] == [q.body for q in higher]
    assert [q.at_s for q in least] == [q.at_s for q in rand]
    # Another seed draws other times; more queries keep the first ones' draws.
    other = plan_queries(_pooled("least-wait", seed=2), 0.5, 100.0)
    assert other[0].body["task"] != least[0].body["task"]
    longer = plan_queries(_pooled("least-wait", queries=400), 0.5, 100.0)
    assert longer[0].body["task"] == least[0].body["task"]


def test_least_wait_without_pools_times_every_server_unscaled() -> None:
    scn = _scenario("fanout-single-class", pick="least-wait")
    assert not scn.servers.pools and gateway_picks(scn)
    plan = plan_queries(scn, 0.3, 50.0, prefix="em", per_process=50)
    ids = server_ids(scn, "em", per_process=50)
    q = plan[0]
    assert q.body["targets"] == {"pool": "default", "fanout": q.fanout}
    assert list(q.body["task"]["service_ms_on"]) == ids
    assert set(pool_of_servers(scn, "em", 50).values()) == {"default"}


def test_the_gateway_config_of_a_pooled_scenario_picks_as_the_scenario_says() -> None:
    import tomllib

    for pick in ("least-wait", "random"):
        scn = _pooled(pick)
        cfg = parse_config(tomllib.loads(live_gateway_toml(scn, 100.0, "t.txt"))).gateway
        (pool,) = cfg.pools  # one pool of all N servers, no refusal of the scenario's pools
        assert pool.name == "default" and pool.pick == pick and pool.cdf == "per-server"
        assert pool.prior.scale == pytest.approx(100.0 * scn.service.scale)
        # Pools of another speed than the prior's: a window that learns within the replay.
        assert cfg.cdf_window == POOLED_CDF_WINDOW < 4096
    plain = parse_config(tomllib.loads(live_gateway_toml(_scenario(), 100.0, "t.txt"))).gateway
    assert plain.pools[0].pick == "random" and plain.cdf_window == 4096
