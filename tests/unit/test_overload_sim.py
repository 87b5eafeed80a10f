"""Overload policies in the simulator: the admission throttle, the central-queue waiting
model, phased arrivals and the pool autoscaling simulator."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from admission import AdmissionController, PolicyValueError, Pressure, QueryInfo
from admission.queueing_models import central_waiting_cdf, erlang_c
from admission.swayam import estimate_backends, required_backends
from admission.throttle import AdmitThrottle
from deploy.config import ConfigError
from loadtests.sim.pool import PoolScenario, load_pool_scenario, simulate_pool
from loadtests.sim.workload import _phased
from taskserver.service_time import ServiceSpec

REPO = Path(__file__).resolve().parents[2]


# --- throttle ------------------------------------------------------------------------------


def test_throttle_steps_once_per_interval_by_the_integral_law() -> None:
    t = AdmitThrottle(0.01, interval_s=1.0, gain=0.5, min_fraction=0.02, max_step=4.0)
    assert t.update(0.03, 0.0) == 1.0  # the first call only starts the clock
    assert t.update(0.03, 0.5) == 1.0  # within the interval: unchanged
    # error = (0.01 - 0.03) / 0.01 = -2: p = exp(0.5 * -2)
    assert t.update(0.03, 1.0) == pytest.approx(math.exp(-1.0))
    # A ratio 10x the threshold is clipped to -max_step: p *= exp(0.5 * -4)
    assert t.update(0.10, 2.0) == pytest.approx(math.exp(-3.0))
    # No misses: error = +1, p *= exp(0.5)
    assert t.update(0.0, 3.0) == pytest.approx(math.exp(-2.5))
    for k in range(4, 30):
        t.update(0.5, float(k))
    assert t.p == 0.02  # never below min_fraction
    for k in range(30, 60):
        t.update(0.0, float(k))
    assert t.p == 1.0  # never above 1
    assert t.admit(0.99) and not AdmitThrottle(0.01).admit(1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"interval_s": 0.0},
        {"gain": -1.0},
        {"min_fraction": 0.0},
        {"min_fraction": 1.5},
        {"max_step": 1.0},
    ],
)
def test_bad_throttle_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(PolicyValueError, match="throttle"):
        AdmitThrottle(0.01, **kwargs)


def test_throttle_rule_admits_about_the_fraction_it_has_reached() -> None:
    ctrl = AdmissionController(
        rule="throttle", threshold=0.01, throttle_interval_s=1.0, throttle_gain=1.0, seed=3
    )
    q = QueryInfo("A", 0, 10, 100.0, 20.0)
    assert ctrl.decide(q, Pressure(0.02), 0.0).reason == "below_threshold"
    d = ctrl.decide(q, Pressure(0.02), 1.0)  # p = exp(-1) from here on
    assert ctrl.overloaded and ctrl.throttle.p == pytest.approx(math.exp(-1.0))
    admitted = sum(
        ctrl.decide(q, Pressure(0.01), 1.0 + i * 1e-4).action == "admit" for i in range(4000)
    )
    assert admitted / 4000 == pytest.approx(math.exp(-1.0), abs=0.03)
    assert d.severity == pytest.approx(2.0)
    snap = ctrl.snapshot(2.0)
    assert snap["admit_fraction"] == pytest.approx(math.exp(-1.0))
    assert snap["rejected"] > 0 and "throttled" in snap["counts"]["A"]


# --- central-queue waiting model -----------------------------------------------------------


def test_erlang_c_matches_hand_computed_cases() -> None:
    assert erlang_c(1, 0.6) == pytest.approx(0.6)  # M/M/1: P(wait) = rho
    assert erlang_c(2, 1.0) == pytest.approx(1.0 / 3.0)
    assert erlang_c(3, 0.0) == 0.0 and erlang_c(3, 3.0) == 1.0
    # M/M/1 waiting tail: P(W > w) = rho * exp(-(mu - lambda) w)
    assert central_waiting_cdf(2.0, 1, 0.5, 1.0) == pytest.approx(1 - 0.5 * math.exp(-1.0))
    assert central_waiting_cdf(-1.0, 1, 0.5, 1.0) == 0.0
    assert central_waiting_cdf(1.0, 1, 2.0, 1.0) == 0.0  # unstable


def test_central_dispatch_needs_fewer_backends_than_random_with_retries() -> None:
    service = [1.0] * 10
    kw = {"percentile": 99.0, "target_ms": 6.0, "burst": 1.0}
    central = estimate_backends(2000.0, service, dispatch="central", **kw)
    retry = estimate_backends(2000.0, service, dispatch="retry", **kw)
    assert central.meets_target and retry.meets_target
    assert 2 < central.backends < retry.backends
    assert required_backends(2000.0, service, dispatch="central", **kw) == central.backends
    with pytest.raises(PolicyValueError, match="dispatch"):
        estimate_backends(10.0, service, dispatch="magic", **kw)


# --- phased arrivals -----------------------------------------------------------------------


def test_phases_multiply_the_rate_in_equally_long_phases() -> None:
    op = np.cumsum(np.random.default_rng(1).exponential(1.0, 200_000))
    t = _phased(op, (1.0, 2.0, 1.0))
    span = t[-1] / 3
    rates = [np.count_nonzero((t >= i * span) & (t < (i + 1) * span)) / span for i in range(3)]
    assert rates[0] == pytest.approx(1.0, rel=0.02)
    assert rates[1] == pytest.approx(2.0, rel=0.02)
    assert rates[2] == pytest.approx(1.0, rel=0.02)
    assert np.all(np.diff(t) >= 0)


# --- pool simulator ------------------------------------------------------------------------


def small_pool(**kwargs: object) -> PoolScenario:
    defaults: dict[str, object] = {
        "service": ServiceSpec(kind="exponential", mean_ms=1.0),
        "trace_s": (0.0, 10.0, 11.0, 20.0, 21.0, 30.0),
        "trace_rate": (1.0, 1.0, 2.0, 2.0, 1.0, 1.0),
        "base_rate_per_s": 1000.0,
        "target_ms": 8.0,
        "setup_s": 2.0,
        "idle_s": 3.0,
        "history_s": 5.0,
        "up_cooldown_s": 2.0,
        "down_cooldown_s": 5.0,
    }
    defaults.update(kwargs)
    return PoolScenario(**defaults)  # type: ignore[arg-type]


def test_swayam_scales_out_for_the_burst_and_its_idle_backends_retire() -> None:
    scn = small_pool()
    res = simulate_pool(scn, "swayam")
    warm = {int(p["time_s"]): p["warm"] for p in res.timeline}
    assert max(warm[t] for t in range(13, 21)) > warm[5]  # more backends in the burst
    assert warm[30] < max(warm.values())  # passive scale-in after it
    assert all(a["delta"] > 0 for a in res.actions)  # Swayam never scales in actively
    assert res.response_ms.size > 30_000 and not np.isnan(res.response_ms).any()
    assert 0.0 <= res.compliance(scn) <= 1.0
    # Started backends were paid for from start to retirement (or the end).
    assert warm[5] * 30 <= res.backend_seconds <= max(warm.values()) * 30 + 1


def test_threshold_policy_acts_on_the_miss_ratio() -> None:
    res = simulate_pool(small_pool(), "threshold")
    assert res.actions and all("miss_ratio" in a for a in res.actions)
    ups = [a for a in res.actions if a["delta"] > 0]
    assert all(a["miss_ratio"] > 0.015 for a in ups)
    with pytest.raises(ValueError, match="policy"):
        simulate_pool(small_pool(), "magic")


def test_compliance_counts_windows_that_meet_the_target() -> None:
    scn = small_pool(window_requests=2, target_ms=5.0, percentile=50.0)
    res = simulate_pool(small_pool(trace_s=(0.0, 1.0), trace_rate=(1.0, 1.0)), "swayam")
    res.response_ms = np.array([1.0, 1.0, 9.0, 9.0, 1.0, 9.0, 1.0])
    assert res.compliance(scn) == pytest.approx(2 / 3)


def test_pool_scenarios_load_and_bad_ones_name_the_key(tmp_path: Path) -> None:
    scn = load_pool_scenario(REPO / "loadtests" / "scenarios" / "swayam.toml", tmp_path)
    assert scn.name == "swayam" and scn.service.path == str(tmp_path / "xapian_quantiles.txt")
    bad = tmp_path / "bad.toml"
    bad.write_text('service = { kind = "constant", value_ms = 1.0 }\ntrace_s = [5.0, 1.0]\n')
    with pytest.raises(ConfigError, match="trace_s"):
        load_pool_scenario(bad)
    with pytest.raises(ValueError, match="trace_rate"):
        replace(small_pool(), trace_rate=(1.0,))


def test_static_provisioning_holds_the_peak_backends_and_never_scales() -> None:
    scn = small_pool()
    static, swayam = simulate_pool(scn, "static"), simulate_pool(scn, "swayam")
    warm = {p["warm"] for p in static.timeline}
    assert len(warm) == 1 and not static.actions  # the same backends throughout
    assert warm.pop() >= max(p["warm"] for p in swayam.timeline[:5])
    assert static.backend_seconds > swayam.backend_seconds
    assert static.compliance(scn) >= swayam.compliance(scn)
    assert static.predictions == [] and swayam.predictions


def test_bursty_traces_repeat_per_seed_and_burst() -> None:
    from loadtests.sim.pool import bursty_trace

    a, b, c = bursty_trace(1), bursty_trace(1), bursty_trace(2)
    assert a == b and a != c
    times, rates = a
    assert times[0] == 0.0 and times[-1] == 600.0 and list(times) == sorted(times)
    assert len(times) == len(rates)
    rises = [r2 / r1 for r1, r2 in itertools.pairwise(rates) if r2 > 1.4 * r1]
    assert rises and all(1.5 <= x <= 3.0 + 1e-9 for x in rises)
    PoolScenario(service=ServiceSpec(kind="exponential", mean_ms=1.0), trace_s=times,
                 trace_rate=rates)  # fmt: skip


def test_prediction_error_pairs_each_prediction_with_the_rate_that_came() -> None:
    from types import SimpleNamespace

    from loadtests.sim.swayam_experiments import prediction_error

    result = SimpleNamespace(
        timeline=[{"time_s": float(t), "rate_per_s": 100.0 * (t + 1)} for t in range(6)],
        predictions=[(0.0, 300.0), (1.0, 200.0), (4.0, 999.0)],  # the last one: past the end
    )
    pairs, mape = prediction_error(result, setup_s=2.0)
    assert pairs == [(2.0, 300.0, 300.0), (3.0, 200.0, 400.0)]
    assert mape == pytest.approx(0.25)
