"""A query's fan-out (gateway.fanout): the C side draws what `random.Random.sample` draws,
from the same generator state, and builds the `PendingTask`s the dataclass builds."""

from __future__ import annotations

import dataclasses
import gc
import random
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from gateway import fanout
from gateway.fanout import new_tasks, new_tasks_py, sample
from gateway.queries import PendingTask, QueryRun

_C = fanout._c_sample is not None
_NOT_C = "gateway._hotpath is not built, or TAILGATE_PURE_PYTHON is set"

# Both branches of Random.sample: a pool of the population (n at most its set size for k),
# and a set of the indices drawn (n above it: k = 10 from 100 and more).
_SHAPES = [(1, 0), (1, 1), (2, 2), (5, 3), (10, 10), (21, 5), (22, 5), (30, 6), (100, 10),
           (100, 100), (1000, 10), (1000, 100), (1000, 1000), (10_000, 100),
           (10_000, 1)]  # fmt: skip


@pytest.mark.parametrize(("n", "k"), _SHAPES)
def test_sample_draws_what_random_sample_draws(n: int, k: int) -> None:
    """The same members in the same order, and the generator left in the same state."""
    population = [f"ts-{i}" for i in range(n)]
    for seed in range(20):
        ours, theirs = random.Random(seed), random.Random(seed)
        for _ in range(3):
            assert sample(ours, population, k) == theirs.sample(population, k)
        assert ours.getstate() == theirs.getstate()


def test_sample_refuses_what_random_sample_refuses() -> None:
    rng = random.Random(1)
    for k in (-1, 4):
        with pytest.raises(ValueError, match="Sample larger than population or is negative"):
            sample(rng, [1, 2, 3], k)
    with pytest.raises(TypeError):
        sample(rng, [1, 2, 3], 1.5)  # type: ignore[arg-type]
    assert sample(rng, [], 0) == []


def test_sample_leaves_other_generators_and_sequences_to_random() -> None:
    """A subclass may draw differently (its own random()), a tuple is not a list: both go
    to rng.sample itself, so the draws are still the generator's."""

    class Counting(random.Random):
        calls = 0

        def sample(self, population: Any, k: int, **kw: Any) -> list[Any]:
            Counting.calls += 1
            return super().sample(population, k, **kw)

    rng = Counting(3)
    assert sample(rng, list(range(50)), 5) == random.Random(3).sample(range(50), 5)
    assert Counting.calls == 1
    assert sample(random.Random(4), tuple(range(50)), 5) == random.Random(4).sample(range(50), 5)


@pytest.mark.skipif(not _C, reason=_NOT_C)
def test_c_sample_keeps_its_references_and_reports_a_failing_generator() -> None:
    """Members drawn or not keep their reference counts; an exception of getrandbits comes
    back as it is, with nothing leaked; a population that shrinks under it is refused."""
    assert fanout._c_sample is not None
    members = [object() for _ in range(40)]
    before = [sys.getrefcount(m) for m in members]
    drawn = fanout._c_sample(random.Random(1).getrandbits, members, 10)
    del drawn
    gc.collect()
    assert [sys.getrefcount(m) for m in members] == before

    calls = 0

    def failing(bits: int) -> int:
        nonlocal calls
        calls += 1
        if calls == 4:
            raise RuntimeError("no entropy")
        return 0

    for population in (members[:10], members):  # the pool branch, then the set branch
        calls = 0
        with pytest.raises(RuntimeError, match="no entropy"):
            fanout._c_sample(failing, population, 6)
    gc.collect()
    assert [sys.getrefcount(m) for m in members] == before

    shrinking = list(range(100))

    def shrink(bits: int) -> int:
        del shrinking[10:]
        return 50  # an index of the 100 there were, past the 10 left

    with pytest.raises(RuntimeError, match="population changed size"):
        fanout._c_sample(shrink, shrinking, 5)


@dataclass
class _Link:
    server_id: str


@dataclass
class _Wait:
    mean_ms: float


def _fields(p: PendingTask) -> dict[str, Any]:
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(PendingTask)}


@pytest.mark.parametrize("with_waits", [False, True])
async def test_new_tasks_are_the_dataclass_s(with_waits: bool) -> None:
    """Every field of every task as the class's own __init__ sets it, and each task its own
    object (a field set on one is not set on another)."""
    run = QueryRun("q-7", 4, 1.5)
    links: list[Any] = [_Link(f"ts-{i}") for i in range(4)]
    waits: Any = [_Wait(0.5 * i) for i in range(4)] if with_waits else None
    args = (run, links, 2.0, 3.0, 2, "gold", b'{"x": 1}', waits, "tenant-a", 0.25)
    ours, theirs = new_tasks(*args), new_tasks_py(*args)
    assert [type(p) for p in ours] == [PendingTask] * 4
    assert [_fields(p) for p in ours] == [_fields(p) for p in theirs]
    assert ours[2].index == 2 and ours[2].server_id == "ts-2" and ours[2].run is run
    assert ours[3].est_wait_ms == (1.5 if with_waits else None)
    ours[0].sent_s = 9.0
    ours[0].retries += 1
    assert ours[1].sent_s == 0.0 and ours[1].retries == 0
    assert new_tasks(run, [], 2.0, 3.0, 2, "gold", b"", None, "", 1.0) == []


@pytest.mark.skipif(not _C, reason=_NOT_C)
async def test_c_new_tasks_refuses_what_it_cannot_build() -> None:
    """Arguments of the wrong shape are a TypeError or ValueError; a type with a
    __post_init__ or fields that are not slots gives None (the caller builds them); a link
    without a server_id raises as getattr does, with nothing half-built returned."""
    c = fanout._c_new_tasks
    assert c is not None
    run = QueryRun("q-1", 2, 0.0)
    template = (0, None, None, run, 1.0, 2.0, 1, "c", b"", "", 1.0, *fanout._REST)
    links: list[Any] = [_Link("a"), _Link("b")]
    with pytest.raises(TypeError):
        c(PendingTask, fanout._NAMES, list(template), links, None)
    with pytest.raises(ValueError, match="differ in length"):
        c(PendingTask, fanout._NAMES, template[:-1], links, None)
    with pytest.raises(ValueError, match="differ in length"):
        c(PendingTask, fanout._NAMES, template, links, [_Wait(1.0)])
    with pytest.raises(AttributeError):
        c(PendingTask, fanout._NAMES, template, [_Link("a"), object()], None)

    @dataclass(slots=True)
    class Checked:
        index: int
        server_id: str
        est_wait_ms: float | None

        def __post_init__(self) -> None:
            pass

    @dataclass
    class Plain:  # fields in a __dict__, not slots
        index: int
        server_id: str
        est_wait_ms: float | None

    names = ("index", "server_id", "est_wait_ms")
    for cls in (Checked, Plain):
        assert c(cls, names, (0, None, None), links, None) is None
    built = c(PendingTask, fanout._NAMES, template, links, None)
    assert [p.server_id for p in built] == ["a", "b"]
