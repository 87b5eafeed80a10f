"""A query's fan-out, built per query: its k servers drawn and its k tasks made.

Both run once per query on the gateway's hot path, and both were Python loops over k
(`random.Random.sample`'s draws; a `PendingTask.__init__` per task). Here each is one call
into gateway/_hotpath.c where it is built:

- `sample(rng, population, k)` is `rng.sample(population, k)`, the same draws in the same
  order from the same generator state (the C side replays CPython's `Random.sample` over
  the generator's own `getrandbits`), for a `random.Random` and a list; anything else goes
  to `rng.sample` itself.
- `new_tasks(...)` are the query's `PendingTask`s, one per link, with every field as the
  dataclass's `__init__` sets it; the C side assigns the same fields without the call.

`sample_py` and `new_tasks_py` are the references, compared with the C side in the tests
(tests/unit/test_fanout.py), and run where it is not built or TAILGATE_PURE_PYTHON is set.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, TypeVar

from gateway.queries import PendingTask, QueryRun
from taskserver.native import require_native

if TYPE_CHECKING:
    from admission.waiting import WaitEstimate
    from gateway.links import TaskLink

__all__ = ["IMPLEMENTATION", "new_tasks", "new_tasks_py", "sample", "sample_py"]

T = TypeVar("T")

try:
    require_native()  # TAILGATE_PURE_PYTHON=1: the Python twins
    from gateway._hotpath import new_tasks as _c_new_tasks
    from gateway._hotpath import sample as _c_sample
except ImportError:  # built at install when a C compiler is there; the Python below otherwise
    _c_new_tasks = _c_sample = None

IMPLEMENTATION: Literal["c", "python"] = "python" if _c_sample is None else "c"
"""Which one runs."""


def sample_py(rng: random.Random, population: Sequence[T], k: int) -> list[T]:
    """k distinct members of `population` drawn at random (the reference: `rng.sample`)."""
    return rng.sample(population, k)


def sample(rng: random.Random, population: Sequence[T], k: int) -> list[T]:
    """`sample_py`, in C for a `random.Random` (not a subclass, whose draws may differ) and
    a list; it raises as `Random.sample` does (ValueError for k outside 0..len)."""
    if _c_sample is not None and type(rng) is random.Random and type(population) is list:
        return _c_sample(rng.getrandbits, population, k)
    return rng.sample(population, k)


_TEMPLATE_FIELDS = ("index", "server_id", "est_wait_ms")
"""The fields set per task; the others are the query's, or their defaults."""
_QUERY_FIELDS = (
    "run",
    "deadline_s",
    "slo_deadline_s",
    "priority",
    "class_name",
    "payload",
    "flow",
    "cost",
)
"""The fields given per query (new_tasks's arguments), in that order."""


def _defaults() -> tuple[tuple[str, ...], tuple[object, ...]]:
    """PendingTask's field names, those set per task first, then the query's, then the
    rest, and the rest's defaults (read off the dataclass, so a field added there with a
    default is built here too; one without a default fails this, at import)."""
    fields = dataclasses.fields(PendingTask)
    rest = [f for f in fields if f.name not in _TEMPLATE_FIELDS + _QUERY_FIELDS]
    names = {f.name for f in fields}
    missing = [n for n in _TEMPLATE_FIELDS + _QUERY_FIELDS if n not in names]
    no_default = [f.name for f in rest if f.default is dataclasses.MISSING]
    if missing or no_default or len(fields) > 32:
        raise TypeError(
            f"PendingTask's fields changed: gateway.fanout builds no {missing or no_default}"
        )
    return (
        _TEMPLATE_FIELDS + _QUERY_FIELDS + tuple(f.name for f in rest),
        tuple(f.default for f in rest),
    )


_NAMES, _REST = _defaults()


def new_tasks_py(
    run: QueryRun,
    links: list[TaskLink],
    deadline_s: float,
    slo_deadline_s: float,
    priority: int,
    class_name: str,
    payload: bytes,
    waits: list[WaitEstimate] | None,
    flow: str,
    cost: float,
) -> list[PendingTask]:
    """The query's task for each link, in order (the reference: a call of the class each)."""
    return [
        PendingTask(
            run,
            i,
            link.server_id,
            deadline_s,
            slo_deadline_s,
            priority,
            class_name,
            payload,
            est_wait_ms=None if waits is None else waits[i].mean_ms,
            flow=flow,
            cost=cost,
        )
        for i, link in enumerate(links)
    ]


def new_tasks(
    run: QueryRun,
    links: list[TaskLink],
    deadline_s: float,
    slo_deadline_s: float,
    priority: int,
    class_name: str,
    payload: bytes,
    waits: list[WaitEstimate] | None,
    flow: str,
    cost: float,
) -> list[PendingTask]:
    """`new_tasks_py`, in C where it is built."""
    if _c_new_tasks is not None and type(links) is list and (waits is None or type(waits) is list):
        template = (
            0,
            None,
            None,
            run,
            deadline_s,
            slo_deadline_s,
            priority,
            class_name,
            payload,
            flow,
            cost,
            *_REST,
        )
        tasks = _c_new_tasks(PendingTask, _NAMES, template, links, waits)
        if tasks is not None:
            return tasks
    return new_tasks_py(
        run, links, deadline_s, slo_deadline_s, priority, class_name, payload, waits, flow, cost
    )
