"""What the wire's safety checks cost per frame and per task, against decoding itself.

Every frame a task server, an edge agent or the gateway receives is bounds-checked
(taskserver.framecheck) before thriftpy2's Cython decoder reads it, and every decoded task
or result is checked field by field (taskserver.messages). This prints, for the frames the
dispatch path carries (batches of 1, 10 and 100 tasks or results): the decode alone, the
C walk and the Python walk, and the field checks, each in µs (best of 5 repeats), and the
share the checks add to decoding.

    python -m loadtests.bench_framecheck [--number 20000]
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

from thriftpy2.protocol.cybin import TCyBinaryProtocol
from thriftpy2.transport import TCyMemoryBuffer

from taskserver import framecheck
from taskserver.framecheck import WireLimits, check_frame, check_frame_py
from taskserver.messages import result_problem, task_identity_problem, task_problem
from taskserver.wire import Batcher, gateway_body_types, server_body_types, thrift

LIMITS = WireLimits()
PAYLOAD = b'{"service_ms": 1.0}'


def _decode_only(frame: bytes, body_types: dict[tuple[str, int], type]) -> Any:
    """thriftpy2's decode without the check (what decode_message did before it)."""
    proto = TCyBinaryProtocol(TCyMemoryBuffer(frame))
    name, mtype, _ = proto.read_message_begin()
    body = body_types[(name, mtype)]()
    proto.read_struct(body)
    return body


def _us(fn: Callable[[], Any], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--number", type=int, default=20_000, help="calls per repeat")
    args = parser.parse_args()
    t = thrift()
    print(f"C walk built: {framecheck.IMPLEMENTATION == 'c'}")
    print(
        f"{'frame':<18} {'bytes':>6} {'decode µs':>10} {'C walk µs':>10} {'+%':>6} "
        f"{'Py walk µs':>11} {'+%':>6} {'fields µs':>10}"
    )
    for n in (1, 10, 100):
        tasks = [t.Task(f"gw-1-q{i}", i, 123.4, 456.7, 1, "A", PAYLOAD) for i in range(n)]
        results = [
            t.TaskResult(f"gw-1-q{i}", i, 0, 0.1, 0.2, 0.3, False, b'{"ok":1}', None)
            for i in range(n)
        ]
        for kind, frame, types, check_fields in (
            ("submit", Batcher.submit().encode(tasks)[4:], server_body_types(), _tasks_ok),
            ("result", Batcher.result().encode(results)[4:], gateway_body_types(), _results_ok),
        ):
            number = max(args.number // n, 200)
            body = _decode_only(frame, types)
            if kind == "submit":
                items = [body.task] if n == 1 else body.tasks
            else:
                items = [body.result] if n == 1 else body.results
            dec = _us(lambda f=frame, ty=types: _decode_only(f, ty), number)
            c = _us(lambda f=frame: check_frame(f, LIMITS), number)
            py = _us(lambda f=frame: check_frame_py(f, LIMITS), number)
            fields = _us(lambda it=items, chk=check_fields: chk(it), number)
            print(
                f"{kind + f' x{n}':<18} {len(frame):>6} {dec:>10.2f} {c:>10.2f} "
                f"{100 * c / dec:>5.1f}% {py:>11.2f} {100 * py / dec:>5.0f}% {fields:>10.2f}"
            )


def _tasks_ok(tasks: list[Any]) -> None:
    for task in tasks:
        assert task_identity_problem(task) is None and task_problem(task) is None


def _results_ok(results: list[Any]) -> None:
    for r in results:
        assert result_problem(r) is None


if __name__ == "__main__":
    main()
