"""A linear-weighted sliding window: the recent queueing delay q_i of PARD §4.2 (footnote 4).

A sample of age a weighs 1 - a / window_s, so the newest sample weighs 1 and the weight falls
linearly to 0 at the window's age; samples at least that old are evicted. The paper gives the
shape ("5 s linear weighted window") but not its form: this is the plain reading.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["LinearWeightedWindow"]


class LinearWeightedWindow:
    """Weighted mean of recent samples, weights falling linearly with age to 0 at window_s."""

    __slots__ = ("_samples", "window_s")

    def __init__(self, window_s: float = 5.0) -> None:
        if not (isinstance(window_s, int | float) and math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window window_s: must be a finite number > 0, got {window_s!r}")
        self.window_s = float(window_s)
        self._samples: deque[tuple[float, float]] = deque()  # (time, value), oldest first

    def record(self, value: float, now: float) -> None:
        """Add a sample observed at `now`."""
        self._samples.append((now, value))
        self._evict(now)

    def _evict(self, now: float) -> None:
        horizon = now - self.window_s
        samples = self._samples
        while samples and samples[0][0] <= horizon:
            samples.popleft()

    def mean(self, now: float) -> float:
        """The weighted mean at `now`; 0.0 when no sample is younger than the window."""
        self._evict(now)
        total_w = 0.0
        total = 0.0
        inv = 1.0 / self.window_s
        for t, value in self._samples:
            weight = min(1.0, 1.0 - (now - t) * inv)  # a sample "from the future" weighs 1
            total_w += weight
            total += weight * value
        return total / total_w if total_w > 0 else 0.0

    def __len__(self) -> int:
        return len(self._samples)
