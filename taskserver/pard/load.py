"""Module load factor mu, the dynamic boundary epsilon and HBF/LBF switching (PARD §4.3).

PARD §4.3: mu = T_in / T_m, with T_in the input workload and T_m the throughput the module
reaches at its batch size and profiled duration. HBF is applied when mu > Th_HBF = 1 + eps, LBF
when mu < Th_LBF = 1 - eps, and inside [1 - eps, 1 + eps] the priority is left as it is: that
band is the "delayed transition". eps = sum|T_in - T_s| / sum T_in, T_s being T_in smoothed by a
sliding-window average.

Gaps the paper leaves open, decided here:
- T_in is counted in fixed buckets of ``bucket_s`` (default 1 s, the state-exchange period);
  mu uses the latest *closed* bucket, so the priority can only change at a bucket boundary.
- T_s for a bucket is the mean of the last ``smooth_buckets`` T_in samples, that bucket included;
  the sums of eps run over the last ``epsilon_buckets`` samples.
- The first bucket starts at the first observed `now`; before any bucket has closed, or while
  T_m is unknown, the priority stays at ``initial`` (LBF: a fresh module is not overloaded).
- eps is not capped: after a large burst it may exceed 1, which keeps HBF until the burst
  leaves the eps window. That is the paper's "suppressing frequent switches", taken literally.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["AdaptivePriority", "ArrivalRateMonitor", "Priority", "PriorityConfig"]


class Priority(StrEnum):
    """Which end of the DEPQ a worker pops (§4.3)."""

    HBF = "hbf"  # High Budget First: largest remaining budget first (under-provisioned)
    LBF = "lbf"  # Low Budget First: smallest remaining budget first (within capacity)


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"priority {name}: must be an int >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class PriorityConfig:
    """Settings of the mu / eps estimate behind adaptive HBF/LBF switching."""

    bucket_s: float = 1.0  # length of one T_in sample
    smooth_buckets: int = 5  # T_s = mean of this many recent T_in samples
    epsilon_buckets: int = 30  # eps sums run over this many recent samples
    initial: Priority = Priority.LBF  # priority before mu is known

    def __post_init__(self) -> None:
        if not (isinstance(self.bucket_s, int | float) and math.isfinite(self.bucket_s)):
            raise ValueError(f"priority bucket_s: must be a finite number, got {self.bucket_s!r}")
        if self.bucket_s <= 0:
            raise ValueError(f"priority bucket_s: must be > 0, got {self.bucket_s!r}")
        _positive_int("smooth_buckets", self.smooth_buckets)
        _positive_int("epsilon_buckets", self.epsilon_buckets)
        if not isinstance(self.initial, Priority):
            raise ValueError(f"priority initial: must be a Priority, got {self.initial!r}")


class ArrivalRateMonitor:
    """T_in per bucket, its smoothed T_s and the boundary eps of §4.3."""

    __slots__ = (
        "_count",
        "_devs",
        "_index",
        "_origin",
        "_rates",
        "_recent",
        "buckets_closed",
        "config",
    )

    def __init__(self, config: PriorityConfig | None = None) -> None:
        self.config = config or PriorityConfig()
        self._origin: float | None = None
        self._index = 0  # index of the open bucket
        self._count = 0  # arrivals in the open bucket
        self._recent: deque[float] = deque(maxlen=self.config.smooth_buckets)  # for T_s
        self._rates: deque[float] = deque(maxlen=self.config.epsilon_buckets)  # T_in
        self._devs: deque[float] = deque(maxlen=self.config.epsilon_buckets)  # |T_in - T_s|
        self.buckets_closed = 0

    def record_arrival(self, now: float) -> None:
        """Count one arrival at time `now`."""
        self.advance(now)
        self._count += 1

    def advance(self, now: float) -> None:
        """Close every bucket that ended at or before `now`."""
        if self._origin is None:
            self._origin = now
            return
        index = math.floor((now - self._origin) / self.config.bucket_s)
        if index <= self._index:
            return
        self._close(self._count / self.config.bucket_s)
        # Empty buckets in between; beyond the longest window they change nothing.
        longest = max(self.config.smooth_buckets, self.config.epsilon_buckets)
        for _ in range(min(index - self._index - 1, longest)):
            self._close(0.0)
        self._index = index
        self._count = 0

    def _close(self, rate: float) -> None:
        self._recent.append(rate)
        smoothed = sum(self._recent) / len(self._recent)
        self._rates.append(rate)
        self._devs.append(abs(rate - smoothed))
        self.buckets_closed += 1

    @property
    def rate_rps(self) -> float | None:
        """T_in of the latest closed bucket, or None before the first bucket closes."""
        return self._rates[-1] if self._rates else None

    @property
    def smoothed_rps(self) -> float | None:
        """T_s: sliding-window average of T_in."""
        return sum(self._recent) / len(self._recent) if self._recent else None

    @property
    def epsilon(self) -> float:
        """eps = sum|T_in - T_s| / sum T_in over the recent buckets (§4.3); 0 with no load."""
        total = sum(self._rates)
        return sum(self._devs) / total if total > 0 else 0.0


class AdaptivePriority:
    """HBF/LBF choice with the delayed transition of §4.3 (or instant switching, for ablation)."""

    __slots__ = (
        "_capacity_rps",
        "instant",
        "last_switch_s",
        "load_factor",
        "monitor",
        "priority",
        "switch_count",
    )

    def __init__(self, config: PriorityConfig | None = None, *, instant: bool = False) -> None:
        self.monitor = ArrivalRateMonitor(config)
        self.instant = instant  # ablation: thresholds at exactly mu = 1 (eps = 0)
        self.priority: Priority = self.monitor.config.initial
        self.load_factor: float | None = None  # mu at the last update
        self.switch_count = 0
        self.last_switch_s: float | None = None
        self._capacity_rps: float | None = None

    def set_capacity_rps(self, capacity_rps: float) -> None:
        """T_m: throughput of this worker at its batch size, b / d(b), in requests per second."""
        if not capacity_rps > 0:
            raise ValueError(f"priority capacity_rps: must be > 0, got {capacity_rps!r}")
        self._capacity_rps = capacity_rps

    def record_arrival(self, now: float) -> None:
        """Count one arrival into the worker's queue."""
        self.monitor.record_arrival(now)

    @property
    def epsilon(self) -> float:
        """The boundary in use: the monitor's eps, or 0 for instant switching."""
        return 0.0 if self.instant else self.monitor.epsilon

    def update(self, now: float) -> Priority:
        """Re-evaluate mu at `now` and switch when it leaves the band [1 - eps, 1 + eps]."""
        self.monitor.advance(now)
        rate = self.monitor.rate_rps
        if rate is None or self._capacity_rps is None:
            return self.priority
        mu = rate / self._capacity_rps
        self.load_factor = mu
        if self.instant:
            # §4.3 bullets: mu > 1 -> HBF, mu <= 1 -> LBF, with no band.
            target = Priority.HBF if mu > 1.0 else Priority.LBF
        else:
            eps = self.monitor.epsilon
            if mu > 1.0 + eps:
                target = Priority.HBF
            elif mu < 1.0 - eps:
                target = Priority.LBF
            else:
                target = self.priority  # inside the band: the transition is delayed
        if target is not self.priority:
            self.priority = target
            self.switch_count += 1
            self.last_switch_s = now
        return self.priority
