"""Recent query latencies against their SLOs, and the nearest-rank percentile.

The cost ladder reads the tail ratio: the worst, over classes, of the p-th percentile of
the last 1,000 answered queries' latency / SLO (1.0 = a class at its SLO).

Pure code.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence

__all__ = ["TailTracker", "nearest_rank"]


def nearest_rank(xs: Sequence[float], p: float) -> float:
    """Nearest-rank p-th percentile (p in (0, 100]) of an already sorted sequence; 0.0 if empty."""
    if not xs:
        return 0.0
    return xs[min(len(xs) - 1, max(0, math.ceil(p / 100.0 * len(xs)) - 1))]


class TailTracker:
    """latency / SLO of each class's recent answered queries; the worst class's p-th of it."""

    __slots__ = ("_every", "_percentile", "_since", "_size", "_tails", "ratio")

    def __init__(
        self, percentiles: Mapping[str, float], size: int = 1000, every: int = 100
    ) -> None:
        self._percentile = dict(percentiles)
        self._size = size
        self._every = every
        self._tails: dict[str, deque[float]] = {}
        self._since = 0
        self.ratio = 0.0
        """Worst recent p-th latency / SLO over classes; refreshed every `every` queries."""

    def record(self, cls: str, latency_ms: float, slo_ms: float) -> None:
        """One answered query's latency against its SLO."""
        ring = self._tails.get(cls)
        if ring is None:
            ring = self._tails[cls] = deque(maxlen=self._size)
        ring.append(latency_ms / slo_ms)
        self._since += 1
        if self._since >= self._every:  # a percentile per `every` queries, not per query
            self._since = 0
            self.ratio = max(
                (
                    nearest_rank(sorted(r), self._percentile.get(c, 99.0))
                    for c, r in self._tails.items()
                ),
                default=0.0,
            )
