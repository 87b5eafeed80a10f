"""The shapes of PARD's three traces (diurnal, bursty, spiky), per seed, and overload periods."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadtests.sim.pard_report import goodput_over
from loadtests.sim.traces import (
    MIN_DURATION_S,
    TRACE_ALIASES,
    TRACE_NAMES,
    Period,
    Trace,
    bursty,
    make_trace,
    overload_periods,
    periodic,
    spiky,
)

SEEDS = range(5)


# ---- diurnal (Wikipedia-like) ---------------------------------------------------------------


@pytest.mark.parametrize("ratio", [2.0, 3.0, 5.0])
def test_periodic_has_its_period_and_peak_to_trough_ratio(ratio: float) -> None:
    duration, period = 600.0, 100.0
    a = (ratio - 1) / (ratio + 1)
    window = np.arange(-5, 6)  # 11 s around each peak (25 + 100 j) and trough (75 + 100 j)
    sines = np.sin(2 * math.pi * (25 + window + 0.5) / period)
    expected = (1 + a * sines).mean() / (1 - a * sines).mean()
    for seed in SEEDS:
        trace = periodic(duration, 400.0, period_s=period, peak_to_trough=ratio, seed=seed)
        counts = trace.counts().astype(float)
        spectrum = np.abs(np.fft.rfft(counts - counts.mean()))
        assert duration / int(np.argmax(spectrum)) == period  # the dominant period
        peaks = np.concatenate([counts[25 + 100 * j + window] for j in range(6)])
        troughs = np.concatenate([counts[75 + 100 * j + window] for j in range(6)])
        assert peaks.mean() / troughs.mean() == pytest.approx(expected, rel=0.1)
        assert trace.events == ()


def test_periodic_noise_free_curve_is_the_sinusoid() -> None:
    trace = periodic(60.0, 100.0, period_s=20.0, peak_to_trough=3.0, noise=0.0)
    t = np.arange(60) + 0.5
    assert np.allclose(trace.rate_curve, 100.0 * (1 + 0.5 * np.sin(2 * math.pi * t / 20.0)))


# ---- bursty (Twitter-like) ------------------------------------------------------------------


@pytest.mark.parametrize("bursts", [1, 3, 5])
def test_bursty_has_its_bursts_within_the_parameters(bursts: int) -> None:
    duration, height, length = 200.0, (1.5, 2.5), (8.0, 20.0)
    for seed in SEEDS:
        trace = bursty(duration, 300.0, bursts=bursts, height=height, burst_s=length, seed=seed)
        assert len(trace.events) == bursts
        for i, e in enumerate(trace.events):
            assert height[0] <= e.height <= height[1]
            assert length[0] - 0.5 <= e.duration_s <= length[1] + 0.5  # whole seconds
            slot = duration / bursts  # one burst per slot, clear of the next
            assert i * slot - 1 < e.start_s and e.end_s < (i + 1) * slot + 1
        starts = [e.start_s for e in trace.events]
        ends = [e.end_s for e in trace.events]
        assert all(end < start for end, start in zip(ends, starts[1:], strict=False))


def test_bursty_bursts_reach_their_heights_in_the_arrivals() -> None:
    for seed in SEEDS:
        trace = bursty(200.0, 300.0, noise=0.0, seed=seed)  # level flat: only the bursts move
        counts = trace.counts().astype(float)
        inside = np.zeros(len(counts), dtype=bool)
        for e in trace.events:
            inside[int(e.start_s) : int(e.end_s)] = True
        level = counts[~inside].mean()
        for e in trace.events:
            plateau = counts[int(e.start_s) : int(e.start_s) + int(e.duration_s * 2 // 3)]
            assert plateau.mean() / level == pytest.approx(e.height, rel=0.12)


def test_bursty_default_heights_centre_on_twice_the_level() -> None:
    heights = [e.height for seed in range(20) for e in bursty(120.0, 200.0, seed=seed).events]
    assert len(heights) == 60 and 1.5 <= min(heights) and max(heights) <= 2.5
    assert np.mean(heights) == pytest.approx(2.0, abs=0.15)


# ---- spiky (Azure-Functions-like) ------------------------------------------------------------


def test_spiky_has_short_high_spikes() -> None:
    for seed in SEEDS:
        trace = spiky(120.0, 200.0, seed=seed)
        assert 1 <= len(trace.events) <= 20  # at most one per 6 s slot
        for e in trace.events:
            assert 1.0 <= e.duration_s <= 3.0 and 4.0 <= e.height <= 8.0
        ends = [e.end_s for e in trace.events]
        starts = [e.start_s for e in trace.events]
        assert all(end < start for end, start in zip(ends, starts[1:], strict=False))
        counts = trace.counts().astype(float)
        spike = np.zeros(len(counts), dtype=bool)
        for e in trace.events:
            spike[int(e.start_s) : int(e.end_s)] = True
        assert spike.mean() <= 0.5  # short: a minority of the seconds
        assert counts[spike].min() > 2.5 * np.median(counts)  # high
    # Versus the diurnal trace, whose busiest second is never far above the median.
    smooth = periodic(120.0, 200.0, seed=0).counts()
    assert smooth.max() < 2.0 * np.median(smooth)


def test_spike_heights_show_in_the_arrivals() -> None:
    trace = spiky(300.0, 200.0, noise=0.0, height=(6.0, 6.0), seed=2)
    counts = trace.counts().astype(float)
    spike = np.zeros(len(counts), dtype=bool)
    for e in trace.events:
        spike[int(e.start_s) : int(e.end_s)] = True
    assert counts[spike].mean() / counts[~spike].mean() == pytest.approx(6.0, rel=0.1)


def test_spiky_refuses_spikes_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="spike_s"):
        spiky(10.0, 100.0, spike_s=(6, 8))  # 6 s spikes need 12 s
    with pytest.raises(ValueError, match="height"):
        spiky(60.0, 100.0, height=(0.5, 2.0))
    with pytest.raises(ValueError, match="bursts"):
        bursty(60.0, 100.0, bursts=-1)


# ---- determinism, names -----------------------------------------------------------------------


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_a_trace_is_a_pure_function_of_seed_and_parameters(name: str) -> None:
    for seed in SEEDS:
        a, b = make_trace(name, 60.0, 150.0, seed=seed), make_trace(name, 60.0, 150.0, seed=seed)
        assert np.array_equal(a.arrivals_s, b.arrivals_s)
        assert np.array_equal(a.rate_curve, b.rate_curve) and a.events == b.events
        other = make_trace(name, 60.0, 150.0, seed=seed + 100)
        assert not np.array_equal(a.arrivals_s, other.arrivals_s)


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_every_trace_draws_down_to_the_shortest_duration(name: str) -> None:
    for duration in (MIN_DURATION_S, 5.5, 7.3):
        for seed in SEEDS:
            trace = make_trace(name, duration, 40.0, seed=seed)
            widths = np.minimum(1.0, duration - np.arange(len(trace.rate_curve)))
            assert (trace.rate_curve * widths).sum() / duration == pytest.approx(40.0)
            assert all(0 <= e.start_s < e.end_s <= duration for e in trace.events)


def test_shape_parameters_change_the_trace_and_aliases_name_the_papers_traces() -> None:
    assert bursty(60.0, 100.0, height=(3.0, 3.0)).events != bursty(60.0, 100.0).events
    assert TRACE_NAMES == ("periodic", "bursty", "spiky")
    for alias, name in TRACE_ALIASES.items():
        a, b = make_trace(alias, 30.0, 100.0, seed=3), make_trace(name, 30.0, 100.0, seed=3)
        assert a.name == name and np.array_equal(a.arrivals_s, b.arrivals_s)


# ---- overload periods and goodput over them ---------------------------------------------------


def test_overload_periods_by_hand() -> None:
    offered = [1, 5, 5, 1, 5, 4, 1, 6]
    # Above 4 (not at it): seconds 1-2, 4 and 7.
    assert overload_periods(offered, 4.0) == (Period(1, 3), Period(4, 5), Period(7, 8))
    # A capacity per second (scaling moved it): 1 > 0, 5 < 6, 5 > 4, 1 < 4.
    assert overload_periods([1, 5, 5, 1], [0, 6, 4, 4]) == (Period(0, 1), Period(2, 3))
    assert overload_periods([1, 2], 3.0) == ()
    assert overload_periods([], 3.0) == ()
    assert Period(1, 3).duration_s == 2
    with pytest.raises(ValueError, match="capacity_rps"):
        overload_periods([1, 2], -1.0)


def test_overload_periods_of_a_trace_follow_its_rate_curve() -> None:
    curve = np.array([10.0, 30.0, 30.0, 10.0, 30.0, 30.0])
    trace = Trace("hand", np.array([0.5]), 5.5, 20.0, curve)  # the last second is half a second
    assert overload_periods(trace, 20.0) == (Period(1, 3), Period(4, 5.5))
    diurnal = periodic(90.0, 100.0, period_s=30.0, peak_to_trough=3.0, noise=0.0)
    # 100 (1 + 0.5 sin(2 pi (t + 0.5) / 30)) > 130 where sin > 0.6: seconds 3 to 11 of each
    # period (sin is 0.59 at t = 2.5 and 0.63 at 3.5; 0.63 at 11.5 and 0.59 at 12.5).
    periods = overload_periods(diurnal, 130.0)
    assert [(p.start_s, p.end_s) for p in periods] == [(3, 12), (33, 42), (63, 72)]


def test_goodput_over_the_overload_periods_by_hand() -> None:
    # (end of second, offered, on-time completions in that second)
    timeline = [(1.0, 5, 4), (2.0, 9, 6), (3.0, 9, 8), (4.0, 5, 5), (5.0, 9, 1)]
    assert goodput_over(timeline, (Period(1, 3),)) == 7.0  # seconds [1, 2) and [2, 3)
    assert goodput_over(timeline, (Period(1, 3), Period(4, 5))) == 5.0  # (6 + 8 + 1) / 3
    assert math.isnan(goodput_over(timeline, ()))
