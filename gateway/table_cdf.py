"""A CDF known as a model: a quantile table with an exponential tail (TailGuard's Tailbench law).

The TailGuard paper's service times are n measured quantiles at probabilities i/n, linear
between them, and beyond the last one, which holds 1/n of the mass, an exponential tail
(``taskserver.service_time``: mean q_{n-1} / 2 by default). A fanout-k query needs its
tasks' (p/100)^(1/k) quantile, beyond the table for k >= 100 at p99, so a CDF book primed
with samples of this law (even 10,000 of them) misses x_p^u there by several percent.
``TableCdf`` is the law itself, exactly: a book row primed with it solves x_p^u as the
model does (``CdfBook.add_server(id, TableCdf)``), and ``ConditionalTail`` carries its
shape beyond the largest sample of a window that still holds the prior.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from gateway.tail import GpdTail
from taskserver.service_time import QuantileFileServiceTime, ServiceTimeDistribution

__all__ = ["ConditionalTail", "TableCdf", "prior_of"]


@dataclass(frozen=True, slots=True, eq=False)
class TableCdf:
    """n quantiles at probabilities i/n, linear between them, and an exponential last 1/n."""

    n: int
    """Quantiles in the table."""
    min_ms: float
    """The first quantile: F is 0 below it."""
    max_ms: float
    """The last quantile, where the tail starts (F there is (n-1)/n)."""
    tail: GpdTail | None
    """The exponential tail beyond max_ms (xi = 0), or None for a point mass there."""
    _q: np.ndarray = field(repr=False)
    _above: np.ndarray = field(repr=False)
    """_above[i]: the integral of the survival from q_i to infinity."""

    @classmethod
    def from_table(
        cls, quantiles_ms: ArrayLike, tail_mean_ms: float, shift_ms: float = 0.0
    ) -> TableCdf:
        """The law of `quantiles_ms` (ascending, at i/n) with an exponential tail, shifted."""
        q = np.asarray(quantiles_ms, dtype=np.float64).ravel() + shift_ms
        n = q.size
        if n == 0:
            raise ValueError("quantiles_ms: need at least one quantile, got none")
        if not np.all(np.isfinite(q)) or q[0] < 0 or np.any(np.diff(q) < 0):
            raise ValueError("quantiles_ms: must be finite, >= 0 and ascending")
        if not (math.isfinite(tail_mean_ms) and tail_mean_ms >= 0):
            raise ValueError(f"tail_mean_ms: must be finite and >= 0, got {tail_mean_ms}")
        top = float(q[-1])
        tail = GpdTail(top, 1.0 / n, 0.0, tail_mean_ms) if tail_mean_ms > 0 else None
        # Survival integral: a trapezoid per table segment (S falls by 1/n across it, linear),
        # and theta / n for the tail.
        seg = np.diff(q) * (n - np.arange(n - 1) - 0.5) / n
        above = np.empty(n)
        above[-1] = tail_mean_ms / n
        above[:-1] = above[-1] + np.cumsum(seg[::-1])[::-1]
        q.setflags(write=False)
        above.setflags(write=False)
        return cls(n, float(q[0]), top, tail, q, above)

    @property
    def threshold_ms(self) -> float:
        """Where the tail model takes over (the last quantile); +inf without a tail."""
        return self.max_ms if self.tail is not None else math.inf

    def log_survival(self, x_ms: ArrayLike) -> np.ndarray:
        """log P(X > x): exact in the table (linear F, jumps at ties) and in the tail."""
        x = np.asarray(x_ms, dtype=np.float64)
        xs = np.atleast_1d(x)
        q, n = self._q, self.n
        # The last index with q_i <= x: a run of equal quantiles is a jump of F at its value.
        i = np.searchsorted(q, xs, side="right") - 1
        out = np.zeros(xs.shape)
        body = (i >= 0) & (i < n - 1)
        ib = i[body]
        frac = (xs[body] - q[ib]) / (q[ib + 1] - q[ib])
        with np.errstate(divide="ignore"):
            out[body] = np.log((n - ib - frac) / n)
        top = i >= n - 1
        if self.tail is not None:
            out[top] = self.tail.log_survival(xs[top])
        else:
            out[top] = -np.inf
        return out.reshape(x.shape)

    def cdf(self, x_ms: ArrayLike) -> np.ndarray:
        """F(x)."""
        return -np.expm1(self.log_survival(x_ms))

    def log_cdf(self, x_ms: ArrayLike) -> np.ndarray:
        """log F(x): -inf below the first quantile, accurate near 1."""
        log_s = self.log_survival(x_ms)
        with np.errstate(divide="ignore"):
            return np.where(
                log_s < -math.log(2.0), np.log1p(-np.exp(log_s)), np.log(-np.expm1(log_s))
            )

    def isf(self, survival: float) -> float:
        """The x with P(X > x) = survival (the model's inverse, without forming 1 - s)."""
        if not (0.0 <= survival <= 1.0):
            raise ValueError(f"survival: must be in [0, 1], got {survival!r}")
        n = self.n
        if survival <= 1.0 / n:
            if self.tail is None:
                return self.max_ms
            return self.tail.isf(survival)
        u_n = n * (1.0 - survival)  # u * n, in [0, n - 1)
        i = min(int(u_n), n - 2)
        q = self._q
        return float(q[i] + (u_n - i) * (q[i + 1] - q[i]))

    def quantile(self, q: float) -> float:
        """Smallest x with F(x) >= q; q = 1 gives the end of the support."""
        if not (0.0 <= q <= 1.0):
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        if q == 1.0:
            return math.inf if self.tail is not None else self.max_ms
        return self.isf(1.0 - q)

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """`quantile` of each level (as LatencyCdf.quantiles)."""
        return [self.quantile(q) for q in qs]

    def mean_ms(self) -> float:
        """The law's mean (what an exact sampler of the table averages)."""
        return float(self._q[0] + self._above[0])

    def mean_excess_ms(self, x_ms: float) -> float:
        """E[X - x | X > x]."""
        q, n = self._q, self.n
        log_s = float(self.log_survival(x_ms))
        if log_s == -math.inf:
            return 0.0
        i = int(np.searchsorted(q, x_ms, side="right")) - 1
        if i < 0:
            return float(self._above[0] + (q[0] - x_ms))
        if i >= n - 1:
            return self.tail.mean_excess_ms() if self.tail is not None else 0.0
        s_x = math.exp(log_s)
        s_next = (n - i - 1) / n
        partial = (q[i + 1] - x_ms) * (s_x + s_next) / 2.0
        return float((partial + self._above[i + 1]) / s_x)


@dataclass(frozen=True, slots=True)
class ConditionalTail:
    """A model's law beyond threshold_ms, pinned to P(X > threshold_ms) = exceed_prob.

    The tail of a CDF book window that still holds a model prior: the window's samples
    make the body, and beyond its largest sample the prior's shape carries on, conditioned
    on exceeding it (beyond TailGuard: the paper's book is fed only by measurements).
    """

    model: TableCdf
    threshold_ms: float
    exceed_prob: float

    @property
    def upper_end_ms(self) -> float:
        """Right end of the support."""
        return self.model.quantile(1.0)

    def log_survival(self, x_ms: np.ndarray | float) -> np.ndarray | float:
        """log P(X > x) for x >= threshold_ms."""
        x = np.maximum(np.asarray(x_ms, dtype=np.float64), self.threshold_ms)
        base = float(self.model.log_survival(self.threshold_ms))
        out = math.log(self.exceed_prob) + self.model.log_survival(x) - base
        return out if np.ndim(x_ms) else float(out)

    def isf(self, survival: float) -> float:
        """x with P(X > x) = survival, for survival <= exceed_prob."""
        base = math.exp(float(self.model.log_survival(self.threshold_ms)))
        return self.model.isf(min(survival / self.exceed_prob, 1.0) * base)

    def mean_excess_ms(self) -> float:
        """E[X - threshold | X > threshold]."""
        return self.model.mean_excess_ms(self.threshold_ms)

    def restarted_at(self, threshold_ms: float, exceed_prob: float) -> ConditionalTail:
        """The same shape beyond a new threshold, pinned to a new level."""
        return ConditionalTail(self.model, threshold_ms, exceed_prob)


def prior_of(
    dist: ServiceTimeDistribution, *, shift_ms: float = 0.0, points: int = 4096
) -> TableCdf | np.ndarray:
    """What a CDF book row starts from for this service law, shifted by shift_ms.

    A quantile table is its own exact model (TableCdf); any other law is represented by
    `points` mid-point quantiles, whose tail the book models from the samples.
    """
    if isinstance(dist, QuantileFileServiceTime):
        return TableCdf.from_table(dist.table_ms, dist.scaled_tail_mean_ms, shift_ms)
    return np.asarray(dist.quantiles(points), dtype=np.float64) + shift_ms
