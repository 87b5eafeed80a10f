"""The SaaS max-rate search, pure: a bisection over rates and the summary over seeds.

`RateBisection` proposes the next rate to probe from the pass/fail verdicts so far: the
low end first (a policy that fails it is reported as below it), then the high end (one
that passes it is reported as at least it, ``capped``), then midpoints between the
highest passing rate below the lowest failing one and that failing rate, until they are
within ``resolution`` or ``max_probes`` probes were run. A probe is noisy, so the answer
is the highest passing rate below the lowest failing one: a rate that passed above one
that failed is not trusted.

`summarise` turns each seed's answer into a policy's mean, min-max spread and 95% CI;
`ranking_line` orders the policies by mean and says between each neighbour pair whether
the order holds beyond the seeds' spread (the lower one's best seed below the higher
one's worst).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtests.sim.maxload import ci95

__all__ = ["PolicySummary", "RateBisection", "SeedResult", "ranking_line", "summarise"]


@dataclass
class RateBisection:
    """The rates to probe for one policy and seed, and the answer (see the module doc)."""

    low: float
    high: float
    resolution: float = 1.0
    """Stop once the passing and the failing rate are this close (q/s)."""
    max_probes: int = 8
    """Stop after this many probes, whatever the gap."""
    probes: list[tuple[float, bool]] = field(default_factory=list)
    """(rate, all classes met) in the order probed."""

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high or not math.isfinite(self.high):
            raise ValueError(f"low/high: need 0 < low < high, got {self.low}, {self.high}")
        if not self.resolution > 0:
            raise ValueError(f"resolution: must be > 0, got {self.resolution}")
        if self.max_probes < 2:
            raise ValueError(f"max_probes: must be >= 2, got {self.max_probes}")

    def record(self, rate: float, met: bool) -> None:
        """The verdict of a probe at `rate`."""
        self.probes.append((rate, met))

    def _bounds(self) -> tuple[float, float | None]:
        """(highest passing rate below the lowest failing one or 0, lowest failing or None)."""
        failing = [r for r, met in self.probes if not met]
        top = min(failing) if failing else None
        passing = [r for r, met in self.probes if met and (top is None or r < top)]
        return (max(passing) if passing else 0.0), top

    def next_rate(self) -> float | None:
        """The next rate to probe; None when the search is over."""
        if not self.probes:
            return self.low
        if len(self.probes) >= self.max_probes:
            return None
        best, top = self._bounds()
        if best == 0.0:
            return None  # the low end failed
        if top is None:
            return None if best >= self.high else self.high
        if top - best <= self.resolution:
            return None
        return round((best + top) / 2, 3)

    @property
    def best(self) -> float:
        """The highest rate that passed (below any that failed); 0 if none did."""
        return self._bounds()[0]

    @property
    def capped(self) -> bool:
        """The high end passed: the true answer may lie above it."""
        return self.best >= self.high


@dataclass(frozen=True)
class SeedResult:
    """One policy's answer on one seed."""

    seed: int
    rate: float
    """Highest rate with all classes within their SLOs (0: none probed passed)."""
    utilisation: float
    """Mean agent utilisation of the run at that rate (0 if none passed)."""
    capped: bool = False


@dataclass(frozen=True)
class PolicySummary:
    """One policy over its seeds."""

    policy: str
    seeds: tuple[SeedResult, ...]

    @property
    def rates(self) -> list[float]:
        """Each seed's highest passing rate."""
        return [s.rate for s in self.seeds]

    @property
    def mean(self) -> float:
        """Mean highest passing rate over the seeds."""
        return statistics.fmean(self.rates)

    @property
    def low(self) -> float:
        """The worst seed's rate."""
        return min(self.rates)

    @property
    def high(self) -> float:
        """The best seed's rate."""
        return max(self.rates)

    @property
    def ci95(self) -> float:
        """Half-width of the 95% CI of the mean rate (Student t; 0 with one seed)."""
        return ci95(self.rates)

    @property
    def utilisation(self) -> float:
        """Mean agent utilisation at each seed's highest passing rate."""
        return statistics.fmean(s.utilisation for s in self.seeds)

    def line(self) -> str:
        """One row of the summary table."""
        cap = " (capped: passed the highest rate)" if any(s.capped for s in self.seeds) else ""
        per_seed = ", ".join(f"{s.rate:g}" for s in self.seeds)
        return (
            f"{self.policy:9} {self.mean:7.2f} ± {self.ci95:5.2f}  "
            f"{self.low:6.2f}-{self.high:<6.2f} {self.utilisation:6.1%}   [{per_seed}]{cap}"
        )

    def to_json(self) -> dict[str, Any]:
        """Plain figures for files."""
        return {
            "mean": self.mean,
            "ci95": self.ci95,
            "min": self.low,
            "max": self.high,
            "utilisation": self.utilisation,
            "per_seed": [
                {"seed": s.seed, "rate": s.rate, "utilisation": s.utilisation, "capped": s.capped}
                for s in self.seeds
            ],
        }


def summarise(policy: str, seeds: Sequence[SeedResult]) -> PolicySummary:
    """A policy's summary over its seeds (at least one)."""
    if not seeds:
        raise ValueError(f"seeds: {policy} has no seed's result")
    return PolicySummary(policy, tuple(seeds))


def ranking_line(summaries: Sequence[PolicySummary]) -> str:
    """The policies by mean rate, each neighbour pair marked '>' when the order holds beyond
    the seeds' spread (min-max disjoint) and '~' when the spreads overlap."""
    ordered = sorted(summaries, key=lambda s: s.mean, reverse=True)
    if not ordered:
        return "ranking: no policy"
    text = f"{ordered[0].policy} {ordered[0].mean:.2f}"
    separated = []
    for upper, lower in itertools.pairwise(ordered):
        beyond = lower.high < upper.low
        separated.append(beyond)
        text += f" {'>' if beyond else '~'} {lower.policy} {lower.mean:.2f}"
    if len(ordered) == 1:
        verdict = "one policy: nothing to rank"
    elif min(len(s.seeds) for s in ordered) < 2:
        verdict = "one seed: no run-to-run spread measured, so nothing holds beyond it"
    elif all(separated):
        verdict = "the whole ranking holds beyond the run-to-run spread"
    elif separated[0]:
        verdict = f"{ordered[0].policy} is first beyond the spread; the rest overlap in places"
    else:
        verdict = f"{ordered[0].policy} leads on the mean but not beyond the spread"
    return f"ranking: {text}  ('>' beyond the seeds' min-max spread, '~' within it): {verdict}"
