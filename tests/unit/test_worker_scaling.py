"""The worker scaler (PARD §5.1 resource scaling): hand-computed rates, cold starts, holds, caps."""

from __future__ import annotations

import pytest

from taskserver.pard import ScalingConfig, WorkerScaler


def make_scaler(modules: tuple[str, ...] = ("1",), **kw: object) -> WorkerScaler:
    settings: dict[str, object] = {
        "max_workers": 4,
        "cold_start_s": 2.0,
        "hold_s": 10.0,
        "headroom": 1.2,
        "rate_window_s": 2.0,
    }
    settings.update(kw)
    return WorkerScaler(ScalingConfig(**settings), modules)  # type: ignore[arg-type]


def feed(scaler: WorkerScaler, module: str, rate_rps: float, start_s: float, end_s: float) -> None:
    """`rate_rps` arrivals a second over [start_s, end_s), handed in once per 0.5 s."""
    t = start_s
    while t < end_s - 1e-9:
        t += 0.5
        scaler.record_arrivals(module, round(rate_rps * 0.5), t)


# mu = b / d(b): 8 requests in 0.1 s -> 80 req/s per worker
MU = {"1": 80.0, "2": 80.0}


def test_wanted_workers_are_ceil_of_rate_over_throughput_times_headroom():
    scaler = make_scaler()
    assert scaler.wanted(90.0, 80.0) == 2  # 90 / 80 * 1.2 = 1.35
    assert scaler.wanted(200.0, 80.0) == 3  # 3.0 exactly: no fourth for a rounding error
    assert scaler.wanted(250.0, 80.0) == 4  # 3.75
    assert scaler.wanted(1000.0, 80.0) == 4  # clipped to max_workers
    assert scaler.wanted(0.0, 80.0) == 1  # min_workers


def test_the_rate_is_the_arrivals_of_the_trailing_window_over_its_length():
    scaler = make_scaler()
    scaler.record_arrivals("1", 30, 0.5)
    scaler.record_arrivals("1", 50, 1.5)
    scaler.record_arrivals("1", 70, 2.5)
    assert scaler.rate_rps("1", 2.5) == (50 + 70) / 2.0  # 0.5 is outside (0.5, 2.5]
    assert scaler.rate_rps("1", 4.5) == 0.0


def test_a_step_in_rate_starts_workers_that_serve_after_the_cold_start():
    scaler = make_scaler()
    feed(scaler, "1", 90.0, 0.0, 2.0)  # 90 req/s over the last 2 s -> 2 workers
    first = scaler.decide(2.0, MU).of("1")
    assert (first.rate_rps, first.wanted, first.start, first.stop) == (90.0, 2, 1, 0)
    assert (first.ready, first.starting, first.ready_at_s) == (1, 1, 4.0)
    # still 90 req/s: the starting worker counts, so nothing more starts
    feed(scaler, "1", 90.0, 2.0, 3.5)
    again = scaler.decide(3.5, MU).of("1")
    assert (again.start, again.ready, again.starting, again.became_ready) == (0, 1, 1, 0)
    feed(scaler, "1", 90.0, 3.5, 4.0)
    joined = scaler.decide(4.0, MU).of("1")  # its cold start ends at 4.0 exactly
    assert (joined.ready, joined.starting, joined.became_ready) == (2, 0, 1)
    assert scaler.actions("1") == (1, 0)


def test_scale_in_waits_for_the_hold_and_goes_to_the_most_wanted_in_it():
    scaler = make_scaler(hold_s=10.0, cold_start_s=0.0)
    feed(scaler, "1", 250.0, 0.0, 2.0)
    assert scaler.decide(2.0, MU).of("1").start == 3  # 250 / 80 * 1.2 = 3.75 -> 4
    feed(scaler, "1", 250.0, 2.0, 2.5)
    high = scaler.decide(2.5, MU).of("1")
    assert (high.wanted, high.ready, high.became_ready) == (4, 4, 3)
    # the rate falls to 50 req/s at 2.5 s: 1 worker wanted once the window holds only that
    feed(scaler, "1", 50.0, 2.5, 4.5)
    low = scaler.decide(4.5, MU).of("1")
    assert (low.rate_rps, low.wanted, low.stop, low.ready) == (50.0, 1, 0, 4)
    # wanted 4 last at 2.5: that holds 4 workers until 2.5 leaves the 10 s hold
    feed(scaler, "1", 50.0, 4.5, 12.5)
    assert scaler.decide(12.5, MU).of("1").stop == 0  # 2.5 >= 12.5 - 10: still in the hold
    feed(scaler, "1", 50.0, 12.5, 13.0)
    out = scaler.decide(13.0, MU).of("1")
    assert (out.stop, out.stop_starting, out.ready) == (3, 0, 1)
    assert scaler.actions("1") == (3, 3)


def test_a_dip_shorter_than_the_hold_stops_nothing():
    scaler = make_scaler(hold_s=5.0, cold_start_s=0.0)
    feed(scaler, "1", 90.0, 0.0, 2.0)
    scaler.decide(2.0, MU)
    wanted = [scaler.decide(t, MU).of("1") for t in (2.5, 3.0, 3.5, 4.0, 4.5, 5.0)]
    assert [p.wanted for p in wanted] == [2, 1, 1, 1, 1, 1]  # no arrivals for 3 s
    assert [p.stop for p in wanted] == [0] * 6
    feed(scaler, "1", 90.0, 5.0, 7.0)
    assert scaler.decide(7.0, MU).of("1").workers == 2
    assert scaler.actions("1") == (1, 0)


def test_stopping_takes_workers_still_in_their_cold_start_first():
    scaler = make_scaler(hold_s=0.0, cold_start_s=5.0)
    feed(scaler, "1", 250.0, 0.0, 2.0)
    assert scaler.decide(2.0, MU).of("1").start == 3
    part = scaler.decide(4.5, MU).of("1")  # no arrivals since 2.0: 1 wanted, no hold
    assert (part.stop, part.stop_starting, part.ready, part.starting) == (3, 3, 1, 0)


def test_the_pipeline_cap_goes_to_the_most_loaded_module_first():
    scaler = make_scaler(("1", "2"), total_workers=4, cold_start_s=0.0)
    feed(scaler, "1", 200.0, 0.0, 2.0)  # 200 / 80 * 1.2 = 3 wanted
    feed(scaler, "2", 300.0, 0.0, 2.0)  # 4.5 -> 4 wanted (max_workers)
    decision = scaler.decide(2.0, MU)
    one, two = decision.of("1"), decision.of("2")
    assert (one.wanted, two.wanted) == (3, 4)
    # 2 free places: load per worker 200/80 = 2.5 vs 300/80 = 3.75 -> module 2 first (2
    # workers: 1.875); then module 1 (2.5 > 1.875)
    assert (one.start, two.start) == (1, 1)
    assert one.workers + two.workers == 4


def test_a_failed_start_is_forgotten_so_the_next_decision_starts_another():
    scaler = make_scaler()
    feed(scaler, "1", 90.0, 0.0, 2.0)
    assert scaler.decide(2.0, MU).of("1").start == 1
    scaler.abandon("1")
    assert scaler.workers("1") == (1, 0)
    feed(scaler, "1", 90.0, 2.0, 2.5)
    assert scaler.decide(2.5, MU).of("1").start == 1
    assert scaler.actions("1") == (2, 0)


def test_initial_workers_are_clipped_and_must_fit_the_cap():
    config = ScalingConfig(min_workers=2, max_workers=3)
    assert WorkerScaler(config, ["1", "2"], initial={"1": 9}).workers("1") == (3, 0)
    assert WorkerScaler(config, ["1", "2"]).workers("2") == (2, 0)
    with pytest.raises(ValueError, match=r"total_workers: 3 is below the 4"):
        WorkerScaler(ScalingConfig(min_workers=2, max_workers=3, total_workers=3), ["1", "2"])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"min_workers": 0}, r"min_workers: must be an int >= 1, got 0"),
        ({"min_workers": 3, "max_workers": 2}, r"max_workers: must be >= min_workers \(3\)"),
        ({"cold_start_s": -1.0}, r"cold_start_s: must be a finite number >= 0, got -1.0"),
        ({"headroom": 0.9}, r"headroom: must be >= 1, got 0.9"),
        ({"rate_window_s": 0}, r"rate_window_s: must be a finite number > 0, got 0"),
        ({"total_workers": True}, r"total_workers: must be an int >= 1, got True"),
    ],
)
def test_bad_settings_name_the_field_and_quote_the_value(settings, message):
    with pytest.raises(ValueError, match=message):
        ScalingConfig(**settings)


def test_a_throughput_that_is_not_positive_is_refused():
    scaler = make_scaler()
    with pytest.raises(ValueError, match=r"worker_rps: must be a finite number > 0, got 0.0"):
        scaler.decide(1.0, {"1": 0.0})


def test_a_window_not_yet_full_reads_the_rate_over_the_time_since_the_start() -> None:
    scaler = make_scaler()
    scaler.record_arrivals("1", 40, 0.5)  # 80 req/s over the first half second
    assert scaler.rate_rps("1", 0.5) == pytest.approx(80.0)  # not 40 / 2 s = 20
    scaler.record_arrivals("1", 40, 1.0)
    assert scaler.rate_rps("1", 1.0) == pytest.approx(80.0)
    scaler.record_arrivals("1", 80, 2.0)
    assert scaler.rate_rps("1", 2.0) == pytest.approx(80.0)  # the full window from here
    late = WorkerScaler(scaler.config, ["1"], start_s=100.0)
    late.record_arrivals("1", 40, 100.5)
    assert late.rate_rps("1", 100.5) == pytest.approx(80.0)


def test_the_starting_workers_are_held_for_the_hold_after_the_start() -> None:
    config = ScalingConfig(max_workers=4, hold_s=10.0, rate_window_s=2.0)
    scaler = WorkerScaler(config, ["1"], initial={"1": 3})
    for i in range(1, 20):  # a quiet start: one worker would do
        d = scaler.decide(i * 0.5, MU).of("1")
        assert (d.stop, d.ready) == (0, 3), i
    d = scaler.decide(10.5, MU).of("1")
    assert d.stop == 2 and d.ready == 1  # the hold has passed
    # a shell that starts deciding later moves the start: the hold counts from there
    again = WorkerScaler(config, ["1"], initial={"1": 3})
    again.start(50.0)
    assert again.decide(55.0, MU).of("1").stop == 0
    assert again.decide(60.5, MU).of("1").stop == 2
