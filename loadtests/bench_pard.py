"""Benchmark of PARD's per-request policy cost: the eq. (3) decision plus DEPQ push and pop.

Run on purpose, not in CI: ``python -m loadtests.bench_pard [--rounds N]``. A worker of the
first module of a five-module chain (lv-like) holds a DEPQ of a fixed size (100, 1,000,
10,000 requests); each round pushes one batch of fresh requests and forms one batch
(form_batch: pops in HBF or LBF order, decides each by eq. (3), sweeps the hopeless low end
under HBF), so the queue stays at its size. The figure of merit is the cost per request, in
microseconds and as a share of a 400 ms SLO (the target: < 1% of request latency). The State
Planner's refresh (w_k from M = 10,000 draws per downstream module) runs once per exchange
period, not per request, and is reported as a share of that period.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

from taskserver.pard import (
    DoubleEndedPriorityQueue,
    ModuleState,
    PipelineGraph,
    PipelineRequest,
    StatePlanner,
    create_dropper,
)

SLO_S = 0.4
MODULES = ("person", "face", "expression", "eye", "pose")


class LinearProfile:
    """duration_ms = base + per-request slope * batch: a typical GPU batching curve."""

    def duration_ms(self, module_id: str, batch: int) -> float:
        return 8.0 + 2.5 * batch


def build_planner(batch_size: int) -> StatePlanner:
    graph = PipelineGraph.chain(*MODULES)
    planner = StatePlanner(MODULES[0], graph, LinearProfile(), batch_sizes={MODULES[0]: batch_size})
    for module in MODULES[1:]:
        fractions = (0.0, 0.5, 1.0)  # W/d spread like the paper's uniform model
        planner.merge(ModuleState(module, batch_size, 1, 0.01, fractions, seq=0))
    planner.refresh()
    return planner


def percentile(sorted_us: Sequence[float], q: float) -> float:
    return sorted_us[min(len(sorted_us) - 1, int(q * len(sorted_us)))]


def bench_policy(
    name: str, size: int, batch: int, rounds: int, rng: random.Random
) -> tuple[list[float], str]:
    """Per-request cost (us) of push + pop + decision, one figure per round; the final order."""
    planner = build_planner(batch)
    dropper = create_dropper(name, planner)
    queue = dropper.new_queue()
    now = 0.0
    ids = iter(range(10**9))

    def fresh(now: float) -> PipelineRequest:
        # Spent budgets spread over [0, 350 ms]: most admissible, some hopeless.
        spent = rng.uniform(0.0, 0.35)
        return PipelineRequest(next(ids), now - spent + SLO_S, SLO_S, received_s=now)

    for _ in range(size - batch):
        queue.push(fresh(now), now)
    costs: list[float] = []
    for _ in range(rounds + 20):
        now += 0.001  # 8 arrivals per ms against ~285 rps capacity: mu > 1 after 1 s
        module = planner.context(expected_start_s=now + 0.005)
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            queue.push(fresh(now), now)
        t1 = time.perf_counter_ns()
        plan = dropper.form_batch(queue, module, now)
        t2 = time.perf_counter_ns()
        handled = max(1, len(plan.admitted) + len(plan.dropped))
        costs.append(((t1 - t0) / batch + (t2 - t1) / handled) / 1e3)
        while len(queue) < size - batch:  # hold the queue at its size
            queue.push(fresh(now), now)
    controller = getattr(queue, "controller", None)
    order = str(controller.priority) if controller is not None else "-"
    return sorted(costs[20:]), order


def bench_decide(rounds: int, rng: random.Random) -> float:
    """Mean cost (us) of one eq. (3) decision on its own."""
    planner = build_planner(8)
    broker = create_dropper("pard", planner)
    module = planner.context(expected_start_s=0.005)
    reqs = [PipelineRequest(i, rng.uniform(0.05, 0.4), SLO_S, 0.0) for i in range(rounds)]
    start = time.perf_counter_ns()
    for r in reqs:
        broker.decide(r, module, 0.0)
    return (time.perf_counter_ns() - start) / rounds / 1e3


def bench_depq(size: int, ops: int, rng: random.Random) -> tuple[float, float, float]:
    """Mean cost (us) of push, pop_min and pop_max on a DEPQ held at `size` items."""
    depq: DoubleEndedPriorityQueue[int] = DoubleEndedPriorityQueue()
    for i in range(size):
        depq.push(i, rng.random(), i)
    next_id = size
    push_ns = min_ns = max_ns = 0
    for k in range(ops):
        key = rng.random()
        t0 = time.perf_counter_ns()
        depq.push(next_id, key, next_id)
        t1 = time.perf_counter_ns()
        if k % 2:
            depq.pop_min()
            min_ns += time.perf_counter_ns() - t1
        else:
            depq.pop_max()
            max_ns += time.perf_counter_ns() - t1
        push_ns += t1 - t0
        next_id += 1
    half = ops / 2
    return push_ns / ops / 1e3, min_ns / half / 1e3, max_ns / half / 1e3


def main(argv: Sequence[str] | None = None) -> None:
    """Time the policy at each queue size and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="comma-separated queue sizes")
    parser.add_argument("--batch", type=int, default=8, help="batch size of the worker")
    parser.add_argument("--rounds", type=int, default=3000, help="timed batch rounds per figure")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    sizes = [int(s) for s in args.sizes.split(",")]
    modules = len(MODULES)

    print(f"DEPQ alone (mean us per op, {args.rounds * 4} ops):")
    for size in sizes:
        push, pmin, pmax = bench_depq(size, args.rounds * 4, rng)
        print(f"  size {size:>6}: push {push:5.2f}   pop_min {pmin:5.2f}   pop_max {pmax:5.2f}")

    print(f"\neq. (3) decision alone: {bench_decide(args.rounds * 4, rng):.2f} us")
    print(
        f"\nper request at one module: push + pop + eq. (3) decision "
        f"(batch {args.batch}, {modules}-module chain, decided at module 1)"
    )
    for name in ("pard", "hbf-only", "lbf-only", "nexus"):
        for size in sizes:
            us, order = bench_policy(name, size, args.batch, args.rounds, rng)
            mean = sum(us) / len(us)
            share = mean * modules / (SLO_S * 1e6) * 100
            print(
                f"  {name:<9} size {size:>6}: p50 {percentile(us, 0.5):6.2f} us  "
                f"p99 {percentile(us, 0.99):6.2f} us  mean {mean:6.2f} us  "
                f"x{modules} modules = {share:.4f}% of a {SLO_S * 1e3:.0f} ms SLO"
                + (f"  (ended in {order.upper()})" if order != "-" else "")
            )

    planner = build_planner(args.batch)
    start = time.perf_counter()
    repeats = 20
    for _ in range(repeats):
        planner.refresh()
    refresh_ms = (time.perf_counter() - start) / repeats * 1e3
    print(
        f"\nState Planner refresh (w_k, M = {planner.wait_samples} draws x {modules - 1} "
        f"downstream modules): {refresh_ms:.1f} ms, {refresh_ms / 10:.2f}% of a 1 s period"
    )


if __name__ == "__main__":
    main()
