"""Heterogeneity profiles: the post-queuing times of the testbed's Pi clusters, emulated.

A loopback testbed runs every agent on one fast host, so every agent would answer a range
read in a few ms. A profile makes an agent's service time follow the distribution measured
on one real cluster (unloaded, 1-30-day range reads on an 18-month store):

    profile       mean    p95    p99   (ms)
    server-room     82    235    300
    wet-lab         31    112    136
    faculty         92    226    306
    gta             91    228    304

Each task draws a target service time T from the profile and the executor pads the real
query time q up to it: service = max(T, slowdown · q). A query heavier than its draw thus
still takes longer on a slower device (``slowdown``), and the emulated distribution does
not depend on how fast the host happens to be, as long as q stays below T.

The distribution is a piecewise-linear inverse CDF through five knots,
u = 0, body_u, 0.95, 0.99, 1, with Q(0.95) = p95, Q(0.99) = p99, Q(1) continuing the
0.95-0.99 slope, Q(0) = floor_ratio · Q(body_u), and Q(body_u) solved so that the mean
(the area under Q) is the target mean. Pure: draws take an injected ``random.Random``.
"""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass

__all__ = [
    "PROFILE_NAMES",
    "PROFILE_TARGETS",
    "ServiceProfile",
    "fit_profile",
    "make_profile",
]

PROFILE_TARGETS: dict[str, tuple[float, float, float]] = {
    "server-room": (82.0, 235.0, 300.0),
    "wet-lab": (31.0, 112.0, 136.0),
    "faculty": (92.0, 226.0, 306.0),
    "gta": (91.0, 228.0, 304.0),
}
"""Profile -> target (mean, p95, p99) of the unloaded post-queuing time, in ms."""
PROFILE_NAMES = ("none", *PROFILE_TARGETS)


@dataclass(frozen=True, slots=True)
class ServiceProfile:
    """A piecewise-linear inverse CDF of service times plus a slowdown of real work."""

    name: str
    knots: tuple[tuple[float, float], ...]
    """(u, ms) points of the inverse CDF; u rises from 0 to 1, ms never falls."""
    slowdown: float = 1.0
    """Factor on the real query time when it exceeds the draw (a Pi is slower than a host)."""

    def __post_init__(self) -> None:
        us = [u for u, _ in self.knots]
        ms = [m for _, m in self.knots]
        if len(self.knots) < 2 or us[0] != 0.0 or us[-1] != 1.0:
            raise ValueError(f"knots: must run from u=0 to u=1, got {self.knots}")
        if any(b <= a for a, b in itertools.pairwise(us)):
            raise ValueError(f"knots: u must rise strictly, got {us}")
        if ms[0] < 0 or any(b < a for a, b in itertools.pairwise(ms)):
            raise ValueError(f"knots: ms must be >= 0 and never fall, got {ms}")
        if not self.slowdown >= 1.0:
            raise ValueError(f"slowdown: must be >= 1, got {self.slowdown}")

    def quantile_ms(self, u: float) -> float:
        """Q(u): the u-quantile of the service time, in ms."""
        if not 0.0 <= u <= 1.0:
            raise ValueError(f"u: must be in [0, 1], got {u}")
        us = [k[0] for k in self.knots]
        i = min(max(bisect.bisect_right(us, u), 1), len(us) - 1)
        (u0, m0), (u1, m1) = self.knots[i - 1], self.knots[i]
        return m0 + (m1 - m0) * (u - u0) / (u1 - u0)

    def mean_ms(self) -> float:
        """The distribution's mean (the area under Q)."""
        return sum(
            (u1 - u0) * (m0 + m1) / 2 for (u0, m0), (u1, m1) in itertools.pairwise(self.knots)
        )

    def sample_ms(self, rng: random.Random) -> float:
        """One service-time draw, in ms."""
        return self.quantile_ms(rng.random())

    def service_s(self, drawn_ms: float, query_s: float) -> float:
        """The emulated service time of a task whose real query took query_s."""
        return max(drawn_ms / 1000.0, query_s * self.slowdown)


def fit_profile(
    name: str,
    mean_ms: float,
    p95_ms: float,
    p99_ms: float,
    *,
    body_u: float = 0.8,
    floor_ratio: float = 0.2,
    slowdown: float = 1.0,
) -> ServiceProfile:
    """The five-knot profile with exactly this mean, p95 and p99 (see the module doc)."""
    if not 0 < p95_ms <= p99_ms:
        raise ValueError(f"p95/p99: need 0 < p95 <= p99, got {p95_ms}, {p99_ms}")
    if not 0.0 < body_u < 0.95 or not 0.0 <= floor_ratio <= 1.0:
        raise ValueError(f"body_u/floor_ratio: out of range: {body_u}, {floor_ratio}")
    top = p99_ms + (p99_ms - p95_ms) / 4  # the 0.95-0.99 slope continued to u = 1
    fixed = (0.95 - body_u) * p95_ms / 2 + 0.04 * (p95_ms + p99_ms) / 2 + 0.01 * (p99_ms + top) / 2
    weight = body_u * (1 + floor_ratio) / 2 + (0.95 - body_u) / 2
    body = (mean_ms - fixed) / weight
    if not 0 < body <= p95_ms:
        raise ValueError(
            f"{name}: no five-knot profile has mean {mean_ms} with p95 {p95_ms} and p99 "
            f"{p99_ms} at body_u={body_u} (Q(body_u) would be {body:.1f} ms)"
        )
    knots = (
        (0.0, floor_ratio * body),
        (body_u, body),
        (0.95, p95_ms),
        (0.99, p99_ms),
        (1.0, top),
    )
    return ServiceProfile(name, knots, slowdown)


def make_profile(name: str) -> ServiceProfile | None:
    """The named cluster's profile; None for "none" (the real query time, unpadded)."""
    if name == "none":
        return None
    target = PROFILE_TARGETS.get(name)
    if target is None:
        raise ValueError(f"profile: must be one of {', '.join(PROFILE_NAMES)}, got {name!r}")
    return fit_profile(name, *target)
