"""Task service-time distributions, in milliseconds, for emulated executors and offline priors.

Stdlib only: edge agents import this package on Raspberry Pis, where numpy is not installed.
Invalid parameters raise ValueError quoting the field and the bad value.
"""

from __future__ import annotations

import bisect
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

__all__ = [
    "TAILS",
    "ConstantServiceTime",
    "ExponentialServiceTime",
    "LognormalServiceTime",
    "QuantileFileServiceTime",
    "ServiceSpec",
    "ServiceTimeDistribution",
    "fitted_tail_mean",
    "make_distribution",
    "paper_tail_mean",
]

_STANDARD_NORMAL = NormalDist()


def _number(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{field}: must be a finite number, got {value!r}")
    return float(value)


def _positive(field: str, value: object) -> float:
    number = _number(field, value)
    if number <= 0:
        raise ValueError(f"{field}: must be > 0, got {value!r}")
    return number


def _non_negative(field: str, value: object) -> float:
    number = _number(field, value)
    if number < 0:
        raise ValueError(f"{field}: must be >= 0, got {value!r}")
    return number


class ServiceTimeDistribution(ABC):
    """Service times in milliseconds, scaled by `scale`."""

    scale: float

    @abstractmethod
    def quantile(self, u: float) -> float:
        """Inverse CDF in ms (scaled), for u in [0, 1)."""

    def sample_ms(self, rng: random.Random) -> float:
        """Draw one service time in ms (scaled)."""
        return self.quantile(rng.random())

    def quantiles(self, n: int) -> list[float]:
        """n mid-point quantiles: the offline prior the gateway's CDF book starts from."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n: must be an int >= 1, got {n!r}")
        return [self.quantile((i + 0.5) / n) for i in range(n)]

    @property
    @abstractmethod
    def mean_ms(self) -> float:
        """Mean service time in ms (scaled)."""


def _check_u(u: float) -> None:
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u: must be in [0, 1), got {u!r}")


class ConstantServiceTime(ServiceTimeDistribution):
    """Every task takes value_ms."""

    def __init__(self, value_ms: float, scale: float = 1.0) -> None:
        self.value_ms = _non_negative("value_ms", value_ms)
        self.scale = _positive("scale", scale)

    def quantile(self, u: float) -> float:
        _check_u(u)
        return self.value_ms * self.scale

    def sample_ms(self, rng: random.Random) -> float:
        return self.value_ms * self.scale

    @property
    def mean_ms(self) -> float:
        return self.value_ms * self.scale

    def __repr__(self) -> str:
        return f"ConstantServiceTime(value_ms={self.value_ms}, scale={self.scale})"


class ExponentialServiceTime(ServiceTimeDistribution):
    """Exponential service times with the given mean."""

    def __init__(self, mean_ms: float, scale: float = 1.0) -> None:
        self._mean_ms = _positive("mean_ms", mean_ms)
        self.scale = _positive("scale", scale)

    def quantile(self, u: float) -> float:
        _check_u(u)
        return -self._mean_ms * math.log1p(-u) * self.scale

    @property
    def mean_ms(self) -> float:
        return self._mean_ms * self.scale

    def __repr__(self) -> str:
        return f"ExponentialServiceTime(mean_ms={self._mean_ms}, scale={self.scale})"


class LognormalServiceTime(ServiceTimeDistribution):
    """Lognormal service times: ln(X) ~ N(ln(median_ms), sigma^2)."""

    def __init__(self, median_ms: float, sigma: float, scale: float = 1.0) -> None:
        self.median_ms = _positive("median_ms", median_ms)
        self.sigma = _non_negative("sigma", sigma)
        self.scale = _positive("scale", scale)
        self._mu = math.log(self.median_ms)

    def quantile(self, u: float) -> float:
        _check_u(u)
        if u == 0.0:
            return 0.0  # the infimum of the support
        return math.exp(self._mu + self.sigma * _STANDARD_NORMAL.inv_cdf(u)) * self.scale

    def sample_ms(self, rng: random.Random) -> float:
        return rng.lognormvariate(self._mu, self.sigma) * self.scale

    @property
    def mean_ms(self) -> float:
        return self.median_ms * math.exp(self.sigma**2 / 2) * self.scale

    def __repr__(self) -> str:
        return (
            f"LognormalServiceTime(median_ms={self.median_ms}, sigma={self.sigma}, "
            f"scale={self.scale})"
        )


TAILS = ("paper", "fitted")
"""How a quantile table's tail beyond its last quantile is modelled (ServiceSpec.tail)."""


def paper_tail_mean(quantiles_ms: Sequence[float]) -> float:
    """The TailGuard authors' tail: exponential beyond the last quantile, mean q_{n-1} / 2.

    Their simulator (and with it the paper's Table II, x_99^u(1000) = 1.041 / 6.019 /
    7.149 ms for Masstree / Shore / Xapian, and the shipped *_unloaded_p99_by_fanout
    tables) draws the top 1/n of the mass as q_{n-1} + Exp(mean q_{n-1} / 2).
    """
    return quantiles_ms[-1] / 2.0 if quantiles_ms else 0.0


def fitted_tail_mean(quantiles_ms: Sequence[float]) -> float:
    """An exponential tail fitted to the top 1% of the table (the "fitted" option).

    Rule: take the top m = max(2, n // 100) quantiles q_{n-m} .. q_{n-1} at probabilities
    (n-m+k)/n. If the distribution above q_{n-m} is q_{n-m} + Exp(theta), their expected
    excesses are theta * -ln(1 - k/m); theta is the ratio of the summed observed excesses
    to the summed -ln(1 - k/m). For the Tailbench files this gives 0.018 ms (masstree),
    0.35 ms (shore), 0.19 ms (xapian).

    Judge a tail by the quantiles a fanout needs, not by the mean: the tail holds only 1/n
    of the mass, so it moves the mean by < 0.1% either way, but a fanout-k query's p-th
    percentile sits at its tasks' (p/100)^(1/k) level, beyond the table for k >= 100 at
    p99. There the fitted tail is about 14 times lighter than the paper's for Masstree
    (whose last four quantiles jump from 0.28 to 0.48 ms, which a fit over the top 1%
    misses): x_99^u(1000) is 0.52 ms with it against 1.03 ms with the paper's.
    """
    n = len(quantiles_ms)
    if n < 2:
        return 0.0  # a single quantile says nothing about the tail: treat it as a point mass
    m = max(2, n // 100)
    base = quantiles_ms[n - m]
    excess = math.fsum(q - base for q in quantiles_ms[n - m :])
    expected = math.fsum(-math.log1p(-k / m) for k in range(m))
    return excess / expected


class QuantileFileServiceTime(ServiceTimeDistribution):
    """Empirical service times from n quantiles at probabilities i/n (i = 0..n-1), ascending.

    Between neighbouring quantiles the inverse CDF is linear; beyond the last one, which
    holds 1/n of the mass, it is an exponential tail of mean `tail_mean_ms`: by default the
    paper's (``tail="paper"``: q_{n-1} / 2, see paper_tail_mean), or one fitted to the top
    of the table (``tail="fitted"``, see fitted_tail_mean).
    """

    def __init__(
        self,
        quantiles_ms: Sequence[float],
        scale: float = 1.0,
        source: str = "",
        tail: str = "paper",
    ) -> None:
        values = [float(q) for q in quantiles_ms]
        where = source or "quantiles_ms"
        if not values:
            raise ValueError(f"{where}: no quantiles")
        for i, q in enumerate(values):
            if not math.isfinite(q) or q < 0:
                raise ValueError(f"{where}[{i}]: must be a finite number >= 0, got {q!r}")
            if i and q < values[i - 1]:
                raise ValueError(
                    f"{where}[{i}]: {q!r} is below the previous quantile "
                    f"{values[i - 1]!r}; quantiles must ascend"
                )
        if tail not in TAILS:
            raise ValueError(f"tail: must be one of {', '.join(TAILS)}, got {tail!r}")
        self._q = values
        self.scale = _positive("scale", scale)
        self.source = source
        self.tail = tail
        # unscaled
        self.tail_mean_ms = paper_tail_mean(values) if tail == "paper" else fitted_tail_mean(values)
        n = len(values)
        # Exact mean of the piecewise-linear body plus the exponential tail's 1/n of the mass.
        body = math.fsum(values[i] + values[i + 1] for i in range(n - 1)) / 2
        self._mean_unscaled = (body + values[-1] + self.tail_mean_ms) / n

    @classmethod
    def from_file(
        cls, path: str | Path, scale: float = 1.0, tail: str = "paper"
    ) -> QuantileFileServiceTime:
        """Load one quantile in ms per line, ascending; blank lines are ignored."""
        path = Path(path)
        values: list[float] = []
        with path.open(encoding="utf-8") as lines:
            for line_no, line in enumerate(lines, start=1):
                text = line.strip()
                if not text:
                    continue
                try:
                    q = float(text)
                except ValueError:
                    raise ValueError(f"{path}:{line_no}: not a number: {text!r}") from None
                if not math.isfinite(q) or q < 0:
                    raise ValueError(
                        f"{path}:{line_no}: must be a finite number >= 0, got {text!r}"
                    )
                if values and q < values[-1]:
                    raise ValueError(
                        f"{path}:{line_no}: {text} is below the previous quantile "
                        f"{values[-1]!r}; quantiles must ascend"
                    )
                values.append(q)
        if not values:
            raise ValueError(f"{path}: no quantiles (the file is empty)")
        return cls(values, scale=scale, source=str(path), tail=tail)

    def quantile(self, u: float) -> float:
        _check_u(u)
        q = self._q
        n = len(q)
        x = u * n
        i = int(x)
        if i >= n - 1:
            # Exponential tail: P(X > q_{n-1} + t) = (1/n) exp(-t / theta), so for u >= (n-1)/n
            # the excess is -theta * ln(n (1 - u)). max() guards rounding in u * n.
            excess = -self.tail_mean_ms * math.log(max(n * (1.0 - u), 1e-300))
            return (q[-1] + max(excess, 0.0)) * self.scale
        return (q[i] + (x - i) * (q[i + 1] - q[i])) * self.scale

    def cdf(self, x_ms: float) -> float:
        """P(X <= x_ms) for a scaled time in ms: the inverse of quantile()."""
        q = self._q
        n = len(q)
        x = x_ms / self.scale
        if x < q[0]:
            return 0.0
        if x >= q[-1]:
            if self.tail_mean_ms <= 0:
                return 1.0
            return 1.0 - math.exp(-(x - q[-1]) / self.tail_mean_ms) / n
        i = bisect.bisect_right(q, x) - 1
        width = q[i + 1] - q[i]
        return (i + ((x - q[i]) / width if width > 0 else 1.0)) / n

    @property
    def mean_ms(self) -> float:
        return self._mean_unscaled * self.scale

    @property
    def table_ms(self) -> list[float]:
        """The quantiles, scaled (a copy): the body of the model a CDF prior can carry."""
        return [q * self.scale for q in self._q]

    @property
    def scaled_tail_mean_ms(self) -> float:
        """Mean of the exponential tail beyond the last quantile, scaled."""
        return self.tail_mean_ms * self.scale

    def __len__(self) -> int:
        return len(self._q)

    def __repr__(self) -> str:
        return (
            f"QuantileFileServiceTime(n={len(self._q)}, source={self.source!r}, "
            f"scale={self.scale}, tail={self.tail!r})"
        )


_KINDS = ("constant", "exponential", "lognormal", "quantiles")


@dataclass(frozen=True)
class ServiceSpec:
    """Configured service-time distribution of an emulated task server."""

    kind: str  # one of "constant", "exponential", "lognormal", "quantiles"
    mean_ms: float | None = None  # exponential: the mean; lognormal: alternative to median_ms
    median_ms: float | None = None  # lognormal: the median, exp(mu)
    sigma: float | None = None  # lognormal: the standard deviation of ln(X)
    value_ms: float | None = None  # constant: every task's service time
    path: str | None = None  # quantiles: file of ascending quantiles in ms, one per line
    scale: float = 1.0  # multiplies every service time (emulates a faster or slower server)
    tail: str = "paper"  # quantiles: the tail beyond the last quantile, "paper" or "fitted"


def _required(spec: ServiceSpec, field: str) -> object:
    value = getattr(spec, field)
    if value is None:
        raise ValueError(f"service.{field}: required for kind {spec.kind!r}")
    return value


def make_distribution(spec: ServiceSpec) -> ServiceTimeDistribution:
    """Build the distribution a ServiceSpec describes; ValueError names the bad field."""
    scale = _positive("service.scale", spec.scale)
    if spec.kind == "constant":
        value_ms = _non_negative("service.value_ms", _required(spec, "value_ms"))
        return ConstantServiceTime(value_ms, scale=scale)
    if spec.kind == "exponential":
        mean_ms = _positive("service.mean_ms", _required(spec, "mean_ms"))
        return ExponentialServiceTime(mean_ms, scale=scale)
    if spec.kind == "lognormal":
        sigma = _non_negative("service.sigma", _required(spec, "sigma"))
        if spec.median_ms is not None:
            median_ms = _positive("service.median_ms", spec.median_ms)
        elif spec.mean_ms is not None:
            # mean = median * exp(sigma^2 / 2)
            median_ms = _positive("service.mean_ms", spec.mean_ms) * math.exp(-(sigma**2) / 2)
        else:
            raise ValueError(
                "service.median_ms: required for kind 'lognormal' (or give service.mean_ms)"
            )
        return LognormalServiceTime(median_ms, sigma, scale=scale)
    if spec.kind == "quantiles":
        path = _required(spec, "path")
        if not isinstance(path, str | Path) or not str(path):
            raise ValueError(f"service.path: must be a file path, got {path!r}")
        if spec.tail not in TAILS:
            raise ValueError(f"service.tail: must be one of {', '.join(TAILS)}, got {spec.tail!r}")
        try:
            return QuantileFileServiceTime.from_file(path, scale=scale, tail=spec.tail)
        except OSError as exc:
            raise ValueError(
                f"service.path: cannot read {str(path)!r}: {exc.strerror or exc}"
            ) from exc
    valid = ", ".join(repr(k) for k in _KINDS)
    raise ValueError(f"service.kind: unknown {spec.kind!r}, expected one of {valid}")
