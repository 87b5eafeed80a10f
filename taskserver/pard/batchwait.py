"""Aggregated downstream batch wait and its lambda-quantile w_k (PARD §4.2, Batch wait estimation).

§4.2: a request's batch wait W_i at module M_i is the time from joining a batch (t_b) to the
batch's start (t_e); the worker collects the next batch as soon as the previous one starts, so
W_i lies in [0, d_i] (Fig. 3b). The W_i of different modules are weakly correlated, so their sum
concentrates around half of sum d_i as modules cascade (Fig. 6, central limit theorem). The State
Planner "performs random sampling on recent arrivals" to derive F_{k+1->N}, the distribution of
sum W_i over the downstream modules, and takes w_k = F^-1_{k+1->N}(lambda); footnote 7 puts the
cost at O(M (N - k + 1)) for M samples, i.e. one draw per sample and module.

Read here as: every module keeps the batch waits of its recent arrivals, and publishes them as a
small quantile sketch of W_i / d_i (a fraction of the duration, so that the sketch rescales when
the batch size, hence d_i, changes: "w_k varies in real time as batch sizes change"). The planner
draws M samples of sum_i d_i * U_i, each U_i drawn independently from module i's sketch (the
"weakly correlated" reading), and takes the lambda-quantile. A module that has not reported waits
yet is given the paper's own model, W_i uniform on [0, d_i]; with four equal modules this gives
w = 1.24 d at lambda = 0.1, the figure §4.2 quotes. Draws use a seeded generator, so an estimate
is a pure function of the states it came from.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence

__all__ = ["WaitSketch", "quantile", "sample_aggregate_waits", "uniform_fractions"]


def uniform_fractions(points: int = 21) -> tuple[float, ...]:
    """The sketch of W uniform on [0, d] (Fig. 3b): `points` evenly spaced quantiles."""
    if points < 2:
        raise ValueError(f"sketch points: must be >= 2, got {points!r}")
    return tuple(j / (points - 1) for j in range(points))


class WaitSketch:
    """Recent batch waits at one module, as fractions W / d of the batch duration."""

    __slots__ = ("_fractions", "points")

    def __init__(self, max_samples: int = 10_000, points: int = 21) -> None:
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 1:
            raise ValueError(f"sketch max_samples: must be an int >= 1, got {max_samples!r}")
        if isinstance(points, bool) or not isinstance(points, int) or points < 2:
            raise ValueError(f"sketch points: must be an int >= 2, got {points!r}")
        self.points = points
        self._fractions: deque[float] = deque(maxlen=max_samples)

    def record(self, wait_s: float, duration_s: float) -> None:
        """One request waited `wait_s` for a batch of profiled duration `duration_s`."""
        self._fractions.append(min(1.0, max(0.0, wait_s / duration_s)))

    def fractions(self) -> tuple[float, ...]:
        """`points` evenly spaced quantiles of the recent W / d, or () with no sample yet."""
        if not self._fractions:
            return ()
        ordered = sorted(self._fractions)
        last = len(ordered) - 1
        return tuple(
            _interpolate(ordered, j * last / (self.points - 1)) for j in range(self.points)
        )

    def __len__(self) -> int:
        return len(self._fractions)


def _interpolate(ordered: Sequence[float], pos: float) -> float:
    j = int(pos)
    if j >= len(ordered) - 1:
        return ordered[-1]
    return ordered[j] + (ordered[j + 1] - ordered[j]) * (pos - j)


def sample_aggregate_waits(
    modules: Sequence[tuple[float, Sequence[float]]], samples: int, rng: random.Random
) -> list[float]:
    """`samples` draws of sum_i d_i * U_i, U_i from module i's sketch; modules = (d_i, sketch)."""
    if samples < 1:
        raise ValueError(f"wait samples: must be >= 1, got {samples!r}")
    for duration_s, sketch in modules:
        if len(sketch) < 2:
            raise ValueError(f"wait sketch: needs >= 2 points, got {tuple(sketch)!r}")
        if not duration_s > 0:
            raise ValueError(f"wait duration_s: must be > 0, got {duration_s!r}")
    draw = rng.random
    total = [0.0] * samples
    for duration_s, sketch in modules:  # O(M (N - k)): footnote 7
        last = len(sketch) - 1
        for s in range(samples):
            pos = draw() * last
            j = int(pos)
            low = sketch[j]
            total[s] += duration_s * (low + (sketch[j + 1] - low) * (pos - j))
    return total


def quantile(samples: Sequence[float], q: float) -> float:
    """F^-1(q) of the empirical distribution: the smallest x with F(x) >= q (q = 0: the minimum)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile: must be in [0, 1], got {q!r}")
    if not samples:
        raise ValueError("quantile: no samples")
    ordered = sorted(samples)
    # The tolerance keeps float products such as 0.1 * 30 = 3.0000000000000004 on their rank.
    index = max(0, math.ceil(q * len(ordered) - 1e-9) - 1)
    return ordered[index]
