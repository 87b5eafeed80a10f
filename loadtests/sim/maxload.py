"""The highest load at which every class and fanout type meets its SLO, by bisection.

Every probe of every policy runs the same queries (common random numbers: the
scenario's seed fixes them, the load only rescales time), so the comparison
between policies is paired and the bisection sees a monotone signal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
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
