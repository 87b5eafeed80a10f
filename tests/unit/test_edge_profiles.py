"""Heterogeneity profiles: the fitted distributions hit each cluster's mean, p95 and p99."""

from __future__ import annotations

import random
import statistics

import pytest

from edge_agent.profiles import (
    PROFILE_NAMES,
    PROFILE_TARGETS,
    ServiceProfile,
    fit_profile,
    make_profile,
)


@pytest.mark.parametrize("name", sorted(PROFILE_TARGETS))
def test_fitted_profile_has_the_target_figures_exactly(name: str) -> None:
    mean, p95, p99 = PROFILE_TARGETS[name]
    profile = make_profile(name)
    assert profile is not None and profile.name == name
    assert profile.mean_ms() == pytest.approx(mean, rel=1e-9)
    assert profile.quantile_ms(0.95) == pytest.approx(p95)
    assert profile.quantile_ms(0.99) == pytest.approx(p99)
    assert 0 < profile.quantile_ms(0.0) < profile.quantile_ms(0.5) < p95


@pytest.mark.parametrize("name", sorted(PROFILE_TARGETS))
def test_seeded_draws_match_the_targets(name: str) -> None:
    mean, p95, p99 = PROFILE_TARGETS[name]
    profile = make_profile(name)
    assert profile is not None
    rng = random.Random(11)
    draws = sorted(profile.sample_ms(rng) for _ in range(50_000))
    q = statistics.quantiles(draws, n=100, method="inclusive")
    assert statistics.fmean(draws) == pytest.approx(mean, rel=0.02)
    assert q[94] == pytest.approx(p95, rel=0.03)
    assert q[98] == pytest.approx(p99, rel=0.03)
    a, b = random.Random(3), random.Random(3)
    assert [profile.sample_ms(a) for _ in range(5)] == [profile.sample_ms(b) for _ in range(5)]


def test_none_profile_and_unknown_names() -> None:
    assert make_profile("none") is None
    assert PROFILE_NAMES[0] == "none"
    with pytest.raises(ValueError, match="profile: must be one of none, server-room"):
        make_profile("attic")


def test_service_time_pads_the_query_or_scales_a_slow_one() -> None:
    profile = ServiceProfile("p", ((0.0, 10.0), (1.0, 20.0)), slowdown=3.0)
    assert profile.service_s(15.0, 0.002) == pytest.approx(0.015)
    assert profile.service_s(15.0, 0.010) == pytest.approx(0.030)
    assert profile.quantile_ms(0.5) == 15.0 and profile.mean_ms() == 15.0


@pytest.mark.parametrize(
    ("knots", "slowdown", "match"),
    [
        (((0.0, 1.0), (0.5, 2.0)), 1.0, "from u=0 to u=1"),
        (((0.0, 1.0), (0.5, 2.0), (0.5, 3.0), (1.0, 4.0)), 1.0, "rise strictly"),
        (((0.0, 5.0), (1.0, 4.0)), 1.0, "never fall"),
        (((0.0, 1.0), (1.0, 4.0)), 0.5, "slowdown"),
    ],
)
def test_bad_profiles_are_refused(knots: tuple, slowdown: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ServiceProfile("bad", knots, slowdown)


def test_impossible_targets_are_refused() -> None:
    with pytest.raises(ValueError, match="no five-knot profile"):
        fit_profile("x", 5.0, 200.0, 300.0)  # a mean far below what p95/p99 imply
    with pytest.raises(ValueError, match="p95/p99"):
        fit_profile("x", 50.0, 300.0, 200.0)
