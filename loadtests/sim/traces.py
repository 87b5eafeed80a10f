"""Request arrival traces for the pipeline simulator: periodic, bursty, spiky and replayed.

PARD §5.1 replays three real traces as request rates: Wikipedia (periodic), Twitter (bursty)
and Azure Functions (spiky). The generators here stand in for them, characterised the way such
traces are: by the coefficient of variation of the per-second request rate,

    CV = std(n) / mean(n),   n_s = arrivals in second s = [s, s + 1),

over the whole seconds of the trace (population standard deviation). Targets: periodic 0.5,
bursty 1.0, spiky 1.3.

Each generator draws a rate curve lambda_s, constant within each second, then Poisson arrivals
in each second. Given the curve, n_s is Poisson(lambda_s), so over the seconds
E[var n] = var(lambda) + mean(lambda): the curve is calibrated (bisection on one shape
parameter, on the drawn curve itself) to CV_lambda^2 = CV^2 - 1 / mean(lambda), so that the
expected CV of the counts, Poisson noise included, is the target. Shapes:

- ``periodic``: lambda(t) = r (1 + a sin(2 pi t / P)), amplitude a calibrated (a <= 1).
- ``bursty``: r * level(t) * exp(sigma z_t): z a smooth AR(1) process (correlated over about
  a twelfth of the trace: rho = exp(-12 / duration_s) per second), level 1
  except one sustained burst where it doubles (the "input rate only doubles" of PARD §3.2);
  sigma calibrated.
- ``spiky``: r * (baseline + h * spikes): a mildly varying baseline and short spikes (1-2 s,
  Pareto heights, about one every 8 s, at least one and at most one per 8 s); the spike scale
  h calibrated.

Every trace is then scaled to the target mean rate. Generators are seeded and deterministic:
the same arguments give the same arrivals.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "MIN_DURATION_S",
    "TRACE_CVS",
    "TRACE_NAMES",
    "Trace",
    "bursty",
    "make_trace",
    "per_second_counts",
    "per_second_cv",
    "periodic",
    "replay",
    "spiky",
]

TRACE_CVS: dict[str, float] = {"periodic": 0.5, "bursty": 1.0, "spiky": 1.3}
"""Target CV of the per-second request rate of each synthetic trace."""
TRACE_NAMES: tuple[str, ...] = tuple(TRACE_CVS)
MIN_DURATION_S = 5.0
"""A per-second CV needs a few seconds to mean anything."""


@dataclass(frozen=True, eq=False)
class Trace:
    """Arrival times of one trace (seconds from 0, sorted) and the rate curve behind them."""

    name: str
    arrivals_s: np.ndarray
    duration_s: float
    rate_rps: float
    """The target mean rate (requests per second)."""
    rate_curve: np.ndarray
    """Expected requests per second in each second (the last may be a partial second)."""

    def __len__(self) -> int:
        return len(self.arrivals_s)

    def counts(self) -> np.ndarray:
        """Arrivals in each whole second."""
        return per_second_counts(self.arrivals_s, self.duration_s)

    def cv(self) -> float:
        """Measured CV of the per-second request rate."""
        return per_second_cv(self.arrivals_s, self.duration_s)


def per_second_counts(arrivals_s: np.ndarray, duration_s: float) -> np.ndarray:
    """Arrivals in each whole second [s, s + 1) of [0, duration_s)."""
    seconds = math.floor(duration_s + 1e-9)
    return np.bincount(
        np.floor(np.asarray(arrivals_s)).astype(np.int64).clip(0, None), minlength=seconds
    )[:seconds]


def per_second_cv(arrivals_s: np.ndarray, duration_s: float) -> float:
    """The CV of the per-second request rate: std / mean of the counts of whole seconds."""
    counts = per_second_counts(arrivals_s, duration_s).astype(float)
    mean = counts.mean() if len(counts) else 0.0
    return float(counts.std() / mean) if mean > 0 else 0.0


def _cv(curve: np.ndarray) -> float:
    mean = curve.mean()
    return float(curve.std() / mean) if mean > 0 else 0.0


def _check(duration_s: float, rate_rps: float, cv: float) -> None:
    if not (math.isfinite(duration_s) and duration_s >= MIN_DURATION_S):
        raise ValueError(f"trace duration_s: must be >= {MIN_DURATION_S:g}, got {duration_s!r}")
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"trace rate_rps: must be > 0, got {rate_rps!r}")
    if not (math.isfinite(cv) and cv >= 0):
        raise ValueError(f"trace cv: must be >= 0, got {cv!r}")


def _curve_cv_target(cv: float, rate_rps: float) -> float:
    """CV the rate curve needs so that the Poisson counts have `cv` in expectation."""
    return math.sqrt(max(0.0, cv * cv - 1.0 / rate_rps))


def _calibrate(
    shape: Callable[[float], np.ndarray], target: float, lo: float, hi: float, what: str
) -> np.ndarray:
    """shape(x) whose CV is `target`, by bisection on x in [lo, hi] (CV(lo) <= target)."""
    if target <= _cv(shape(lo)):
        return shape(lo)
    if _cv(shape(hi)) < target:
        raise ValueError(
            f"{what}: cannot reach a per-second rate CV of {target:.3f} "
            f"(at most {_cv(shape(hi)):.3f}); use a longer duration or a lower cv"
        )
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if _cv(shape(mid)) < target:
            lo = mid
        else:
            hi = mid
    return shape(hi)


def _arrivals(
    name: str, curve: np.ndarray, duration_s: float, rate_rps: float, rng: np.random.Generator
) -> Trace:
    """Scale the curve to the mean rate and draw Poisson arrivals within each second."""
    seconds = len(curve)
    widths = np.minimum(1.0, duration_s - np.arange(seconds))
    curve = curve * (rate_rps * widths.sum() / float((curve * widths).sum()))
    counts = rng.poisson(curve * widths)
    starts = np.repeat(np.arange(seconds, dtype=float), counts)
    arrivals = np.sort(starts + rng.random(len(starts)) * np.repeat(widths, counts))
    return Trace(name, arrivals, float(duration_s), float(rate_rps), curve)


def _seconds(duration_s: float) -> int:
    return math.ceil(duration_s - 1e-9)


def periodic(
    duration_s: float,
    rate_rps: float,
    *,
    cv: float = TRACE_CVS["periodic"],
    period_s: float | None = None,
    seed: int = 0,
) -> Trace:
    """Sinusoidally modulated Poisson arrivals (Wikipedia-like); period default: duration / 3."""
    _check(duration_s, rate_rps, cv)
    period = duration_s / 3.0 if period_s is None else period_s
    if not (math.isfinite(period) and period > 0):
        raise ValueError(f"trace period_s: must be > 0, got {period_s!r}")
    rng = np.random.default_rng([seed, 1])
    phase = 2.0 * math.pi * (np.arange(_seconds(duration_s)) + 0.5) / period
    wave = np.sin(phase)
    target = _curve_cv_target(cv, rate_rps)
    curve = _calibrate(lambda a: 1.0 + a * wave, target, 0.0, 1.0, "periodic trace")
    return _arrivals("periodic", curve, duration_s, rate_rps, rng)


def _ar1(n: int, rho: float, rng: np.random.Generator) -> np.ndarray:
    """A stationary AR(1) series of unit variance."""
    noise = rng.standard_normal(n)
    z = np.empty(n)
    z[0] = noise[0]
    scale = math.sqrt(1.0 - rho * rho)
    for i in range(1, n):
        z[i] = rho * z[i - 1] + scale * noise[i]
    return z


def bursty(
    duration_s: float,
    rate_rps: float,
    *,
    cv: float = TRACE_CVS["bursty"],
    burst: tuple[float, float] = (0.45, 0.65),
    seed: int = 0,
) -> Trace:
    """Smoothly fluctuating arrivals (Twitter-like) whose level doubles within `burst`.

    `burst` is the (start, end) of the doubled level as fractions of the duration.
    """
    _check(duration_s, rate_rps, cv)
    if not 0.0 <= burst[0] < burst[1] <= 1.0:
        raise ValueError(f"trace burst: need 0 <= start < end <= 1, got {burst!r}")
    rng = np.random.default_rng([seed, 2])
    n = _seconds(duration_s)
    z = _ar1(n, math.exp(-12.0 / duration_s), rng)  # correlated over ~1/12 of the trace
    t = (np.arange(n) + 0.5) / duration_s
    level = np.where((t >= burst[0]) & (t < burst[1]), 2.0, 1.0)
    target = _curve_cv_target(cv, rate_rps)
    curve = _calibrate(lambda s: level * np.exp(s * z), target, 0.0, 10.0, "bursty trace")
    return _arrivals("bursty", curve, duration_s, rate_rps, rng)


def spiky(
    duration_s: float,
    rate_rps: float,
    *,
    cv: float = TRACE_CVS["spiky"],
    spike_every_s: float = 8.0,
    seed: int = 0,
) -> Trace:
    """A quiet baseline with short, tall spikes (Azure-Functions-like)."""
    _check(duration_s, rate_rps, cv)
    rng = np.random.default_rng([seed, 3])
    n = _seconds(duration_s)
    baseline = np.exp(0.2 * _ar1(n, 0.8, rng))
    spikes = np.zeros(n)
    # At least one spike, and never so many that spikes cover most seconds (no CV of 1.3 then).
    cap = max(1, int(duration_s // spike_every_s))
    count = min(cap, max(1, int(rng.poisson(duration_s / spike_every_s))))
    longest = 2 if duration_s >= 2 * spike_every_s else 1
    for start in rng.integers(0, n, size=count):
        length = int(rng.integers(1, longest + 1))
        spikes[start : start + length] += 1.0 + rng.pareto(1.5)
    target = _curve_cv_target(cv, rate_rps)
    curve = _calibrate(lambda h: baseline + h * spikes, target, 0.0, 1e4, "spiky trace")
    return _arrivals("spiky", curve, duration_s, rate_rps, rng)


def make_trace(name: str, duration_s: float, rate_rps: float, *, seed: int = 0) -> Trace:
    """The synthetic trace called `name` (periodic, bursty or spiky) at its default CV."""
    makers = {"periodic": periodic, "bursty": bursty, "spiky": spiky}
    if name not in makers:
        valid = ", ".join(repr(n) for n in makers)
        raise ValueError(f"trace name: unknown {name!r}, expected one of {valid}")
    return makers[name](duration_s, rate_rps, seed=seed)


def _read_timestamps(path: Path) -> np.ndarray:
    values = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        field = text.replace(",", " ").split()[0]
        try:
            values.append(float(field))
        except ValueError:
            raise ValueError(f"{path}:{lineno}: not a timestamp: {field!r}") from None
    stamps = np.sort(np.asarray(values, dtype=float))
    if len(stamps) < 2 or not np.isfinite(stamps).all():
        raise ValueError(f"{path}: need at least two finite timestamps, got {len(stamps)}")
    return stamps - stamps[0]


def replay(
    path: str | Path,
    *,
    rate_rps: float | None = None,
    duration_s: float | None = None,
    seed: int = 0,
) -> Trace:
    """A trace from a file of arrival timestamps (seconds; one a line, first field, # comments).

    Timestamps are shifted to start at 0 and cut at `duration_s`. Without `rate_rps` the
    arrivals are replayed as they are. With it, the trace is replayed as a request rate, as
    PARD §5.1 does: its per-second rates are scaled to that mean and Poisson arrivals are drawn
    in each second (seeded), so the shape and CV of the rate are kept.
    """
    path = Path(path)
    stamps = _read_timestamps(path)
    end = float(stamps[-1]) + 1e-9 if duration_s is None else float(duration_s)
    if not (math.isfinite(end) and end > 0):
        raise ValueError(f"trace duration_s: must be > 0, got {duration_s!r}")
    stamps = stamps[stamps < end]
    seconds = _seconds(end)
    counts = np.bincount(np.floor(stamps).astype(np.int64), minlength=seconds)[:seconds]
    widths = np.minimum(1.0, end - np.arange(seconds))
    name = f"replay:{path.stem}"
    if rate_rps is None:
        return Trace(name, stamps, end, len(stamps) / end, counts / widths)
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"trace rate_rps: must be > 0, got {rate_rps!r}")
    if counts.sum() == 0:
        raise ValueError(f"{path}: no arrivals before {end:g} s")
    rng = np.random.default_rng([seed, 4])
    return _arrivals(name, counts / widths, end, rate_rps, rng)
