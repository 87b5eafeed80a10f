"""Swayam §4: rate prediction, the n_B model, scale-out, passive scale-in, backend order."""

from __future__ import annotations

import itertools
import math

import pytest

from admission import (
    IdleTracker,
    PolicyValueError,
    RatePredictor,
    ScaleDecision,
    SwayamPolicy,
    backend_order,
    estimate_backends,
    required_backends,
    response_percentile_ms,
    waiting_percentile_ms,
)
from admission.queueing_models import central_waiting_cdf

# d1 = d2 = 1 ms and a retry delay of 8 ms: every failed attempt costs c = 10 ms.
DELAYS = {"send_ms": 1.0, "reply_ms": 1.0, "retry_delay_ms": 8.0}


def create_policy(**kwargs: object) -> SwayamPolicy:
    defaults: dict[str, object] = {
        "setup_s": 2.0,
        "burst": 1.0,
        "percentile": 99.0,
        "target_ms": 41.0,
        **DELAYS,
    }
    defaults.update(kwargs)
    return SwayamPolicy(**defaults)  # type: ignore[arg-type]


# -- RatePredictor ------------------------------------------------------------------------------


def test_the_regression_line_is_extrapolated_to_now_plus_horizon() -> None:
    p = RatePredictor()
    for t, rate in ((0.0, 10.0), (1.0, 20.0), (2.0, 30.0)):
        p.observe(t, rate)
    assert p.predict(2.0, 2.0) == 50.0  # slope 10/s through (1, 20), read at t = 4
    assert p.predict(2.0, 0.0) == 30.0


def test_too_few_points_fall_back_to_the_last_rate() -> None:
    p = RatePredictor(min_points=3)
    assert p.predict(0.0, 5.0) == 0.0
    p.observe(0.0, 10.0)
    p.observe(1.0, 20.0)
    assert p.predict(1.0, 5.0) == 20.0


def test_a_falling_line_never_predicts_a_negative_rate() -> None:
    p = RatePredictor()
    for t, rate in ((0.0, 30.0), (1.0, 20.0), (2.0, 10.0)):
        p.observe(t, rate)
    assert p.predict(2.0, 5.0) == 0.0


def test_samples_older_than_history_are_forgotten() -> None:
    p = RatePredictor(history_s=10.0)
    for t, rate in ((0.0, 1000.0), (5.0, 10.0), (6.0, 20.0), (7.0, 30.0)):
        p.observe(t, rate)
    assert len(p) == 4
    assert p.predict(10.0, 0.0) == 60.0  # the t = 0 sample left at now = 10
    assert len(p) == 3


def test_samples_at_one_instant_predict_their_mean() -> None:
    p = RatePredictor()
    for rate in (10.0, 20.0, 30.0):
        p.observe(1.0, rate)
    assert p.predict(1.0, 3.0) == 20.0


def test_bad_samples_are_refused() -> None:
    p = RatePredictor()
    p.observe(5.0, 1.0)
    with pytest.raises(PolicyValueError, match="before the last sample"):
        p.observe(4.0, 1.0)
    with pytest.raises(PolicyValueError):
        p.observe(6.0, -1.0)
    with pytest.raises(PolicyValueError):
        p.predict(6.0, -1.0)


# -- waiting and response model -----------------------------------------------------------------


def test_waiting_percentile_is_swayam_eq_1() -> None:
    # rho = 0.1, p = 99: ln(0.01) / ln(0.1) = 2 attempts, one retry of 10 ms after d1 = 1 ms.
    assert waiting_percentile_ms(0.1, 99.0, **DELAYS) == pytest.approx(11.0, rel=1e-12)
    rho = 0.5
    expected = 1.0 + (math.log(0.01) / math.log(rho) - 1.0) * 10.0
    assert waiting_percentile_ms(rho, 99.0, **DELAYS) == pytest.approx(expected, rel=1e-12)
    # rho <= 1 - p/100: the first backend tried is idle often enough; never below d1.
    assert waiting_percentile_ms(0.005, 99.0, **DELAYS) == 1.0
    assert waiting_percentile_ms(0.0, 99.0, **DELAYS) == 1.0
    assert waiting_percentile_ms(1.0, 99.0, **DELAYS) == math.inf


def test_response_percentile_with_constant_service_is_waiting_plus_service() -> None:
    # 100 req/s of 10 ms over 4 backends: rho = 0.25.
    got = response_percentile_ms(100.0, [10.0], 4, percentile=99.0, **DELAYS)
    assert got == pytest.approx(waiting_percentile_ms(0.25, 99.0, **DELAYS) + 10.0, rel=1e-6)
    assert response_percentile_ms(100.0, [10.0], 1, percentile=99.0, **DELAYS) == math.inf


def test_required_backends_hand_computed_with_constant_service() -> None:
    # 100 req/s x 10 ms: offered load 1. Target 41 ms = d1 + 3 retries x 10 ms + 10 ms service,
    # so the request must succeed within 4 attempts: P(R <= 41) = 1 - rho^4 >= 0.99.
    # n = 3: rho = 1/3, 1 - 1/81 = 0.9877 (miss); n = 4: rho = 1/4, 1 - 1/256 = 0.9961 (meets).
    assert required_backends(100.0, [10.0], percentile=99.0, target_ms=41.0, **DELAYS) == 4
    estimate = estimate_backends(100.0, [10.0], percentile=99.0, target_ms=41.0, **DELAYS)
    assert (estimate.backends, estimate.meets_target, estimate.utilisation) == (4, True, 0.25)
    # The burst factor U multiplies the rate: 200 req/s needs rho <= 1/sqrt(sqrt(100)) again.
    assert (
        required_backends(100.0, [10.0], percentile=99.0, target_ms=41.0, burst=2.0, **DELAYS) == 7
    )


def test_required_backends_convolves_waiting_with_the_service_samples() -> None:
    # Service 10 or 30 ms (mean 20), 25 req/s, p90 within 41 ms:
    # n = 1, rho = 1/2: (1 - 2^-4 + 1 - 2^-2) / 2 = 0.84375 (miss)
    # n = 2, rho = 1/4: (1 - 4^-4 + 1 - 4^-2) / 2 = 0.966796875 (meets)
    assert required_backends(25.0, [10.0, 30.0], percentile=90.0, target_ms=41.0, **DELAYS) == 2


def test_required_backends_is_monotone_in_rate_and_stable() -> None:
    previous = 1
    for rate in range(0, 3001, 50):
        n = required_backends(float(rate), [5.0, 10.0, 20.0], percentile=99.0, target_ms=80.0)
        assert n >= previous
        assert n > rate * (35.0 / 3) / 1000  # rho < 1
        previous = n
    assert previous > 1


def test_an_unreachable_target_saturates_at_max_backends() -> None:
    estimate = estimate_backends(
        10.0, [50.0], percentile=99.0, target_ms=41.0, max_backends=8, **DELAYS
    )
    assert (estimate.backends, estimate.meets_target) == (8, False)
    # Overload beyond max_backends: unstable even there.
    assert required_backends(1e6, [10.0], percentile=99.0, target_ms=41.0, max_backends=8) == 8


def test_central_dispatch_finds_the_smallest_n_of_the_m_m_n_model() -> None:
    # Reference: P(R <= target) from central_waiting_cdf per service sample (Erlang C computed
    # every time), scanned n by n; estimate_backends computes Erlang C once per n.
    service = [float(x) for x in range(1, 101)]  # 1..100 ms
    hold_ms = 50.5 + 0.5 + 0.5  # mean service + d1 + d2 (the defaults)

    def cdf(n: int, rate_per_s: float, target_ms: float) -> float:
        waits = [target_ms - 0.5 - s - 0.5 for s in service]
        return math.fsum(central_waiting_cdf(w, n, rate_per_s / 1000, hold_ms) for w in waits) / 100

    for rate, target_ms, expected in ((100.0, 200.0, 7), (2000.0, 150.0, 106)):
        reference = next(n for n in range(1, 1001) if cdf(n, rate, target_ms) >= 0.99)
        estimate = estimate_backends(
            rate, service, percentile=99.0, target_ms=target_ms, dispatch="central"
        )
        assert (estimate.backends, estimate.meets_target) == (reference, True)
        assert reference == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"percentile": 100.0},
        {"target_ms": 0.0},
        {"burst": 0.5},
        {"max_backends": 0},
        {"send_ms": -1.0},
    ],
)
def test_bad_model_arguments_are_refused(kwargs: dict) -> None:
    args: dict[str, object] = {"percentile": 99.0, "target_ms": 41.0, **kwargs}
    with pytest.raises(PolicyValueError):
        required_backends(10.0, [10.0], **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("service", [[], [0.0], [-1.0, 5.0], [math.nan]])
def test_bad_service_samples_are_refused(service: list[float]) -> None:
    with pytest.raises(PolicyValueError):
        required_backends(10.0, service, percentile=99.0, target_ms=41.0)


# -- SwayamPolicy -------------------------------------------------------------------------------


def test_policy_scales_out_to_the_rate_predicted_t_setup_ahead() -> None:
    s = create_policy()
    for t, rate in ((0.0, 100.0), (1.0, 200.0), (2.0, 300.0)):
        s.observe(t, rate, [10.0])
    # Predicted 500 req/s at t = 4 (offered 5): rho^4 <= 0.01 needs n >= 5 / 0.3162 -> 16.
    assert s.decide(2.0, active=4) == ScaleDecision(12, "scale_out", 16)
    assert s.in_use == 16
    assert s.decide(2.0, active=16) == ScaleDecision(0, "sufficient", 16)
    assert s.decide(2.5, active=16) == ScaleDecision(2, "scale_out", 18)  # 550 req/s at t = 4.5


def test_measured_link_delays_enter_the_waiting_model() -> None:
    # A tight target: with d1 = d2 = 1 ms each retry costs d1 + d2 + Δ = 10 ms and d1 adds to
    # every request; measured loopback delays (0.05 ms each way) leave more of the target
    # to wait in, so fewer backends meet it.
    def backends(send_ms: float | None) -> int:
        s = create_policy(target_ms=20.0)
        if send_ms is not None:
            s.set_delays(send_ms, send_ms)
        for t in (0.0, 1.0, 2.0):
            s.observe(t, 300.0, [10.0])
        return s.decide(2.0, active=1).replicas

    assert (backends(0.05), backends(None)) == (24, 34)
    with pytest.raises(PolicyValueError, match="send_ms"):
        create_policy().set_delays(-0.1, 0.5)
    with pytest.raises(PolicyValueError, match="reply_ms"):
        create_policy().set_delays(0.5, math.inf)


def test_policy_never_scales_in_but_shrinks_the_in_use_prefix_at_most_once_per_interval() -> None:
    # min_points above the sample count: the predictor reads back the last rate.
    s = create_policy(min_points=100, scale_in_interval_s=2.0)
    s.observe(0.0, 500.0, [10.0])
    assert s.decide(0.0, active=16) == ScaleDecision(0, "sufficient", 16)
    assert s.in_use == 16
    s.observe(1.0, 10.0, [10.0])
    # 10 req/s: one backend suffices; the other 15 go idle and retire themselves.
    assert s.decide(1.0, active=16) == ScaleDecision(0, "passive_scale_in", 16)
    assert s.in_use == 1
    s.observe(1.5, 100.0, [10.0])  # a blip: n goes up at once (offered 1 -> 4 backends) ...
    s.decide(1.5, active=16)
    assert s.in_use == 4
    s.observe(2.0, 10.0, [10.0])
    s.decide(2.9, active=16)  # ... and comes down no sooner than 2 s after the last scale-in
    assert s.in_use == 4
    s.decide(3.0, active=16)
    assert s.in_use == 1
    # Each of these decisions differs from the one before (required or in use moved).
    decisions = s.snapshot(3.0)["decisions"]
    assert [d["in_use"] for d in decisions] == [16, 1, 4, 4, 1]
    assert [d["required"] for d in decisions] == [16, 1, 4, 1, 1]


def test_the_decision_history_counts_a_run_of_equal_decisions_once() -> None:
    # A steady rate decided on every second: one entry, not one per decision.
    s = create_policy(min_points=100)
    for t in range(10):
        s.observe(float(t), 500.0, [10.0])
        s.decide(float(t), active=16)
    s.observe(10.0, 5000.0, [10.0])  # a burst: n_B grows, a decision of its own
    s.decide(10.0, active=16)
    got = [
        (d["reason"], d["required"], d["time"], d["last_time"], d["repeats"])
        for d in s.snapshot(10.0)["decisions"]
    ]
    assert got[0] == ("sufficient", 16, 0.0, 9.0, 10)
    assert len(got) == 2 and got[1][2:] == (10.0, 10.0, 1) and got[1][1] > 16


def test_policy_without_data_holds_min_backends() -> None:
    s = create_policy(min_backends=2)
    assert s.decide(0.0, active=0) == ScaleDecision(2, "below_min", 2)
    assert s.decide(1.0, active=2) == ScaleDecision(0, "no_data", 2)


def test_policy_reports_an_unreachable_target_and_scales_to_max() -> None:
    s = create_policy(max_backends=8)
    s.observe(0.0, 10.0, [50.0])  # 50 ms service can never answer within 41 ms
    assert s.decide(0.0, active=3) == ScaleDecision(5, "target_unreachable", 8)
    assert s.snapshot(0.0)["estimate"] == {
        "backends": 8,
        "meets_target": False,
        "utilisation": 10.0 * 50.0 / 1000 / 8,
    }


def test_policy_counts_every_frontend_share_of_the_load() -> None:
    one = create_policy()
    four = create_policy()
    one.observe(0.0, 400.0, [10.0])
    four.observe(0.0, 100.0, [10.0], frontends=4)  # lambda = n_F x lambda_i (§4.2)
    assert one.decide(0.0, active=1) == four.decide(0.0, active=1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"burst": 0.9},
        {"setup_s": -1.0},
        {"min_backends": 0},
        {"min_backends": 9, "max_backends": 8},
        {"scale_in_interval_s": -1.0},
        {"retry_delay_ms": -1.0},
    ],
)
def test_bad_policy_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(PolicyValueError):
        create_policy(**kwargs)


# -- IdleTracker --------------------------------------------------------------------------------


def test_an_idle_backend_decommissions_after_idle_s() -> None:
    idle = IdleTracker(60.0, since=0.0)
    assert not idle.should_decommission(59.9)
    assert idle.should_decommission(60.0)
    idle.task(30.0)
    assert not idle.should_decommission(89.9)
    assert idle.should_decommission(90.0)
    assert not idle.should_decommission(90.0, in_flight=1)  # a running task is not idleness
    idle.task(20.0)  # an older report does not turn the clock back
    assert idle.should_decommission(90.0)


def test_the_idle_clock_starts_at_the_first_question_without_since() -> None:
    idle = IdleTracker(10.0)
    assert not idle.should_decommission(100.0)
    assert not idle.should_decommission(109.9)
    assert idle.should_decommission(110.0)
    with pytest.raises(PolicyValueError):
        IdleTracker(0.0)


# -- backend order ------------------------------------------------------------------------------


def test_backend_order_is_natural_and_independent_of_input_order() -> None:
    ids = ["ts-10", "ts-2", "ts-1", "edge-3", "b1", "b01", "10x", "9x"]
    expected = ["9x", "10x", "b01", "b1", "edge-3", "ts-1", "ts-2", "ts-10"]
    assert backend_order(ids) == expected
    for perm in itertools.islice(itertools.permutations(ids), 200):
        assert backend_order(perm) == expected
    assert backend_order([]) == []


def test_backend_order_refuses_repeated_ids() -> None:
    with pytest.raises(PolicyValueError, match="'ts-1'"):
        backend_order(["ts-1", "ts-2", "ts-1"])


def test_task_targets_give_each_group_its_own_slo_at_its_fanouts_percentile() -> None:
    from admission.swayam import task_targets

    got = task_targets([(99.0, 100.0, 1), (99.0, 100.0, 10), (95.0, 1000.0, 4)])
    # P(query <= T) = P(task <= T)^k: a p99 query of fanout 10 needs each task at
    # 100 * 0.99^(1/10) = 99.8995; the widest fanout of a (p, SLO) pair is the binding one.
    assert got == [
        (pytest.approx(100 * 0.95**0.25), 1000.0),
        (pytest.approx(100 * 0.99**0.1), 100.0),
    ]
    with pytest.raises(PolicyValueError, match="fanout"):
        task_targets([(99.0, 100.0, 0)])


def test_groups_replace_the_tightest_slo_applied_to_every_task() -> None:
    service = [10.0] * 100  # a constant 10 ms service
    policy = SwayamPolicy(setup_s=0.0, burst=1.0, percentile=99.0, target_ms=12.0,
                          max_backends=500)  # fmt: skip
    for t in range(5):
        policy.observe(float(t), 2000.0, service)
    tight = policy.decide(5.0, 1).replicas
    # Only a loose class (p95, 200 ms) is arriving: its tasks need far fewer backends than
    # the tightest class's 12 ms at p99.
    policy.set_groups([(95.0, 200.0, 1)])
    loose = SwayamPolicy(setup_s=0.0, burst=1.0, percentile=99.0, target_ms=12.0,
                         max_backends=500)  # fmt: skip
    loose.set_groups([(95.0, 200.0, 1)])
    for t in range(5):
        loose.observe(float(t), 2000.0, service)
    assert loose.decide(5.0, 1).replicas < tight
    # A wide fanout of the same class needs more than a single task.
    wide = SwayamPolicy(setup_s=0.0, burst=1.0, percentile=99.0, target_ms=12.0,
                        max_backends=500)  # fmt: skip
    wide.set_groups([(95.0, 200.0, 1), (95.0, 30.0, 50)])
    for t in range(5):
        wide.observe(float(t), 2000.0, service)
    assert wide.decide(5.0, 1).replicas > loose.decide(5.0, 1).replicas
    assert wide.snapshot(5.0)["task_targets"][0]["target_ms"] == 30.0
