"""Request arrival traces for the pipeline simulator: periodic, bursty, spiky and replayed.

PARD §5.1 replays three real-world traces as request rates, "the Wikipedia access trace [40],
the Twitter access trace [41], and the Azure Function trace [42]", which "capture typical
periodic and bursty patterns of DNN inference workloads" (Figure 10, left). The generators here
draw traces of those three shapes, compressed in time (a whole trace lasts seconds to minutes of
simulated time, as many requests as an experiment asks for):

- ``periodic`` (Wikipedia-like): a diurnal cycle, lambda(t) = 1 + a sin(2 pi t / period_s) with
  a = (peak_to_trough - 1) / (peak_to_trough + 1), so the peak is `peak_to_trough` times the
  trough; a slow multiplicative noise of `noise` (log-normal, correlated over seconds) on top.
  Defaults: three periods per trace, peak 3x the trough, 5% noise. The paper's wiki trace is
  its periodic one; Figure 6's batch waits are sampled on it (§4.2).
- ``bursty`` (Twitter-like): a smoothly fluctuating level (noise 15%, correlated over a twelfth
  of the trace) with `bursts` bursts (default 3, one in each equal slot of the trace, so they
  never overlap) of `burst_s` seconds (default a twentieth to an eighth of the trace); in a
  burst the rate jumps to `height` times the level (drawn in [1.5, 2.5]) and, over its last
  third, decays back. The paper's lv-tweet workload fails where "the input request rate only
  doubles" (§3.2, Figure 10e): the default heights are centred on 2.
- ``spiky`` (Azure-Functions-like): a quiet baseline (noise 10%) with short, tall spikes: about
  one every `spike_every_s` seconds (Poisson count, at least one), each `spike_s` whole
  seconds wide (default 1-3) at `height` times the baseline (drawn in [4, 8]), in distinct
  slots of the trace and never touching. It stands for the sudden short surges of serverless
  invocations over long quiet stretches: the case scaling cannot follow (PARD §2: "resources
  cannot scale up instantly due to model cold starts").

Every generator is a pure function of its arguments: a numpy Generator seeded with
``[seed, k]`` (k fixed per shape) draws the noise, the bursts or spikes and then Poisson
arrivals in each second of the rate curve, after the curve is scaled to the mean `rate_rps`.
The bursts and spikes drawn are kept on the trace (``Trace.events``), so tests and reports can
check them against the parameters. `replay` reads a timestamp file instead.

Overload periods (PARD §5.1 reports goodput over "periods of the workload that require request
dropping"): `overload_periods` returns the maximal runs of seconds in which the offered rate
exceeds what the pipeline can serve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

__all__ = [
    "MIN_DURATION_S",
    "TRACE_ALIASES",
    "TRACE_NAMES",
    "TRACE_SHAPES",
    "Period",
    "Trace",
    "TraceEvent",
    "bursty",
    "make_trace",
    "overload_periods",
    "per_second_counts",
    "per_second_cv",
    "periodic",
    "replay",
    "spiky",
]

TRACE_SHAPES: dict[str, str] = {
    "periodic": "diurnal cycle, Wikipedia-like",
    "bursty": "bursts of about twice the level, Twitter-like",
    "spiky": "short tall spikes on a quiet baseline, Azure-Functions-like",
}
"""The synthetic traces and the shape of each (PARD §5.1's three real traces)."""
TRACE_NAMES: tuple[str, ...] = tuple(TRACE_SHAPES)
TRACE_ALIASES: dict[str, str] = {"wiki": "periodic", "tweet": "bursty", "azure": "spiky"}
"""The paper's names of its traces (workloads such as lv-tweet), for `make_trace`."""
MIN_DURATION_S = 5.0
"""A trace shorter than this has no shape to speak of."""


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One burst or spike of a trace: seconds [start_s, end_s) at `height` times the level."""

    start_s: float
    end_s: float
    height: float

    @property
    def duration_s(self) -> float:
        """How long it lasts."""
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class Period:
    """A stretch of time [start_s, end_s)."""

    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        """How long it lasts."""
        return self.end_s - self.start_s


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
    events: tuple[TraceEvent, ...] = ()
    """The bursts (bursty) or spikes (spiky) drawn; () for the others."""

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


def _check(duration_s: float, rate_rps: float) -> None:
    if not (math.isfinite(duration_s) and duration_s >= MIN_DURATION_S):
        raise ValueError(f"trace duration_s: must be >= {MIN_DURATION_S:g}, got {duration_s!r}")
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"trace rate_rps: must be > 0, got {rate_rps!r}")


def _check_noise(noise: float) -> None:
    if not (math.isfinite(noise) and noise >= 0):
        raise ValueError(f"trace noise: must be >= 0, got {noise!r}")


def _check_range(name: str, pair: tuple[float, float], low: float) -> tuple[float, float]:
    lo, hi = (float(x) for x in pair)
    if not (math.isfinite(lo) and math.isfinite(hi) and low <= lo <= hi):
        raise ValueError(f"trace {name}: need {low:g} <= low <= high, got {pair!r}")
    return lo, hi


def _arrivals(
    name: str,
    curve: np.ndarray,
    duration_s: float,
    rate_rps: float,
    rng: np.random.Generator,
    events: tuple[TraceEvent, ...] = (),
) -> Trace:
    """Scale the curve to the mean rate and draw Poisson arrivals within each second."""
    seconds = len(curve)
    widths = np.minimum(1.0, duration_s - np.arange(seconds))
    curve = curve * (rate_rps * widths.sum() / float((curve * widths).sum()))
    counts = rng.poisson(curve * widths)
    starts = np.repeat(np.arange(seconds, dtype=float), counts)
    arrivals = np.sort(starts + rng.random(len(starts)) * np.repeat(widths, counts))
    return Trace(name, arrivals, float(duration_s), float(rate_rps), curve, events)


def _seconds(duration_s: float) -> int:
    return math.ceil(duration_s - 1e-9)


def _ar1(n: int, rho: float, rng: np.random.Generator) -> np.ndarray:
    """A stationary AR(1) series of unit variance."""
    noise = rng.standard_normal(n)
    z = np.empty(n)
    z[0] = noise[0]
    scale = math.sqrt(1.0 - rho * rho)
    for i in range(1, n):
        z[i] = rho * z[i - 1] + scale * noise[i]
    return z


def _lognormal(n: int, sigma: float, rho: float, rng: np.random.Generator) -> np.ndarray:
    """Correlated multiplicative noise of mean 1 (log-normal, log-sd `sigma`)."""
    return np.exp(sigma * _ar1(n, rho, rng) - sigma * sigma / 2.0)


def periodic(
    duration_s: float,
    rate_rps: float,
    *,
    period_s: float | None = None,
    peak_to_trough: float = 3.0,
    noise: float = 0.05,
    seed: int = 0,
) -> Trace:
    """A diurnal cycle (Wikipedia-like): peak `peak_to_trough` x the trough, period default
    duration / 3; the first peak a quarter period in."""
    _check(duration_s, rate_rps)
    _check_noise(noise)
    period = duration_s / 3.0 if period_s is None else period_s
    if not (math.isfinite(period) and period > 0):
        raise ValueError(f"trace period_s: must be > 0, got {period_s!r}")
    if not (math.isfinite(peak_to_trough) and peak_to_trough >= 1.0):
        raise ValueError(f"trace peak_to_trough: must be >= 1, got {peak_to_trough!r}")
    rng = np.random.default_rng([seed, 1])
    n = _seconds(duration_s)
    amplitude = (peak_to_trough - 1.0) / (peak_to_trough + 1.0)
    wave = 1.0 + amplitude * np.sin(2.0 * math.pi * (np.arange(n) + 0.5) / period)
    curve = wave * _lognormal(n, noise, 0.9, rng)
    return _arrivals("periodic", curve, duration_s, rate_rps, rng)


def _burst_shape(length: int, height: float) -> np.ndarray:
    """`height` over the first two thirds of a burst, then a linear decay towards 1."""
    shape = np.full(length, height)
    decay = length // 3
    if decay:
        shape[length - decay :] = height - (height - 1.0) * np.arange(1, decay + 1) / (decay + 1)
    return shape


def bursty(
    duration_s: float,
    rate_rps: float,
    *,
    bursts: int = 3,
    height: tuple[float, float] = (1.5, 2.5),
    burst_s: tuple[float, float] | None = None,
    noise: float = 0.15,
    seed: int = 0,
) -> Trace:
    """A fluctuating level (Twitter-like) with `bursts` bursts of `height` x the level.

    Each burst lies in its own slot (the trace cut into `bursts` equal slots), lasts a whole
    number of seconds in `burst_s` (default duration / 20 to duration / 8, at least 1 s, at most
    the slot) and starts at a random second of its slot, clear of the slot's last second.
    """
    _check(duration_s, rate_rps)
    _check_noise(noise)
    n = _seconds(duration_s)
    if isinstance(bursts, bool) or not isinstance(bursts, int) or not 0 <= bursts <= n:
        raise ValueError(f"trace bursts: must be an int in [0, {n}], got {bursts!r}")
    h_lo, h_hi = _check_range("height", height, 1.0)
    if burst_s is None:
        burst_s = (max(1.0, duration_s / 20.0), max(1.0, duration_s / 8.0))
    b_lo, b_hi = _check_range("burst_s", burst_s, 1.0)
    rng = np.random.default_rng([seed, 2])
    level = _lognormal(n, noise, math.exp(-12.0 / duration_s), rng)  # correlated ~ n / 12 s
    shape = np.ones(n)
    events = []
    edges = np.linspace(0, n, bursts + 1).round().astype(int)
    for lo, hi in pairwise(edges):
        slot = int(hi - lo)
        length = min(slot, max(1, round(rng.uniform(b_lo, b_hi))))
        free = slot - length - (1 if slot > length else 0)  # a quiet second before the next
        start = int(lo + rng.integers(0, free + 1))
        h = float(rng.uniform(h_lo, h_hi))
        shape[start : start + length] = _burst_shape(length, h)
        events.append(TraceEvent(float(start), float(min(start + length, duration_s)), h))
    return _arrivals("bursty", level * shape, duration_s, rate_rps, rng, tuple(events))


def spiky(
    duration_s: float,
    rate_rps: float,
    *,
    spike_every_s: float = 10.0,
    height: tuple[float, float] = (4.0, 8.0),
    spike_s: tuple[int, int] = (1, 3),
    noise: float = 0.1,
    seed: int = 0,
) -> Trace:
    """A quiet baseline (Azure-Functions-like) with short spikes of `height` x the baseline.

    About duration / `spike_every_s` spikes (Poisson, at least one, at most one per slot of
    twice the widest spike), each `spike_s` whole seconds wide (at most half a short trace),
    in distinct slots and clear of its slot's last second, so no two spikes touch.
    """
    _check(duration_s, rate_rps)
    _check_noise(noise)
    if not (math.isfinite(spike_every_s) and spike_every_s > 0):
        raise ValueError(f"trace spike_every_s: must be > 0, got {spike_every_s!r}")
    h_lo, h_hi = _check_range("height", height, 1.0)
    w_lo, w_hi = _check_range("spike_s", spike_s, 1.0)
    if w_lo != int(w_lo) or w_hi != int(w_hi):
        raise ValueError(f"trace spike_s: need whole seconds, got {spike_s!r}")
    n = _seconds(duration_s)
    widest = min(int(w_hi), n // 2)  # a short trace cuts the widest spike to half of it
    if widest < w_lo:
        raise ValueError(f"trace spike_s: spikes of {int(w_lo)} s need >= {2 * int(w_lo)} s")
    slots = n // (2 * widest)
    rng = np.random.default_rng([seed, 3])
    baseline = _lognormal(n, noise, 0.8, rng)
    count = min(slots, max(1, int(rng.poisson(duration_s / spike_every_s))))
    width = n // slots
    shape = np.ones(n)
    events = []
    for slot in np.sort(rng.choice(slots, size=count, replace=False)):
        length = int(rng.integers(int(w_lo), widest + 1))
        start = int(slot * width + rng.integers(0, width - length))  # quiet last second
        h = float(rng.uniform(h_lo, h_hi))
        shape[start : start + length] = h
        events.append(TraceEvent(float(start), float(min(start + length, duration_s)), h))
    return _arrivals("spiky", baseline * shape, duration_s, rate_rps, rng, tuple(events))


def make_trace(name: str, duration_s: float, rate_rps: float, *, seed: int = 0) -> Trace:
    """The synthetic trace called `name` (periodic, bursty or spiky; or the paper's wiki, tweet,
    azure) with its default shape."""
    makers = {"periodic": periodic, "bursty": bursty, "spiky": spiky}
    key = TRACE_ALIASES.get(name, name)
    if key not in makers:
        valid = ", ".join(repr(n) for n in (*makers, *TRACE_ALIASES))
        raise ValueError(f"trace name: unknown {name!r}, expected one of {valid}")
    return makers[key](duration_s, rate_rps, seed=seed)


def overload_periods(
    offered: Trace | Sequence[float] | np.ndarray,
    capacity_rps: float | Sequence[float] | np.ndarray,
) -> tuple[Period, ...]:
    """The periods that require dropping: maximal runs of seconds whose offered rate exceeds
    the capacity (PARD §5.1 reports goodput over them).

    `offered` is a trace, whose offered rate is its rate curve (the expected rate the arrivals
    are drawn from, so one second's Poisson noise does not make a period), or the offered
    requests per second from second 0; `capacity_rps` the requests per second the pipeline can
    serve, one number or one per second (a capacity that scaling moves).
    """
    if isinstance(offered, Trace):
        rates, end_s = np.asarray(offered.rate_curve, dtype=float), offered.duration_s
    else:
        rates = np.asarray(offered, dtype=float)
        end_s = float(len(rates))
    capacity = np.broadcast_to(np.asarray(capacity_rps, dtype=float), rates.shape)
    if not np.all(np.isfinite(capacity) & (capacity >= 0)):
        raise ValueError(f"overload capacity_rps: must be finite and >= 0, got {capacity_rps!r}")
    over = np.concatenate(([False], rates > capacity, [False]))
    edges = np.flatnonzero(over[1:] != over[:-1])
    return tuple(
        Period(float(a), min(float(b), end_s)) for a, b in zip(edges[::2], edges[1::2], strict=True)
    )


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
