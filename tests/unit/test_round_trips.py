"""The dispatch delay a link subtracts from task budgets, from heartbeat round trips."""

from __future__ import annotations

from gateway.links import RoundTrips


def test_the_dispatch_delay_is_half_the_least_recent_round_trip() -> None:
    rt = RoundTrips(samples=4)
    assert (rt.one_way_ms, rt.smoothed_ms) == (0.0, None)
    for ms in (0.8, 0.6, 1.0):
        rt.observe(ms)
    assert rt.one_way_ms == 0.3
    assert rt.smoothed_ms is not None and 0.6 < rt.smoothed_ms < 1.0


def test_a_reply_held_up_by_a_stalled_server_does_not_eat_the_budgets() -> None:
    # A SIGSTOPped server answered a heartbeat 2.5 s late after SIGCONT: the smoothed
    # round trip shows the stall (0.2 x 2.5 s), the dispatch delay stays the wire's. Before,
    # half the smoothed value (~250 ms) came off budgets of ~90 ms: every task a miss.
    rt = RoundTrips()
    for _ in range(5):
        rt.observe(0.5)
    rt.observe(2500.0)
    assert rt.smoothed_ms is not None and rt.smoothed_ms > 400
    assert rt.one_way_ms == 0.25


def test_old_samples_age_out() -> None:
    rt = RoundTrips(samples=3)
    rt.observe(0.2)
    for _ in range(3):
        rt.observe(5.0)  # the path really got slower
    assert rt.one_way_ms == 2.5
