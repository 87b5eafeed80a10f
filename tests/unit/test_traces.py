"""Arrival traces: the CV of the per-second rate, the mean rate, determinism, replay."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from loadtests.sim.traces import (
    TRACE_NAMES,
    Trace,
    bursty,
    make_trace,
    per_second_counts,
    per_second_cv,
    periodic,
    replay,
    spiky,
)


def test_per_second_cv_by_hand() -> None:
    arrivals = np.array([0.5, 1.1, 1.2, 1.3])  # counts 1 and 3: mean 2, std 1
    assert list(per_second_counts(arrivals, 2.0)) == [1, 3]
    assert per_second_cv(arrivals, 2.0) == pytest.approx(0.5)
    assert per_second_cv(arrivals, 2.5) == pytest.approx(0.5)  # the partial second is left out


@pytest.mark.parametrize("name", TRACE_NAMES)
@pytest.mark.parametrize(("duration_s", "rate_rps"), [(60.0, 300.0), (10.0, 400.0)])
def test_traces_hit_their_mean_rate(name: str, duration_s: float, rate_rps: float) -> None:
    for seed in range(4):
        trace = make_trace(name, duration_s, rate_rps, seed=seed)
        assert len(trace) / duration_s == pytest.approx(rate_rps, rel=0.05)
        assert np.all(np.diff(trace.arrivals_s) >= 0)
        assert trace.arrivals_s[0] >= 0 and trace.arrivals_s[-1] < duration_s
        assert trace.rate_curve.mean() == pytest.approx(rate_rps, rel=1e-6)


@pytest.mark.parametrize("maker", [periodic, bursty, spiky])
def test_traces_are_deterministic(maker: Callable[..., Trace]) -> None:
    a, b = maker(20.0, 200.0, seed=7), maker(20.0, 200.0, seed=7)
    assert np.array_equal(a.arrivals_s, b.arrivals_s)
    assert not np.array_equal(a.arrivals_s, maker(20.0, 200.0, seed=8).arrivals_s)


def test_periodic_trace_follows_its_period() -> None:
    trace = periodic(60.0, 500.0, period_s=20.0, seed=1)
    counts = per_second_counts(trace.arrivals_s, 60.0)
    # Peaks a quarter into each period, troughs three quarters in.
    assert counts[3:7].mean() > 1.3 * 500 > 0.7 * 500 > counts[13:17].mean()


def test_bad_shape_parameters_or_a_short_trace_are_refused() -> None:
    with pytest.raises(ValueError, match="peak_to_trough"):
        periodic(30.0, 300.0, peak_to_trough=0.5)
    with pytest.raises(ValueError, match="duration_s"):
        bursty(2.0, 300.0)
    with pytest.raises(ValueError, match="rate_rps"):
        spiky(30.0, 0.0)
    with pytest.raises(ValueError, match="unknown 'oracle'"):
        make_trace("oracle", 30.0, 100.0)


def write_stamps(path: Path, stamps: list[float]) -> Path:
    path.write_text(
        "# arrival timestamps\n" + "\n".join(f"{t},extra" for t in stamps) + "\n", "utf-8"
    )
    return path


def test_replay_as_recorded(tmp_path: Path) -> None:
    path = write_stamps(tmp_path / "t.csv", [100.5, 100.0, 101.25, 103.0])
    trace = replay(path)
    assert list(trace.arrivals_s) == [0.0, 0.5, 1.25, 3.0]
    assert trace.name == "replay:t"
    cut = replay(path, duration_s=2.0)
    assert list(cut.arrivals_s) == [0.0, 0.5, 1.25]


def test_replay_rescaled_to_a_rate_keeps_the_shape(tmp_path: Path) -> None:
    source = spiky(40.0, 50.0, seed=3)
    path = write_stamps(tmp_path / "azure.txt", source.arrivals_s.tolist())
    trace = replay(path, rate_rps=500.0, duration_s=40.0, seed=1)
    assert len(trace) / 40.0 == pytest.approx(500.0, rel=0.05)
    assert trace.cv() == pytest.approx(source.cv(), abs=0.1)
    again = replay(path, rate_rps=500.0, duration_s=40.0, seed=1)
    assert np.array_equal(trace.arrivals_s, again.arrivals_s)


def test_replay_reports_a_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("0.1\nnoon\n", "utf-8")
    with pytest.raises(ValueError, match=r"bad\.txt:2: not a timestamp: 'noon'"):
        replay(path)
