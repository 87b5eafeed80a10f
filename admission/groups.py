"""Request groups' arrival rates (QLM §4): what the waiting-time estimator needs of them.

QLM groups requests that share a size law and an SLO, and reasons about each group's
arrivals and work rather than each request's. The waiting-time estimator
(`admission.waiting.with_overtaking`) needs, per server, how fast each group's tasks arrive:
under a deadline or priority order, a group with a tighter key goes ahead of tasks already
waiting. `ArrivalRates` keeps that rate per key as an exponentially weighted count (the
count decays by e^(-dt / tau) and each arrival adds one, so count / tau estimates the rate
of a steady Poisson stream without bias and forgets a change in about tau). A key first seen
a time E ago has had only tau (1 - e^(-E / tau)) of weight to fill, so the count is divided
by that instead (the start-up correction of any exponentially weighted mean); E counts as at
least tau / 20, so two arrivals a moment apart do not read as a huge rate.

Pure code: time comes in as `now`, in whatever unit the caller uses (rates come out per
that unit).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator

from admission.errors import PolicyValueError

__all__ = ["ArrivalRates"]


class ArrivalRates:
    """Arrivals per unit of time, per key, exponentially weighted over `tau`."""

    __slots__ = ("_counts", "tau")

    def __init__(self, tau: float) -> None:
        if not (tau > 0 and math.isfinite(tau)):
            raise PolicyValueError(f"arrival-rate window tau: must be > 0, got {tau!r}")
        self.tau = tau
        self._counts: dict[Hashable, list[float]] = {}  # key -> [count, as of when, first seen]

    def add(self, key: Hashable, now: float, n: float = 1.0) -> None:
        """`n` arrivals of `key` at `now` (times must not go backwards per key)."""
        c = self._counts.get(key)
        if c is None:
            self._counts[key] = [n, now, now]
            return
        c[0] = c[0] * math.exp((c[1] - now) / self.tau) + n
        c[1] = now

    def rate(self, key: Hashable, now: float) -> float:
        """The key's arrival rate at `now` (0 for a key never seen)."""
        c = self._counts.get(key)
        if c is None:
            return 0.0
        return self._rate(c[0], c[1], c[2], now)

    def rates(self, now: float) -> Iterator[tuple[Hashable, float]]:
        """(key, rate) for every key seen."""
        for key, (count, then, first) in self._counts.items():
            yield key, self._rate(count, then, first, now)

    def _rate(self, count: float, then: float, first: float, now: float) -> float:
        tau = self.tau
        age = max(now - first, then - first, tau / 20.0)
        return count * math.exp(min(then - now, 0.0) / tau) / (tau * -math.expm1(-age / tau))

    def __len__(self) -> int:
        return len(self._counts)
