"""What rendering a query answer costs per task: the C writer of the tasks against its twin.

The HTTP shell sends every answer as JSON with every task's entry (gateway.queries:
render_answer). Both writers render the same answers here, in alternating rounds: answers of
fanout k whose tasks ran (four timings each, a queue-wait estimate), each with its server's
own small JSON result, as the emulated task servers answer (each distinct result is checked
once per answer, so this is the dearer case). Printed per fanout: the median over the
rounds of µs per task for each writer, and their ratio. Without the C extension (not built, or
TAILGATE_PURE_PYTHON=1) only the Python writer runs.

    python -m loadtests.bench_render [--fanouts 10,100,1000] [--rounds 7] [--answers 300]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from gateway import queries
from gateway.queries import TaskOutcome, render_answer, render_answer_py

Writer = Callable[[dict[str, object], list[TaskOutcome], dict[str, object]], bytes]


def _outcomes(rng: random.Random, k: int) -> list[TaskOutcome]:
    return [
        TaskOutcome(
            f"ts-{i}",
            "ok",
            rng.uniform(0.0, 3.0),
            rng.uniform(0.0, 2.0),
            rng.uniform(0.0, 2.5),
            rng.uniform(0.0, 2.2),
            False,
            b'{"server": "ts-%d", "service_ms": 0.0}' % i,
            None,
            rng.uniform(0.0, 1.0),
        )
        for i in range(k)
    ]


def _per_task_us(write: Writer, answers: list[list[TaskOutcome]]) -> float:
    head: dict[str, object] = {"query_id": "gw-1", "fanout": len(answers[0])}
    tail: dict[str, object] = {"request_id": "req-1"}
    start = time.perf_counter()
    for outcomes in answers:
        write(head, outcomes, tail)
    return (time.perf_counter() - start) / (len(answers) * len(answers[0])) * 1e6


def main() -> None:
    """Parse options, render, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--fanouts", default="10,100,1000", type=lambda s: [int(x) for x in s.split(",") if x]
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--answers", type=int, default=300, help="answers per round")
    args = parser.parse_args()
    compiled = queries._c_render is not None
    print(f"writer of the tasks: {'C (gateway/_hotpath.c)' if compiled else 'Python only'}")
    print("fanout   C µs/task   Python µs/task   C / Python   (medians of rounds)")
    rng = random.Random(1)
    for k in args.fanouts:
        answers = [_outcomes(rng, k) for _ in range(max(args.answers * 10 // k, 3))]
        c_us: list[float] = []
        py_us: list[float] = []
        for r in range(args.rounds):
            sides = [(py_us, render_answer_py)] + ([(c_us, render_answer)] if compiled else [])
            for out, write in sides if r % 2 else sides[::-1]:
                out.append(_per_task_us(write, answers))
        py = statistics.median(py_us)
        if compiled:
            c = statistics.median(c_us)
            print(f"{k:>6}   {c:>9.2f}   {py:>14.2f}   {c / py:>10.2f}")
        else:
            print(f"{k:>6}   {'-':>9}   {py:>14.2f}   {'-':>10}")


if __name__ == "__main__":
    main()
