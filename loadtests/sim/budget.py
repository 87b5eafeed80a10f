"""Run-time budget adjustment per class in the simulator (beyond TailGuard).

The controller is `loadtests.sim.budget_controller.BudgetController`, a pure policy fed
by the simulator's epochs. It is an experiment of the simulator only: the live gateway
does not run it.
"""

from __future__ import annotations

from loadtests.sim.budget_controller import BudgetController
from loadtests.sim.engine import SimResult, simulate
from loadtests.sim.scenario import Scenario


def simulate_with_budget(scn: Scenario, load: float, policy: str) -> SimResult:
    """Simulate, with the class budget controller when the scenario asks for it."""
    if not scn.run.budget_adjust:
        return simulate(scn, load, policy=policy)
    controller = BudgetController(
        [c.name for c in scn.classes], gain=0.3, min_scale=0.5, max_scale=2.0
    )
    return simulate(scn, load, policy=policy, controller=controller)
