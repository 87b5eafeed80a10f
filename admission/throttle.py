"""Admission throttle: admit a fraction of new queries that holds the miss ratio at R_cth^U.

Beyond the paper. TailGuard §III.D rejects *every* new query while the windowed task
deadline-miss ratio is above R_cth^U and admits every one below it. Fed by a window that
lags the queues, that on/off control admits bursts at the full offered load, and when the
fanout is large (every query touching every server) the admitted queries of a burst miss
their SLO even though the average miss ratio sits at the threshold. Worse, a count window
stops moving while everything is rejected.

The throttle keeps TailGuard's signal and threshold but acts on a rate: each new query is
admitted with probability p, a thinned arrival stream with the offered stream's shape, and
p follows an integral controller in log space, once per control interval:

    log p <- log p + gain * (log R_cth^U - log max(r, R_cth^U / max_step))

clipped to [p_min, 1], where r is the windowed miss ratio. At equilibrium r = R_cth^U, the
operating point the threshold was calibrated at; p never drops below p_min, so admitted
tasks keep feeding the window and it can tell when the overload is over.

Pure code: time comes in as `now`, the uniform draw as an argument.
"""

from __future__ import annotations

import math

from admission.errors import PolicyValueError

__all__ = ["AdmitThrottle"]


class AdmitThrottle:
    """The admitted fraction p of new queries, steered by the windowed miss ratio."""

    __slots__ = ("_last", "gain", "interval_s", "max_step", "min_fraction", "p", "threshold")

    def __init__(
        self,
        threshold: float,
        *,
        interval_s: float = 0.05,
        gain: float = 0.5,
        min_fraction: float = 0.02,
        max_step: float = 4.0,
    ) -> None:
        if not 0 < threshold <= 1:
            raise PolicyValueError(f"throttle threshold: must be in (0, 1], got {threshold!r}")
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise PolicyValueError(f"throttle interval_s: must be > 0, got {interval_s!r}")
        if not (gain > 0 and math.isfinite(gain)):
            raise PolicyValueError(f"throttle gain: must be > 0, got {gain!r}")
        if not 0 < min_fraction <= 1:
            raise PolicyValueError(
                f"throttle min_fraction: must be in (0, 1], got {min_fraction!r}"
            )
        if not (max_step > 1 and math.isfinite(max_step)):
            raise PolicyValueError(f"throttle max_step: must be > 1, got {max_step!r}")
        self.threshold = threshold
        self.interval_s = interval_s
        self.gain = gain
        self.min_fraction = min_fraction
        self.max_step = max_step
        self.p = 1.0
        """Probability that the next query is admitted."""
        self._last: float | None = None

    def update(self, miss_ratio: float, now: float) -> float:
        """Step p once per interval from the miss ratio; returns the current p."""
        if self._last is None:
            self._last = now
            return self.p
        if now - self._last < self.interval_s:
            return self.p
        self._last = now
        # Linear in r, so that the long-run mean of r (not its geometric mean) settles at the
        # threshold; a ratio far above it steps down at most max_step times as hard.
        error = (self.threshold - miss_ratio) / self.threshold
        step = self.gain * max(-self.max_step, error)
        self.p = min(1.0, max(self.min_fraction, self.p * math.exp(step)))
        return self.p

    def admit(self, draw: float) -> bool:
        """Whether a query with uniform draw in [0, 1) is admitted at the current p."""
        return draw < self.p
