"""A frame of results into its queries (gateway.settle): the C side and its Python twin
change the same queries, return the same counts and make the same calls, in the same
order, on random frames; what the C side does not read it leaves untouched."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from gateway import settle as settle_mod
from gateway.links import TaskReport
from gateway.queries import PendingTask, QueryRun, TaskOutcome
from gateway.settle import LABELS, settle, settle_py
from taskserver.wire import TaskStatus

_C = settle_mod._c_settle is not None
_NOT_C = "gateway._hotpath is not built, or TAILGATE_PURE_PYTHON is set"
_GROUPS = [None, ("gold", "gpu", 3), ("bronze", "gpu", 1), ("gold", "edge", 3)]
_DURATIONS = [0.0, 0.25, 1.5, 7.0, 1e-9, 123.456, 5e6, math.inf, math.nan]


class Log:
    """Metrics, tenants and spans that write down what they are told, in one list; the
    `fail_at`-th call raises."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_at = fail_at

    def _note(self, *call: Any) -> None:
        self.calls.append(call)
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise RuntimeError(f"call {self.fail_at} fails")

    def wait_estimate_error(self, pool: str, actual_ms: float, estimated_ms: float) -> None:
        self._note("wait", pool, actual_ms, estimated_ms)

    def task_dropped(self, pool: str, error: str | None) -> None:
        self._note("dropped", pool, error)

    def note_task(self, flow: str, missed: bool, cls: str) -> None:
        self._note("tenant", flow, type(missed), missed, cls)


class Span:
    def __init__(self, log: Log, name: str) -> None:
        self.log, self.name = log, name

    def end(self, outcome: str, server_id: str, retries: int, **kw: Any) -> None:
        self.log._note("span", self.name, outcome, server_id, retries, sorted(kw.items()))


class World:
    """Queries and one frame of results for them, built the same from the same seed."""

    def __init__(self, seed: int, fail_at: int | None = None) -> None:
        rng = random.Random(seed)
        self.log = Log(fail_at)
        self.runs = []
        for q in range(rng.randint(1, 4)):
            run = QueryRun(f"q-{q}", rng.randint(1, 6), 10.0)
            run.group = rng.choice(_GROUPS)
            self.runs.append(run)
        self.batch: list[tuple[PendingTask, Any]] = []
        for _ in range(rng.randint(0, 12)):
            run = rng.choice(self.runs)
            index = rng.randrange(run.fanout)  # a task met twice: complete() keeps the first
            p = PendingTask(run, index, "ts-1", 11.0, 12.0, 1, rng.choice(["gold", "bronze"]), b"")
            p.sent_s = 10.0 + rng.random() * rng.choice([1e-6, 1e-3, 1.0])
            p.gateway_queue_ms = rng.choice(_DURATIONS[:7])
            p.missed_deadline = rng.choice([None, True, False])
            p.est_wait_ms = rng.choice([None, 0.0, 2.5])
            p.flow = rng.choice(["t1", "t2"])
            p.retries = rng.choice([0, 0, 2])
            p.trace = rng.choice([None, Span(self.log, f"{run.query_id}/{index}")])
            status = TaskStatus(rng.choice([0, 0, 0, *range(len(TaskStatus))]))
            queue = rng.choice(_DURATIONS)
            server = queue + rng.choice(_DURATIONS)
            report = TaskReport(
                status, queue, rng.choice(_DURATIONS), server, rng.random() < 0.3,
                rng.choice([None, b"", b'{"x": 1}']), rng.choice([None, "pard: late at ocr"]),
            )  # fmt: skip
            self.batch.append((p, report))
        self.now = 10.0 + rng.random() * rng.choice([1e-4, 1e-2, 2.0])
        self.central = rng.random() < 0.4
        self.note_tenants = rng.random() < 0.5

    def args(self) -> tuple[Any, ...]:
        return (self.batch, self.now, self.central, self.note_tenants, "ts-1", "gpu", self.log,
                self.log)  # fmt: skip

    def state(self) -> str:
        """Everything the settling may change, as text (NaN equals itself there)."""
        runs = [(r.outcomes, r.remaining, r.failed, r.done.done(), r.t_last) for r in self.runs]
        return repr((runs, self.log.calls))


def _both(
    seed: int, fail_at: int | None = None, inline: bool = True
) -> tuple[Any, Any, World, World]:
    """The Python twin and the C side on equal worlds: what each returned (or raised). With
    `inline`, the C side runs QueryRun.complete itself (settle_mod.RUN_INLINE), as `settle`
    calls it; without, it calls the method."""

    async def run(fn: Callable[..., Any], *extra: Any) -> tuple[Any, World]:
        world = World(seed, fail_at)
        try:
            out: Any = fn(
                *world.args(), LABELS, TaskStatus.OK, TaskStatus.DROPPED, TaskOutcome, *extra
            )
        except RuntimeError as exc:
            out = exc
        return out, world

    py, py_world = asyncio.run(run(settle_py))
    extra = (settle_mod.RUN_INLINE,) if inline else ()
    c, c_world = asyncio.run(run(settle_mod._c_settle, *extra))
    return py, c, py_world, c_world


@pytest.mark.skipif(not _C, reason=_NOT_C)
@pytest.mark.parametrize("inline", [True, False], ids=["complete-in-c", "complete-called"])
def test_c_settles_random_frames_as_its_python_twin(inline: bool) -> None:
    for seed in range(1500):
        py, c, py_world, c_world = _both(seed, inline=inline)
        assert c is not None, seed
        assert repr(c) == repr(py), seed
        assert c_world.state() == py_world.state(), seed
        outcomes = [o for r in c_world.runs for o in r.outcomes if o is not None]
        assert all(type(o) is TaskOutcome for o in outcomes)


@pytest.mark.skipif(not _C, reason=_NOT_C)
@pytest.mark.parametrize("inline", [True, False], ids=["complete-in-c", "complete-called"])
def test_a_callback_that_raises_stops_both_at_the_same_task(inline: bool) -> None:
    raised = 0
    for seed in range(300):
        for fail_at in (1, 2, 5):
            py, c, py_world, c_world = _both(seed, fail_at, inline)
            assert repr(c) == repr(py), (seed, fail_at)
            assert c_world.state() == py_world.state(), (seed, fail_at)
            raised += isinstance(c, RuntimeError)
    assert raised > 100  # the failures were met, not only the frames too short for them


def _declined(world: World, change: Callable[[World], Any]) -> None:
    before = world.state()
    change(world)
    args = world.args()
    c_args = (*args, LABELS, TaskStatus.OK, TaskStatus.DROPPED, TaskOutcome)
    assert settle_mod._c_settle(*c_args) is None
    assert world.state() == before  # nothing of it settled
    if all(len(entry) == 2 for entry in world.batch):
        statuses, *_ = settle(*args)  # the dispatcher then settles it in Python
        assert sum(statuses.values()) == len(world.batch)


def _report(world: World, **fields: Any) -> None:
    p, r = world.batch[-1]
    world.batch[-1] = (p, r._replace(**fields))


def _task(world: World, **fields: Any) -> None:
    p = world.batch[-1][0]
    for name, value in fields.items():
        setattr(p, name, value)


@pytest.mark.skipif(not _C, reason=_NOT_C)
@pytest.mark.parametrize(
    "change",
    [
        lambda w: setattr(w, "now", 11),
        lambda w: _report(w, service_ms=2),
        lambda w: _report(w, queue_ms=True),
        lambda w: w.batch.append(w.batch[-1] + (None,)),
        lambda w: w.batch.append([*w.batch[-1]]),
        lambda w: _task(w, sent_s=10),
        lambda w: (setattr(w, "central", True), _task(w, gateway_queue_ms=0)),
    ],
    ids=[
        "int-clock",
        "int-duration",
        "bool-duration",
        "triple",
        "list-entry",
        "int-sent",
        "int-gateway-queue",
    ],
)
def test_values_the_c_side_does_not_read_leave_the_frame_to_python(
    change: Callable[[World], Any],
) -> None:
    async def go() -> None:
        seed = next(s for s in range(100) if len(World(s).batch) >= 3)
        _declined(World(seed), change)

    asyncio.run(go())


def test_the_frame_counts_by_status_class_and_group() -> None:
    """What the counts mean, on one frame worked by hand (whichever side runs)."""

    async def go() -> None:
        run = QueryRun("q-1", 3, 10.0)
        run.group = ("gold", "gpu", 3)
        tasks = [PendingTask(run, i, "ts-1", 11.0, 12.0, 1, "gold", b"") for i in range(3)]
        for p in tasks:
            p.sent_s = 10.0
        ok = TaskReport(TaskStatus.OK, 1.0, 2.0, 4.0, True, b"1", None)
        late = TaskReport(TaskStatus.DROPPED, 0.5, 0.0, 1.0, False, None, "pard: late at ocr")
        log = Log()
        batch = [(tasks[0], ok), (tasks[1], ok), (tasks[2], late)]
        statuses, post_queue, by_class, by_group = settle(
            batch, 10.010, False, True, "ts-1", "gpu", log, log
        )
        assert statuses == {"ok": 2, "dropped": 1}
        # Round trip 10 ms, server 4 ms: 6 ms of network, half of it on the way back.
        assert post_queue == pytest.approx([3.0 + 3.0, 3.0 + 3.0])
        assert by_class == {"gold": [2, 2]}
        assert by_group == {("gold", "gpu", 3): [3, 4.0, 2]}
        assert [c[0] for c in log.calls] == ["tenant", "tenant", "dropped"]
        assert run.done.done() and run.failed and run.outcomes[0].queue_ms == pytest.approx(4.0)

    asyncio.run(go())


# --- Results to tasks (take): the C side and take_py -------------------------------------


def _items(seed: int) -> tuple[list[Any], dict[str, PendingTask]]:
    """Decoded results and the outstanding tasks of one link: results for tasks outstanding,
    for a stale index of one, for queries that ended, and the same result twice."""
    rng = random.Random(seed)
    run = QueryRun("q", 4, 0.0)
    outstanding = {
        f"q-{q}": PendingTask(run, rng.randrange(4), "ts-1", 1.0, 2.0, 1, "gold", b"")
        for q in range(rng.randint(0, 8))
    }
    items: list[Any] = []
    for _ in range(rng.randint(0, 12)):
        qid = f"q-{rng.randrange(10)}"
        p = outstanding.get(qid)
        index = p.index if p is not None and rng.random() < 0.8 else rng.randrange(4)
        status = TaskStatus(rng.choice([0, 0, *range(len(TaskStatus))]))
        items.append((qid, index, TaskReport(status, 0.0, 0.0, 0.0, False, None, None)))
    return items, outstanding


@pytest.mark.skipif(not _C, reason=_NOT_C)
def test_c_takes_results_as_its_python_twin() -> None:
    async def go() -> None:
        refused = taken = 0
        for seed in range(2000):
            items, outstanding = _items(seed)
            py_left = dict(outstanding)
            py = settle_mod.take_py(items, py_left, TaskStatus.REJECTED)
            c = settle_mod._c_take(items, outstanding, TaskStatus.REJECTED)
            assert c[1] is py[1], seed
            assert [(id(p), r) for p, r in c[0]] == [(id(p), r) for p, r in py[0]], seed
            assert list(outstanding) == list(py_left), seed
            refused += c[1]
            taken += len(c[0])
        assert refused > 100 and taken > 1000  # both kinds of frame were met

    asyncio.run(go())


@pytest.mark.skipif(not _C, reason=_NOT_C)
@pytest.mark.parametrize(
    "bad",
    [("q-1", True, None), ("q-1", 0), ["q-1", 0, (0,)], (b"q-1", 0, (0,)), ("q-1", 0, ())],
    ids=["bool-index", "pair", "list", "bytes-id", "empty-report"],
)
def test_items_the_c_side_does_not_read_leave_the_frame_to_python(bad: Any) -> None:
    async def go() -> None:
        items, outstanding = next(
            (i, o) for i, o in map(_items, range(100)) if o and any(x[0] in o for x in i)
        )
        before = dict(outstanding)
        assert settle_mod._c_take([*items, bad], outstanding, TaskStatus.REJECTED) is None
        assert outstanding == before  # nothing taken

    asyncio.run(go())


@pytest.mark.skipif(not _C, reason=_NOT_C)
def test_an_outcome_type_that_does_more_than_assign_is_built_by_its_own_init() -> None:
    """The C side writes a TaskOutcome's slots itself (its __init__ only assigns them); a
    type with a __post_init__ is called instead."""
    made: list[str] = []

    @dataclasses.dataclass(slots=True)
    class Checked(TaskOutcome):
        def __post_init__(self) -> None:
            made.append(self.status)

    async def go() -> None:
        world = World(next(s for s in range(100) if len(World(s).batch) >= 3))
        out = settle_mod._c_settle(*world.args(), LABELS, TaskStatus.OK, TaskStatus.DROPPED,
                                   Checked)  # fmt: skip
        assert out is not None and len(made) == len(world.batch)
        assert all(type(o) is Checked for r in world.runs for o in r.outcomes if o is not None)

    asyncio.run(go())


@pytest.mark.skipif(not _C, reason=_NOT_C)
def test_complete_runs_in_c_only_for_a_query_run_whose_complete_is_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A subclass, or a QueryRun whose `complete` was replaced, has its method called; a
    run_inline argument of another shape is refused."""
    calls: list[tuple[str, int]] = []

    class Counted(QueryRun):
        __slots__ = ()

        def complete(self, index: int, outcome: TaskOutcome, now: float = 0.0) -> None:
            calls.append(("sub", index))
            super().complete(index, outcome, now)

    async def go(run_type: type[QueryRun]) -> World:
        world = World(next(s for s in range(100) if len(World(s).batch) >= 3))
        for p, _ in world.batch:
            p.run.__class__ = run_type  # the same slots: a class of its own
        out = settle_mod._c_settle(*world.args(), LABELS, TaskStatus.OK, TaskStatus.DROPPED,
                                   TaskOutcome, settle_mod.RUN_INLINE)  # fmt: skip
        assert out is not None
        return world

    world = asyncio.run(go(Counted))
    assert len(calls) == len(world.batch)

    calls.clear()
    original = QueryRun.complete

    def replaced(self: QueryRun, index: int, outcome: TaskOutcome, now: float = 0.0) -> None:
        calls.append(("replaced", index))
        original(self, index, outcome, now)

    monkeypatch.setattr(QueryRun, "complete", replaced)
    world = asyncio.run(go(QueryRun))
    assert [c[0] for c in calls] == ["replaced"] * len(world.batch)

    async def bad() -> None:
        world = World(0)
        with pytest.raises(TypeError, match="run_inline"):
            settle_mod._c_settle(*world.args(), LABELS, TaskStatus.OK, TaskStatus.DROPPED,
                                 TaskOutcome, (QueryRun, original))  # fmt: skip

    asyncio.run(bad())


@pytest.mark.skipif(not _C, reason=_NOT_C)
def test_complete_in_c_judges_the_outcome_by_its_own_status() -> None:
    """`complete` reads `outcome.status`: an outcome type whose __post_init__ rewrites it
    decides the query by what it wrote, in C as in Python."""

    @dataclasses.dataclass(slots=True)
    class AllOk(TaskOutcome):
        def __post_init__(self) -> None:
            self.status = "ok"

    async def go(fn: Callable[..., Any], seed: int, *extra: Any) -> World:
        world = World(seed)
        fn(*world.args(), LABELS, TaskStatus.OK, TaskStatus.DROPPED, AllOk, *extra)
        return world

    failed_anywhere = not_ok_reports = 0
    for seed in range(300):
        py = asyncio.run(go(settle_py, seed))
        c = asyncio.run(go(settle_mod._c_settle, seed, settle_mod.RUN_INLINE))
        assert c.state() == py.state(), seed
        failed_anywhere += any(r.failed for r in c.runs)
        not_ok_reports += sum(r.status != TaskStatus.OK for _, r in c.batch)
    assert failed_anywhere == 0  # no query failed: every outcome said "ok"
    assert not_ok_reports > 100  # though many of their reports did not
