"""Peaks-over-threshold tail model: a generalized Pareto law above a high threshold.

Large fanouts need extreme per-task quantiles (k_f = 1000 at p99 needs
F(x) = 0.99999, TailGuard eq. (1)-(2)); a window of a few thousand samples
cannot resolve them, so the CDF book extrapolates beyond its empirical body
with the GPD that extreme-value theory prescribes for excesses over a high
threshold (Pickands-Balkema-de Haan).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

XI_MIN = 0.0
"""Lowest shape accepted. A negative shape is a bounded tail: it promises a hard maximum
latency that no server guarantees (finite windows of exponential-like laws fit xi < 0 half
the time, and Tailbench's Xapian fits xi = -0.32 with an end point below its own largest
sample). Understating extremes understates x_p^u and so overstates the budget of TailGuard
eq. (4), which costs SLO misses; an exponential tail is the conservative floor."""
XI_MAX = 0.9
"""Highest shape accepted: at xi >= 1 the mean is infinite and PWM (which needs a finite
mean) breaks down; 0.9 still allows very heavy latency tails."""


@dataclass(frozen=True, slots=True)
class GpdTail:
    """Generalized Pareto tail above a threshold (peaks over threshold)."""

    threshold_ms: float
    """Threshold u where the tail model takes over."""
    exceed_prob: float
    """P(X > u)."""
    xi: float
    """Shape: 0 is an exponential tail, > 0 a power-law tail, < 0 a bounded one."""
    sigma_ms: float
    """Scale of the excesses X - u."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold_ms) and self.threshold_ms >= 0):
            raise ValueError(f"threshold_ms: must be finite and >= 0, got {self.threshold_ms}")
        if not (0.0 < self.exceed_prob <= 1.0):
            raise ValueError(f"exceed_prob: must be in (0, 1], got {self.exceed_prob}")
        if not math.isfinite(self.xi):
            raise ValueError(f"xi: must be finite, got {self.xi}")
        if not (math.isfinite(self.sigma_ms) and self.sigma_ms > 0):
            raise ValueError(f"sigma_ms: must be finite and > 0, got {self.sigma_ms}")

    @property
    def upper_end_ms(self) -> float:
        """Right end of the support: finite only for a bounded tail (xi < 0)."""
        if self.xi < 0:
            return self.threshold_ms + self.sigma_ms / -self.xi
        return math.inf

    def log_survival(self, x_ms: np.ndarray | float) -> np.ndarray | float:
        """log P(X > x) for x >= u (x below u counts as u); -inf past a bounded tail's end."""
        x = np.asarray(x_ms, dtype=np.float64)
        z = np.maximum(x - self.threshold_ms, 0.0) / self.sigma_ms
        log_p = math.log(self.exceed_prob)
        if self.xi == 0.0:
            out = log_p - z
        else:
            arg = self.xi * z
            with np.errstate(divide="ignore", invalid="ignore"):
                # log1p(xi z)/xi tends to z as xi -> 0, so tiny shapes stay exact.
                out = np.where(arg > -1.0, log_p - np.log1p(arg) / self.xi, -np.inf)
        return out if np.ndim(x_ms) else float(out)

    def survival(self, x_ms: np.ndarray | float) -> np.ndarray | float:
        """P(X > x) for x >= u (x below u counts as u)."""
        out = np.exp(self.log_survival(x_ms))
        return out if np.ndim(x_ms) else float(out)

    def quantile(self, q: float) -> float:
        """Inverse CDF for q >= 1 - exceed_prob; q = 1 gives the end of the support."""
        if not (0.0 <= q <= 1.0):
            raise ValueError(f"q: must be in [0, 1], got {q}")
        return self.isf(1.0 - q)

    def isf(self, survival: float) -> float:
        """Inverse survival: x with P(X > x) = survival, for survival <= exceed_prob."""
        # Tolerate rounding at the threshold: 1 - (1 - p) need not equal p exactly.
        if not (0.0 <= survival <= self.exceed_prob * (1.0 + 1e-9)):
            raise ValueError(
                f"survival: must be in [0, {self.exceed_prob}] (the tail), got {survival}"
            )
        ratio = min(survival / self.exceed_prob, 1.0)
        if ratio == 0.0:
            return self.upper_end_ms
        t = -math.log(ratio)
        if self.xi == 0.0:
            excess = t
        else:
            # expm1(xi t)/xi tends to t as xi -> 0: exact for tiny shapes too.
            excess = math.expm1(self.xi * t) / self.xi
        return self.threshold_ms + self.sigma_ms * excess

    def restarted_at(self, threshold_ms: float, exceed_prob: float) -> GpdTail:
        """The same law conditioned on X > threshold_ms, pinned to P(X > threshold_ms)."""
        # Threshold stability: a GPD's excesses over a higher threshold v are GPD with the same
        # shape and scale sigma + xi (v - u); exceed_prob re-pins the level to the data.
        if not (self.threshold_ms <= threshold_ms < self.upper_end_ms):
            raise ValueError(
                f"threshold_ms: must be in [{self.threshold_ms}, {self.upper_end_ms}), "
                f"got {threshold_ms}"
            )
        sigma = self.sigma_ms + self.xi * (threshold_ms - self.threshold_ms)
        return GpdTail(threshold_ms, exceed_prob, self.xi, sigma)

    def mean_excess_ms(self) -> float:
        """E[X - u | X > u] (finite because xi is clamped below 1)."""
        return self.sigma_ms / (1.0 - self.xi)


def fit_pot(
    sorted_samples_ms: np.ndarray, tail_fraction: float = 0.05, min_exceedances: int = 30
) -> GpdTail | None:
    """Fit a GPD to the excesses over the empirical (1 - tail_fraction) quantile, or None."""
    if not (0.0 < tail_fraction < 1.0):
        raise ValueError(f"tail_fraction: must be in (0, 1), got {tail_fraction}")
    if min_exceedances < 2:
        raise ValueError(f"min_exceedances: must be >= 2, got {min_exceedances}")
    x = np.asarray(sorted_samples_ms, dtype=np.float64)
    n = x.size
    n_tail = int(n * tail_fraction)
    if n_tail < min_exceedances:
        return None
    threshold = float(x[n - n_tail - 1])
    # Ties at the threshold (coarse timers, quantile tables) are not excesses: P(X > u) counts
    # only strictly larger values, so the body's CDF at u and the tail join without a gap.
    start = int(np.searchsorted(x, threshold, side="right"))
    excess = x[start:] - threshold
    m = excess.size
    if m < min_exceedances or excess[-1] <= excess[0]:
        return None
    # Probability-weighted moments (Hosking & Wallis 1987): a0 = E[Y], a1 = E[Y (1 - F(Y))],
    # with their plotting positions (i - 0.35) / m; robust for the shapes latency tails show.
    a0 = float(excess.mean())
    weights = 1.0 - (np.arange(1, m + 1, dtype=np.float64) - 0.35) / m
    a1 = float(np.dot(weights, excess)) / m
    denom = a0 - 2.0 * a1
    xi = 2.0 - a0 / denom if denom > 0 else XI_MAX
    xi = min(max(xi, XI_MIN), XI_MAX)
    # a1 = sigma / (2 (2 - xi)) for a GPD; using it after clamping keeps sigma consistent with
    # the clamped shape (and equals H&W's 2 a0 a1 / (a0 - 2 a1) when nothing was clamped).
    sigma = 2.0 * a1 * (2.0 - xi)
    if not (sigma > 0 and math.isfinite(sigma)):
        return None
    return GpdTail(threshold_ms=threshold, exceed_prob=m / n, xi=xi, sigma_ms=sigma)
