"""Simulator speed: wall time per million simulated tasks, and peak memory.

    python -m loadtests.bench_sim [SCENARIO] [--load 0.3] [--policy tf-edfq] [--repeats 3]

Default scenario: experiment 1's (N = 100, fanout 1/10/100, Masstree, 400,000
queries ≈ 1.07 M tasks). The first run includes drawing the workload (cached
for later runs: a bisection or a policy comparison reuses it); later runs are
what each extra probe costs. Runs on one core (the simulator is one process).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

from loadtests.sim.engine import simulate
from loadtests.sim.scenario import load_scenario
from loadtests.sim.workload import make_workload
from taskserver.queues import QueuePolicy

DEFAULT = Path(__file__).with_name("scenarios") / "fanout-single-class.toml"


def main() -> None:
    """Time the simulator and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenario", nargs="?", default=str(DEFAULT))
    parser.add_argument("--load", type=float, default=0.3)
    parser.add_argument(
        "--policy", default=QueuePolicy.TF_EDFQ.value, choices=[p.value for p in QueuePolicy]
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    scn = load_scenario(args.scenario)
    walls = []
    for _ in range(args.repeats + 1):
        t = time.perf_counter()
        simulate(scn, args.load, policy=args.policy)
        walls.append(time.perf_counter() - t)
    tasks = make_workload(scn, args.load).tasks
    first, rest = walls[0], walls[1:]
    per_m = statistics.median(rest) / tasks * 1e6
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"scenario {scn.name}: {scn.run.queries:,} queries, ~{tasks:,} tasks, "
        f"load {args.load}, policy {args.policy}"
    )
    print(
        f"first run (draws the workload): {first:.2f} s = {first / tasks * 1e6:.2f} s per M tasks"
    )
    print(
        f"later runs (median of {len(rest)}): {statistics.median(rest):.2f} s "
        f"= {per_m:.2f} s per M tasks"
    )
    print(f"peak resident memory: {peak_mb:.0f} MB")


if __name__ == "__main__":
    main()
