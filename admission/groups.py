"""Request groups (QLM §4) and their arrival rates, as the estimator and operators need them.

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
from dataclasses import dataclass
from typing import Any

from admission.errors import PolicyValueError

__all__ = ["RATE_WINDOW_SERVICES", "ArrivalRates", "GroupStats", "RequestGroups", "cost_bucket"]

RATE_WINDOW_SERVICES = 1000.0
"""A server's group arrival rates are weighted over this many of its mean service times:
about a thousand tasks per server at full load, so a rate is known to a few per cent."""


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


MAX_COST_BUCKET = 1022
"""The last cost bucket, [2^1022, 2^1023): it takes every larger cost too, so that both
bounds of every bucket are finite floats (2.0 ** 1024 overflows)."""


def cost_bucket(cost: float) -> int:
    """A query's cost bucket: k with 2^k <= cost < 2^(k+1) (cost in ms of server time), at
    most MAX_COST_BUCKET."""
    if not (cost > 0 and math.isfinite(cost)):
        raise PolicyValueError(f"query cost: must be > 0 and finite, got {cost!r}")
    return min(math.floor(math.log2(cost)), MAX_COST_BUCKET)


@dataclass(slots=True)
class GroupStats:
    """One request group's arrivals, cost and outstanding work (QLM §4)."""

    queries: int = 0
    tasks_outstanding: int = 0
    cost_sum: float = 0.0
    service_ms_sum: float = 0.0
    service_samples: int = 0

    @property
    def mean_cost(self) -> float:
        """Mean cost of its queries (k_f * x_p^u, ms of server time)."""
        return self.cost_sum / self.queries if self.queries else 0.0

    @property
    def mean_service_ms(self) -> float:
        """Mean service time of its finished tasks (0 before the first)."""
        return self.service_ms_sum / self.service_samples if self.service_samples else 0.0


class RequestGroups:
    """Request groups (QLM §4, Definition 4.1): queries that share a class (SLO), a pool and
    a cost bucket, with per-group arrival rate, cost and outstanding tasks.

    The estimated drain time of a group is its outstanding tasks' mean service over the
    pool's slots (QLM eq. 2 applied to the group alone): how long the group's own work
    holds the pool if nothing else ran.
    """

    def __init__(self, rate_window: float) -> None:
        self.rates = ArrivalRates(rate_window)
        self.groups: dict[tuple[str, str, int], GroupStats] = {}

    @staticmethod
    def key(cls: str, pool: str, cost: float) -> tuple[str, str, int]:
        """The group a query belongs to."""
        return (cls, pool, cost_bucket(cost))

    def admitted(self, key: tuple[str, str, int], cost: float, tasks: int, now: float) -> None:
        """A query of the group was dispatched with `tasks` tasks."""
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = GroupStats()
        g.queries += 1
        g.cost_sum += cost
        g.tasks_outstanding += tasks
        self.rates.add(key, now)

    def task_done(self, key: tuple[str, str, int], service_ms: float | None) -> None:
        """One of its tasks ended (with its service time when it ran)."""
        g = self.groups.get(key)
        if g is None:
            return
        g.tasks_outstanding = max(g.tasks_outstanding - 1, 0)
        if service_ms is not None and service_ms >= 0 and math.isfinite(service_ms):
            g.service_ms_sum += service_ms
            g.service_samples += 1

    def tasks_done(
        self, key: tuple[str, str, int], ended: int, service_ms_sum: float, ran: int
    ) -> None:
        """Several of its tasks ended (a frame of results), `ran` of them with service times
        that sum to `service_ms_sum`."""
        g = self.groups.get(key)
        if g is None:
            return
        g.tasks_outstanding = max(g.tasks_outstanding - ended, 0)
        g.service_ms_sum += service_ms_sum
        g.service_samples += ran

    def snapshot(self, now: float, slots: dict[str, int]) -> list[dict[str, Any]]:
        """Every group with its statistics (GET /v1/groups); `slots` per pool."""
        out = []
        for (cls, pool, bucket), g in sorted(self.groups.items()):
            drain = g.tasks_outstanding * g.mean_service_ms / max(slots.get(pool, 1), 1)
            out.append(
                {
                    "class": cls,
                    "pool": pool,
                    "cost_bucket": [2.0**bucket, 2.0 ** (bucket + 1)],
                    "queries": g.queries,
                    "arrival_rate": self.rates.rate((cls, pool, bucket), now),
                    "mean_cost_ms": g.mean_cost,
                    "tasks_outstanding": g.tasks_outstanding,
                    "mean_service_ms": g.mean_service_ms,
                    "estimated_drain_ms": drain,
                }
            )
        return out
