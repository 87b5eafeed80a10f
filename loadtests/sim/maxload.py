"""The highest load at which every class and fanout type meets its SLO, by bisection.

Every probe of every policy runs the same queries (common random numbers: the
scenario's seed fixes them, the load only rescales time), so the comparison
between policies is paired and the bisection sees a monotone signal. A probe whose
verdict is "unjudged" (a group with too few samples beyond its percentile) counts as
not met and is reported: a max load found on unjudged probes is a lower bound at best.

One seed's max load is one draw: ``max_load_over_seeds`` repeats the search on several
seeds and reports the spread (min, max, and a 95% confidence interval of the mean).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from loadtests.sim.engine import SimResult, simulate
from loadtests.sim.report import Report, report
from loadtests.sim.scenario import Scenario


@dataclass(slots=True)
class MaxLoad:
    """The result of one policy's bisection."""

    policy: str
    max_load: float
    """Highest probed load that met every SLO (0 if even the lowest did not)."""
    bracket: tuple[float, float]
    """max_load met, bracket[1] did not (or the upper search bound)."""
    probes: list[tuple[float, bool]] = field(default_factory=list)
    at_max: Report | None = None
    """The report of the run at max_load."""
    unjudged: list[tuple[float, str]] = field(default_factory=list)
    """Probes whose verdict was "unjudged": (load, the report's warning)."""

    def to_json(self) -> dict[str, Any]:
        """Details of the search."""
        out: dict[str, Any] = {
            "max_load": self.max_load,
            "bracket": list(self.bracket),
            "probes": [{"load": load, "met": met} for load, met in self.probes],
        }
        if self.at_max is not None:
            cls, ftype, n = self.at_max.rarest()
            out["rarest"] = {"class": cls, "fanout_type": ftype, "samples": n}
            out["at_max"] = self.at_max.to_json()
        out["unjudged_probes"] = [{"load": load, "warning": w} for load, w in self.unjudged]
        return out

    def confidence(self) -> str:
        """One line on how much to trust the figure."""
        lo, hi = self.bracket
        text = f"between {lo:.3f} (met) and {hi:.3f} (not met)"
        if self.at_max is not None:
            cls, ftype, n = self.at_max.rarest()
            text += f"; rarest group class {cls} k={ftype} with {n:,} samples"
        return text


def find_max_load(
    scn: Scenario,
    policy: str,
    *,
    lo: float = 0.02,
    hi: float = 0.98,
    tol: float = 0.005,
    run: Callable[[Scenario, float, str], SimResult] | None = None,
    on_probe: Callable[[str, float, bool], None] | None = None,
) -> MaxLoad:
    """Bisect the load in [lo, hi] until the bracket is narrower than tol."""
    run = run or (lambda s, load, p: simulate(s, load, policy=p))
    out = MaxLoad(policy, 0.0, (lo, hi))

    def probe(load: float) -> Report:
        rep = report(run(scn, load, policy))
        out.probes.append((load, rep.met))
        if rep.verdict == "unjudged":
            out.unjudged.append((load, rep.warning()))
        if on_probe is not None:
            on_probe(policy, load, rep.met)
        return rep

    rep = probe(lo)
    if not rep.met:
        out.bracket = (0.0, lo)
        return out
    best = rep
    top = probe(hi)
    if top.met:
        out.max_load, out.bracket, out.at_max = hi, (hi, hi), top
        return out
    while hi - lo > tol:
        mid = (lo + hi) / 2.0
        rep = probe(mid)
        if rep.met:
            lo, best = mid, rep
        else:
            hi = mid
    out.max_load, out.bracket, out.at_max = lo, (lo, hi), best
    return out


@dataclass(slots=True)
class SeedSpread:
    """One policy's max load on several seeds (each a full bisection)."""

    policy: str
    runs: list[MaxLoad]
    seeds: list[int]

    @property
    def values(self) -> list[float]:
        """The max load of each seed."""
        return [r.max_load for r in self.runs]

    @property
    def mean(self) -> float:
        """Mean max load over the seeds."""
        return statistics.fmean(self.values)

    def ci95(self) -> float:
        """Half-width of the 95% confidence interval of the mean (Student t); 0 for one seed."""
        return ci95(self.values)

    def summary(self) -> str:
        """One line: mean ± CI, range and the seeds."""
        vals = self.values
        text = f"max load {self.mean:.3f}"
        if len(vals) > 1:
            text += (
                f" ± {self.ci95():.3f} (95% CI over {len(vals)} seeds; range "
                f"{min(vals):.3f}-{max(vals):.3f})"
            )
        return text

    def to_json(self) -> dict[str, Any]:
        """Per seed and summary figures."""
        return {
            "mean": self.mean,
            "ci95": self.ci95(),
            "min": min(self.values),
            "max": max(self.values),
            "per_seed": {str(s): r.to_json() for s, r in zip(self.seeds, self.runs, strict=True)},
        }


_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Student t quantiles at 0.975 for 1..10 degrees of freedom (1.96 beyond)."""


def ci95(values: Sequence[float]) -> float:
    """Half-width of the 95% confidence interval of the mean of `values` (Student t); the
    non-finite ones (a p99 of no query) are left out."""
    values = [v for v in values if math.isfinite(v)]
    n = len(values)
    if n < 2:
        return 0.0
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return t * statistics.stdev(values) / math.sqrt(n)


def max_load_over_seeds(
    scn: Scenario,
    policy: str,
    seeds: list[int],
    *,
    tol: float = 0.005,
    run: Callable[[Scenario, float, str], SimResult] | None = None,
    on_probe: Callable[[str, float, bool], None] | None = None,
) -> SeedSpread:
    """find_max_load on each seed's queries (every seed: its own common random numbers)."""
    runs = [
        find_max_load(
            replace(scn, run=replace(scn.run, seed=seed)),
            policy,
            tol=tol,
            run=run,
            on_probe=on_probe,
        )
        for seed in seeds
    ]
    return SeedSpread(policy, runs, list(seeds))
