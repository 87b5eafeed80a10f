"""Run-time budget adjustment per class (beyond TailGuard, which leaves it open)."""

from __future__ import annotations

from loadtests.sim.engine import SimResult, simulate
from loadtests.sim.scenario import Scenario


def simulate_with_budget(scn: Scenario, load: float, policy: str) -> SimResult:
    """Simulate, with the class budget controller when the scenario asks for it."""
    return simulate(scn, load, policy=policy)
