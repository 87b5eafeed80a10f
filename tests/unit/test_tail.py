"""Peaks-over-threshold tail model: GPD arithmetic and the PWM fit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gateway.tail import XI_MAX, XI_MIN, GpdTail, fit_pot


def gpd_samples(xi: float, sigma: float, n: int, seed: int = 0) -> np.ndarray:
    """n sorted draws from a GPD(xi, sigma) with threshold 0."""
    u = np.random.default_rng(seed).random(n)
    return np.sort(sigma * np.expm1(-xi * np.log1p(-u)) / xi)


def test_exponential_sample_fits_zero_shape_and_its_extreme_quantiles() -> None:
    mean_ms = 2.0
    samples = np.sort(np.random.default_rng(3).exponential(mean_ms, 200_000))
    tail = fit_pot(samples)
    assert tail is not None
    assert abs(tail.xi) < 0.05
    # Extrapolation from the top 5% (10,000 excesses) to 1e-5: measured +0.2%, +0.6%, +1.0%.
    for survival in (1e-3, 1e-4, 1e-5):
        exact = -mean_ms * math.log(survival)
        assert tail.quantile(1.0 - survival) == pytest.approx(exact, rel=0.03)


def test_gpd_sample_recovers_shape_and_far_quantile() -> None:
    xi, sigma = 0.3, 1.5
    # A 1e-5 quantile from 5e4 excesses: over seeds 0-7 xi was 0.291-0.302 and the quantile
    # -4.1% .. +1.0% off (with 2e5 samples the spread reaches 10%).
    samples = gpd_samples(xi, sigma, 1_000_000, seed=1)
    tail = fit_pot(samples)
    assert tail is not None
    assert tail.xi == pytest.approx(xi, abs=0.1)
    exact = sigma * math.expm1(-xi * math.log(1e-5)) / xi
    assert tail.quantile(1.0 - 1e-5) == pytest.approx(exact, rel=0.10)


def test_too_few_exceedances_or_equal_samples_give_no_tail() -> None:
    assert fit_pot(np.sort(np.random.default_rng(0).exponential(1.0, 500))) is None  # 25 < 30
    assert fit_pot(np.full(10_000, 3.0)) is None
    assert fit_pot(np.arange(100.0), tail_fraction=0.5, min_exceedances=30) is not None


def test_shape_is_clamped_to_the_documented_range() -> None:
    uniform = np.sort(np.random.default_rng(1).random(20_000))  # bounded: PWM says xi = -1
    tail = fit_pot(uniform)
    assert tail is not None and tail.xi == XI_MIN
    cauchy_like = gpd_samples(1.5, 1.0, 20_000, seed=2)  # infinite mean
    tail = fit_pot(cauchy_like)
    assert tail is not None and tail.xi == XI_MAX
    assert math.isfinite(tail.mean_excess_ms())


def test_ties_at_the_threshold_are_not_excesses() -> None:
    samples = np.sort(np.concatenate([np.full(9_600, 1.0), np.linspace(1.1, 5.0, 400)]))
    tail = fit_pot(samples)
    assert tail is not None
    assert tail.threshold_ms == 1.0
    assert tail.exceed_prob == pytest.approx(400 / 10_000)


def test_zero_shape_is_the_exact_exponential_and_tiny_shapes_agree() -> None:
    tail = GpdTail(threshold_ms=1.0, exceed_prob=0.1, xi=0.0, sigma_ms=2.0)
    assert tail.survival(1.0 + 2.0 * math.log(10.0)) == pytest.approx(0.01, rel=1e-14)
    assert tail.quantile(0.99) == pytest.approx(1.0 + 2.0 * math.log(10.0), rel=1e-14)
    near = GpdTail(threshold_ms=1.0, exceed_prob=0.1, xi=1e-12, sigma_ms=2.0)
    assert near.quantile(1 - 1e-9) == pytest.approx(tail.quantile(1 - 1e-9), rel=1e-9)


@pytest.mark.parametrize("xi", [0.3, 0.0, -0.2])
def test_quantile_inverts_survival(xi: float) -> None:
    tail = GpdTail(threshold_ms=5.0, exceed_prob=0.05, xi=xi, sigma_ms=1.2)
    for q in (0.95, 0.99, 0.999999):
        assert 1.0 - tail.survival(tail.quantile(q)) == pytest.approx(q, rel=1e-12)
    xs = np.linspace(5.0, 20.0, 50)
    s = tail.survival(xs)
    assert isinstance(s, np.ndarray) and np.all(np.diff(s) <= 0)


def test_bounded_tail_ends_without_warnings() -> None:
    tail = GpdTail(threshold_ms=1.0, exceed_prob=0.1, xi=-0.5, sigma_ms=1.0)
    assert tail.upper_end_ms == 3.0
    assert tail.quantile(1.0) == 3.0
    assert tail.survival(np.array([2.9, 3.0, 10.0])).tolist()[1:] == [0.0, 0.0]


def test_restarting_higher_keeps_the_law_beyond() -> None:
    tail = GpdTail(threshold_ms=2.0, exceed_prob=0.05, xi=0.25, sigma_ms=0.8)
    higher = tail.restarted_at(4.0, float(tail.survival(4.0)))
    xs = np.array([4.0, 6.0, 20.0, 300.0])
    np.testing.assert_allclose(higher.survival(xs), tail.survival(xs), rtol=1e-12)


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"got 1\.5"):
        fit_pot(np.arange(10.0), tail_fraction=1.5)
    with pytest.raises(ValueError, match=r"got -1\.0"):
        GpdTail(threshold_ms=0.0, exceed_prob=0.1, xi=0.0, sigma_ms=-1.0)
    with pytest.raises(ValueError, match=r"got 0\.5"):
        GpdTail(threshold_ms=0.0, exceed_prob=0.1, xi=0.0, sigma_ms=1.0).quantile(0.5)
