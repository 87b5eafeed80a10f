"""QLM's waiting-time estimator (admission.waiting) against closed forms on a fake clock."""

from __future__ import annotations

import heapq
import math
import random

import numpy as np
import pytest

from admission import PolicyValueError
from admission.groups import ArrivalRates, RequestGroups, cost_bucket
from admission.waiting import (
    NO_WAIT,
    ServiceMoments,
    WaitEstimate,
    estimate_wait,
    meet_probability,
    overtake_window,
    query_on_time,
    with_overtaking,
)
from taskserver.queues import QueuedTask, create_task_queue


def run_queue(
    *,
    rate_per_ms: float,
    service: random.Random,
    draw: str,
    mean_ms: float,
    slots: int,
    arrivals: int,
    seed: int = 7,
) -> list[tuple[WaitEstimate, float, int, int]]:
    """A FIFO queue with `slots` servers under Poisson arrivals, on a virtual clock: for every
    arrival, (the estimate from the state it finds, its actual wait, busy slots, queued)."""
    rng = random.Random(seed)
    moments = (
        ServiceMoments.exponential(mean_ms)
        if draw == "exp"
        else ServiceMoments.deterministic(mean_ms)
    )
    queue = create_task_queue("fifo")
    free = [0.0] * slots  # when each slot frees (a heap)
    waits: dict[int, float] = {}
    seen: list[tuple[WaitEstimate, int, int, int]] = []
    now = 0.0

    def serve_until(t: float) -> None:
        while len(queue) and free[0] <= t:
            start = free[0]
            task = queue.pop(start).task  # type: ignore[union-attr]
            waits[task.task_index] = start - task.arrival_s
            s = service.expovariate(1 / mean_ms) if draw == "exp" else mean_ms
            heapq.heapreplace(free, start + s)

    for i in range(arrivals):
        now += rng.expovariate(rate_per_ms)
        serve_until(now)
        busy = sum(1 for f in free if f > now)
        task = QueuedTask("q", i, 0.0, 0.0, 0, now)
        ahead = len(queue.ahead_of(task))
        est = estimate_wait([(ahead, moments)], busy, slots, moments)
        seen.append((est, i, busy, ahead))
        if busy < slots and not len(queue):
            waits[i] = 0.0
            s = service.expovariate(1 / mean_ms) if draw == "exp" else mean_ms
            heapq.heapreplace(free, now + s)
        else:
            queue.push(task)
    serve_until(math.inf)
    return [(e, waits[i], busy, ahead) for e, i, busy, ahead in seen]


def test_mm1_mean_matches_the_closed_form_and_each_state_is_exact() -> None:
    mean_ms, rho = 1.0, 0.6
    out = run_queue(
        rate_per_ms=rho / mean_ms, service=random.Random(1), draw="exp", mean_ms=mean_ms,
        slots=1, arrivals=60_000,
    )  # fmt: skip
    closed = rho * mean_ms / (1 - rho)  # M/M/1: E[W] = rho S / (1 - rho)
    est = np.mean([e.mean_ms for e, *_ in out])
    actual = np.mean([w for _, w, *_ in out])
    assert est == pytest.approx(closed, rel=0.06)
    assert actual == pytest.approx(closed, rel=0.06)
    # Given n tasks in the system, the wait is Erlang(n): E = n S, Var = n S^2 (memoryless).
    for n in (1, 2, 3):
        picked = [(e, w) for e, w, busy, ahead in out if busy + ahead == n]
        assert picked[0][0].mean_ms == pytest.approx(n * mean_ms)
        assert picked[0][0].sd_ms == pytest.approx(math.sqrt(n) * mean_ms)
        assert np.mean([w for _, w in picked]) == pytest.approx(n * mean_ms, rel=0.06)


def test_md1_mean_matches_pollaczek_khinchine() -> None:
    d_ms, rho = 2.0, 0.7
    out = run_queue(
        rate_per_ms=rho / d_ms, service=random.Random(2), draw="det", mean_ms=d_ms,
        slots=1, arrivals=60_000,
    )  # fmt: skip
    closed = rho * d_ms / (2 * (1 - rho))  # M/D/1: E[W] = rho D / (2 (1 - rho))
    est = np.mean([e.mean_ms for e, *_ in out])
    actual = np.mean([w for _, w, *_ in out])
    assert est == pytest.approx(closed, rel=0.06)
    assert actual == pytest.approx(closed, rel=0.06)
    # The residual of a deterministic service is uniform on (0, D): mean D/2, sd D/sqrt(12).
    one_busy = next(e for e, _, busy, ahead in out if busy == 1 and ahead == 0)
    assert one_busy.mean_ms == pytest.approx(d_ms / 2)
    assert one_busy.sd_ms == pytest.approx(d_ms / math.sqrt(12))


def test_mmc_given_all_slots_busy_is_erlang() -> None:
    mean_ms, slots = 1.0, 3
    out = run_queue(
        rate_per_ms=2.4 / mean_ms, service=random.Random(3), draw="exp", mean_ms=mean_ms,
        slots=slots, arrivals=60_000,
    )  # fmt: skip
    for queued in (0, 2, 5):
        picked = [(e, w) for e, w, busy, ahead in out if busy == slots and ahead == queued]
        # M/M/c: all c busy and n queued ahead: W ~ Erlang(n + 1) at rate c / S.
        assert picked[0][0].mean_ms == pytest.approx((queued + 1) * mean_ms / slots)
        assert np.mean([w for _, w in picked]) == pytest.approx(
            (queued + 1) * mean_ms / slots, rel=0.08
        )
    # A free slot and nothing queued: the task starts at once.
    assert all(e == NO_WAIT and w == 0.0 for e, w, busy, _ in out if busy < slots)


def test_estimate_basics() -> None:
    m = ServiceMoments.exponential(2.0)
    assert estimate_wait([], 0, 1, m) == NO_WAIT
    assert estimate_wait([(0, m)], 1, 2, m) == NO_WAIT
    # Two slots, one busy, two queued ahead (a transient the gateway can see): no residual.
    e = estimate_wait([(2, m)], 1, 2, m)
    assert (e.mean_ms, e.ahead) == (2.0, 2)
    # Groups with their own laws add up (QLM eq. 2 over request groups).
    d = ServiceMoments.deterministic(1.0)
    e = estimate_wait([(1, m), (3, d)], 1, 1, m)
    assert e.mean_ms == pytest.approx(2.0 + 2.0 + 3.0)
    assert e.sd_ms == pytest.approx(math.sqrt(4.0 + 4.0))
    assert WaitEstimate(1.0, 0.0).within(1.0) == 1.0
    assert WaitEstimate(1.0, 0.0).within(0.5) == 0.0
    assert WaitEstimate(1.0, 1.0).within(1.0) == pytest.approx(0.5)
    assert WaitEstimate(1.0, 1.0).quantile_ms(0.975) == pytest.approx(1.0 + 1.959964, abs=1e-5)
    assert WaitEstimate(1.0, 1.0).quantile_ms(0.01) == 0.0  # never below 0
    assert query_on_time([NO_WAIT, WaitEstimate(1.0, 1.0), WaitEstimate(1.0, 1.0)], 1.0) == (
        pytest.approx(0.25)
    )
    with pytest.raises(PolicyValueError, match="slots"):
        estimate_wait([], 0, 0, m)
    with pytest.raises(PolicyValueError, match="mean_ms"):
        ServiceMoments(0.0, 0.0, 0.0)


def test_moments_from_samples() -> None:
    m = ServiceMoments.from_samples([1.0, 2.0, 3.0])
    assert (m.mean_ms, m.m2, m.m3) == pytest.approx((2.0, 14 / 3, 12.0))
    assert m.var_ms2 == pytest.approx(2 / 3)
    with pytest.raises(PolicyValueError, match="at least one"):
        ServiceMoments.from_samples([])
    with pytest.raises(PolicyValueError, match="finite"):
        ServiceMoments.from_samples([1.0, float("nan")])


def _exp_log_cdf(mean_ms: float):  # type: ignore[no-untyped-def]
    def log_cdf(x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.where(x > 0, np.log(-np.expm1(-np.maximum(x, 0) / mean_ms)), -np.inf)

    return log_cdf


def test_meet_probability_closed_forms() -> None:
    f = _exp_log_cdf(1.0)
    # Idle targets: the product of F(slack), here (1 - e^-3)^4.
    assert meet_probability([(f, [NO_WAIT] * 4)], 3.0) == pytest.approx((1 - math.exp(-3)) ** 4)
    # A wait known exactly (sd 0): F(slack - w).
    assert meet_probability([(f, [WaitEstimate(1.0, 0.0)])], 3.0) == pytest.approx(1 - math.exp(-2))
    # A Normal wait: E[F(s - W)] with W ~ N(1, 0.2^2) = 1 - e^-(s-1) e^(0.02) (the MGF),
    # as long as the Normal's mass below 0 and above s is negligible.
    got = meet_probability([(f, [WaitEstimate(1.0, 0.2)])], 3.0)
    assert got == pytest.approx(1 - math.exp(-2) * math.exp(0.02), rel=1e-4)
    # Groups multiply; no slack left is a certain miss.
    g = _exp_log_cdf(0.5)
    both = meet_probability([(f, [NO_WAIT]), (g, [NO_WAIT])], 2.0)
    assert both == pytest.approx((1 - math.exp(-2)) * (1 - math.exp(-4)))
    assert meet_probability([(f, [NO_WAIT])], 0.0) == 0.0


def test_overtaking_is_the_priority_queue_wait() -> None:
    base = WaitEstimate(1.0, 0.5, 2)
    s = ServiceMoments.exponential(1.0)
    # Always overtaking at rho = 0.25: the M/G/1 priority wait W0 / (1 - rho) and the delay
    # busy period's variance Var0 / (1 - rho)^2 + E[W0] lambda E[S^2] / (1 - rho)^3.
    e = with_overtaking(base, [(0.25, math.inf, s)], 1)
    assert e.mean_ms == pytest.approx(1.0 / 0.75)
    assert e.sd_ms**2 == pytest.approx(0.25 / 0.75**2 + 1.0 * 0.25 * 2.0 / 0.75**3)
    assert e.ahead == 2
    # A window shorter than the wait closes: the group adds rho * window as fixed work.
    e = with_overtaking(base, [(0.25, 0.5, s)], 1)
    assert e.mean_ms == pytest.approx(1.0 + 0.25 * 0.5)
    # Two windows: the wider one stays open past the narrower one's end.
    e = with_overtaking(base, [(0.25, 0.5, s), (0.25, math.inf, s)], 1)
    assert e.mean_ms == pytest.approx((1.0 + 0.125) / 0.75)
    # Two slots share the overtakers' work.
    assert with_overtaking(base, [(0.5, math.inf, s)], 2).mean_ms == pytest.approx(1.0 / 0.75)
    # Nothing overtakes a task that starts at once, or under FIFO; rho >= 1 never ends.
    assert with_overtaking(NO_WAIT, [(0.25, math.inf, s)], 1) == NO_WAIT
    assert with_overtaking(base, [(0.25, 0.0, s)], 1) == base
    assert with_overtaking(base, [(1.0, math.inf, s)], 1).mean_ms == math.inf
    assert with_overtaking(base, [(1.0, math.inf, s)], 1).within(1e9) == 0.0


def test_overtake_window_follows_the_queue_order() -> None:
    tight, loose = (0.4, 1.0, 0), (0.9, 1.5, 1)  # (budget T_b, SLO, priority)
    assert overtake_window("tf-edfq", loose, tight) == pytest.approx(0.5)
    assert overtake_window("tf-edfq", tight, loose) == 0.0
    assert overtake_window("t-edfq", loose, tight) == pytest.approx(0.5)
    assert overtake_window("priq", loose, tight) == math.inf
    assert overtake_window("priq", tight, loose) == 0.0
    assert overtake_window("fifo", loose, tight) == 0.0
    with pytest.raises(PolicyValueError, match="queue policy"):
        overtake_window("lifo", loose, tight)


def test_arrival_rates_estimate_a_poisson_rate_and_forget() -> None:
    rates = ArrivalRates(tau=100.0)
    rng = random.Random(5)
    t = 0.0
    while t < 5000.0:
        t += rng.expovariate(2.0)
        rates.add("a", t)
    assert rates.rate("a", t) == pytest.approx(2.0, rel=0.2)
    assert rates.rate("b", t) == 0.0
    # Silence for one tau leaves 1/e of the rate; a time before the last arrival reads it as
    # of then (no growth backwards).
    assert rates.rate("a", t + 100.0) == pytest.approx(rates.rate("a", t) / math.e)
    assert rates.rate("a", t - 10.0) == rates.rate("a", t)
    assert dict(rates.rates(t)) == {"a": rates.rate("a", t)}
    with pytest.raises(PolicyValueError, match="tau"):
        ArrivalRates(0.0)


def test_request_groups_keep_arrivals_cost_and_outstanding_work() -> None:
    groups = RequestGroups(rate_window=1000.0)
    assert cost_bucket(1.0) == 0 and cost_bucket(3.9) == 1 and cost_bucket(0.3) == -2
    key = groups.key("I", "default", 17.6)  # k_f 100 x 0.176 ms
    assert key == ("I", "default", 4)
    for i in range(4):
        groups.admitted(key, 17.6, 100, now=float(i))
    for _ in range(150):
        groups.task_done(key, 0.2)
    groups.task_done(("II", "default", 4), 0.2)  # an unknown group: ignored
    (row,) = groups.snapshot(3.0, {"default": 50})
    assert row["queries"] == 4 and row["tasks_outstanding"] == 250
    assert row["mean_cost_ms"] == pytest.approx(17.6) and row["cost_bucket"] == [16.0, 32.0]
    # Drain: 250 tasks x 0.2 ms over 50 slots.
    assert row["estimated_drain_ms"] == pytest.approx(1.0)
    assert row["arrival_rate"] > 0
    with pytest.raises(PolicyValueError, match="cost"):
        cost_bucket(0.0)
