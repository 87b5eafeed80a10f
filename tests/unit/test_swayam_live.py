"""The pure parts of the live pool replay: trace cutting and scaling, the requests, the
gateway config, compliance with failures, backend-seconds from polled server sets, and the
pool simulator's random-dispatch mode it is compared with."""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace

import numpy as np
import pytest

from loadtests.sim.pool import initial_backends, simulate_pool
from loadtests.swayam_live import (
    PoolLiveRun,
    PoolSide,
    backend_seconds,
    cut_trace,
    live_compliance,
    live_wire,
    plan_requests,
    pool_gateway_toml,
    server_spans,
    sim_backend_seconds,
    with_warmup,
)
from tests.unit.test_overload_sim import small_pool as pool

# --- the trace and the requests ----------------------------------------------------------------


def test_a_cut_keeps_the_corners_inside_and_interpolates_the_ends() -> None:
    scn = cut_trace(pool(), 5.0, 10.5)
    assert scn.trace_s == (0.0, 5.0, 6.0, 10.5)
    assert scn.trace_rate == (1.0, 1.0, 2.0, 2.0)
    assert cut_trace(pool(), 10.5).trace_s == (0.0, 0.5, 9.5, 10.5, 19.5)
    assert cut_trace(pool(), 10.5).trace_rate[0] == pytest.approx(1.5)
    assert cut_trace(pool(), 0.0, 100.0).duration_s == 30.0  # clipped to the trace
    with pytest.raises(ValueError, match="start_s"):
        cut_trace(pool(), 30.0)


def test_a_warm_up_runs_the_starting_rate_before_the_trace() -> None:
    scn = with_warmup(cut_trace(pool(), 10.5, 5.0), 4.0)
    assert scn.trace_s == (0.0, 4.0, 4.5, 9.0)
    assert scn.trace_rate[:2] == (pytest.approx(1.5), pytest.approx(1.5))
    assert with_warmup(pool(), 0.0) == pool()


def test_requests_are_the_simulators_own_scaled_in_time() -> None:
    scn = pool(trace_s=(0.0, 2.0), trace_rate=(1.0, 1.0))
    one, ten = plan_requests(scn, 1.0), plan_requests(scn, 10.0)
    sim = simulate_pool(scn, "static")
    assert len(one) == len(ten) == sim.response_ms.size  # the same arrivals as the simulator
    assert len(one) == pytest.approx(2000, rel=0.1)  # 1000/s for 2 s
    for a, b in zip(one, ten, strict=True):
        assert b.at_s == pytest.approx(10.0 * a.at_s)  # times x S, so the rate / S
        assert b.service_ms == pytest.approx(10.0 * a.service_ms, abs=0.01)
    assert ten[-1].at_s < 20.0
    assert np.mean([q.service_ms for q in one]) == pytest.approx(1.0, rel=0.1)
    with pytest.raises(ValueError, match="scale"):
        plan_requests(scn, 0.0)


def test_the_gateway_config_scales_every_duration_and_pins_static() -> None:
    scn = pool()
    doc = tomllib.loads(pool_gateway_toml(scn, "swayam", 10.0, 5))
    a = doc["autoscaling"]
    assert a["policy"] == "swayam" and (a["min_replicas"], a["max_replicas"]) == (1, 64)
    assert (a["setup_s"], a["idle_s"], a["interval_s"], a["history_s"]) == (20.0, 30.0, 10.0, 50.0)
    assert (a["up_cooldown_s"], a["down_cooldown_s"], a["burst"]) == (20.0, 50.0, 1.5)
    assert doc["classes"] == [{"name": "A", "percentile": 99.0, "latency_ms": 80.0}]
    (p,) = doc["pools"]
    assert p["prior"] == {"kind": "exponential", "mean_ms": 1.0, "scale": 10.0, "tail": "paper"}
    assert p["prior_overhead_ms"] == 9.0 and p["queueing"] == "server"  # less the live wire
    assert doc["admission"] == {"policy": "none"}
    static = tomllib.loads(pool_gateway_toml(scn, "static", 10.0, 5))["autoscaling"]
    assert static["policy"] == "threshold" and static["min_replicas"] == static["max_replicas"] == 5
    with pytest.raises(ValueError, match="policy"):
        pool_gateway_toml(scn, "magic", 10.0, 5)


def test_the_live_wire_is_real_time_on_both_sides() -> None:
    scn = live_wire(pool(), 10.0)
    # 0.5 ms each way, unscaled: 0.05 ms of scenario time at scale 10
    assert (scn.send_ms, scn.reply_ms) == (0.05, 0.05)
    prior = tomllib.loads(pool_gateway_toml(scn, "swayam", 10.0, 5))["pools"][0]
    assert prior["prior_overhead_ms"] == 0.0  # the live model adds that wire itself


# --- the figures -------------------------------------------------------------------------------


def test_compliance_counts_failures_as_misses_per_window() -> None:
    scn = pool(window_requests=4, percentile=50.0, target_ms=5.0)
    ok = [1.0, 1.0, 1.0, 1.0]
    assert live_compliance(ok * 3, scn) == 1.0
    # the second window: half its requests failed, so its median misses
    assert live_compliance([*ok, None, 1.0, math.inf, 2.0, *ok], scn) == pytest.approx(2 / 3)
    # one failure in a window leaves its median alone; a partial window is not judged
    assert live_compliance([None, 1.0, 1.0, 1.0, 9.0, 9.0], scn) == 1.0
    assert math.isnan(live_compliance([1.0, 1.0], scn))


def test_backend_seconds_integrate_polled_server_sets() -> None:
    samples = [
        (-0.5, frozenset({"a", "b"})),
        (2.0, frozenset({"a", "b", "c"})),
        (5.0, frozenset({"a", "c"})),
        (7.0, frozenset({"a"})),
    ]
    spans = sorted(server_spans(samples, end_s=10.0))
    # a from the start to the end; b until the poll that missed it; c from its first poll
    assert spans == [("a", 0.0, 10.0), ("b", 0.0, 5.0), ("c", 2.0, 7.0)]
    assert backend_seconds(spans) == 20.0
    assert backend_seconds(spans, 4.0, 8.0) == 4.0 + 1.0 + 3.0
    # c counts from the scale-out decision that started it, when one lies close enough
    started = dict((s, a) for s, a, _ in server_spans(samples, 10.0, [0.5, 1.5], 1.0))
    assert started["c"] == 1.5 and started["a"] == 0.0
    far = dict((s, a) for s, a, _ in server_spans(samples, 10.0, [0.5], 1.0))
    assert far["c"] == 2.0
    # a server that comes back is counted again
    back = server_spans([(0.0, frozenset({"a"})), (1.0, frozenset()), (2.0, frozenset({"a"}))], 3)
    assert backend_seconds(back) == 2.0


@pytest.mark.parametrize("dispatch", ["central", "random"])
def test_the_simulators_backend_seconds_follow_from_its_timeline(dispatch: str) -> None:
    scn = pool()
    for policy in ("swayam", "threshold"):
        res = simulate_pool(scn, policy, dispatch)
        n0 = initial_backends(scn, policy, dispatch)
        whole = sim_backend_seconds(res, n0, 0.0, scn.duration_s)
        assert whole == pytest.approx(res.backend_seconds)
        parts = [sim_backend_seconds(res, n0, a, b) for a, b in ((0, 12.5), (12.5, 30))]
        assert sum(parts) == pytest.approx(whole)


def test_the_report_shows_both_sides_and_the_gaps() -> None:
    scn = pool()
    side = PoolSide(0.9, 100.0, 5, 3000, 4.0, 2, [(0.0, 3), (10.0, 5), (20.0, 3)])
    sim = PoolSide(1.0, 80.0, 4, 3000, 3.0, 0, [(1.0, 3), (11.0, 4)])
    run = PoolLiveRun(
        scenario=scn,
        policy="swayam",
        scale=10.0,
        warmup_s=5.0,
        live=side,
        sims={"random": sim, "central": sim},
        sent=3100,
        answered={200: 3098, 0: 2},
        lateness_p99_ms=0.2,
        lateness_max_ms=1.0,
        gateway_cpu_share=0.2,
        servers_cpu_share=0.3,
        wall_s=350.0,
        valid=True,
        start_delay_s=[0.8, 1.2],
    )
    gaps = run.gaps()
    assert gaps["compliance"] == pytest.approx(-0.1) and gaps["backend_seconds"] == 0.25
    text = run.to_text()
    for part in ("live", "sim, random dispatch", "sim, central FIFO", "+25.0%", "-10.0%"):
        assert part in text
    assert "backend-seconds" in text and "peak servers" in text and "valid" in text
    assert side.servers_at(15.0) == 5 and sim.servers_at(0.5) is None


# --- the simulator's random-dispatch mode -------------------------------------------------------


def test_random_dispatch_routes_to_the_prefix_and_sizes_with_the_random_model() -> None:
    scn = pool()
    central, rand = simulate_pool(scn, "swayam"), simulate_pool(scn, "swayam", "random")
    assert rand.response_ms.size == central.response_ms.size
    assert not np.isnan(rand.response_ms).any()
    # per-server queues need at least the backends one central queue needs
    assert initial_backends(scn, "swayam", "random") >= initial_backends(scn, "swayam")
    warm = {int(p["time_s"]): p["warm"] for p in rand.timeline}
    assert max(warm[t] for t in range(13, 21)) > warm[5]  # scaled out for the burst
    assert warm[30] < max(warm.values())  # and its idle backends retired after it
    assert rand.response_ms.min() >= scn.send_ms + scn.reply_ms
    # deterministic per seed; the default stays the central queue
    again = simulate_pool(scn, "swayam", "random")
    assert np.array_equal(again.response_ms, rand.response_ms)
    assert np.array_equal(simulate_pool(scn, "swayam", "central").response_ms, central.response_ms)
    with pytest.raises(ValueError, match="dispatch"):
        simulate_pool(scn, "swayam", "round-robin")


def test_random_dispatch_threshold_and_static_keep_their_rules() -> None:
    scn = replace(pool(), seed=3)
    static = simulate_pool(scn, "static", "random")
    assert {p["warm"] for p in static.timeline} == {initial_backends(scn, "static", "random")}
    assert not static.actions
    threshold = simulate_pool(scn, "threshold", "random")
    assert all("miss_ratio" in a for a in threshold.actions)
