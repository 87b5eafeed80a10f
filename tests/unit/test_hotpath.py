"""Task frames out and result frames in (gateway.hotpath): the C and Python twins agree with
each other and with thriftpy2, and a frame the fast decoder does not take is left whole."""

from __future__ import annotations

import math
import random
import struct
import sys
from typing import Any

import pytest

from gateway import hotpath
from gateway.hotpath import STATUSES, ResultFrames, encode_tasks, encode_tasks_py
from gateway.links import TaskReport
from taskserver.framecheck import WireLimits
from taskserver.native import require_native
from taskserver.wire import (
    MAX_BATCH_BYTES,
    Batcher,
    decode_message,
    encode_message,
    gateway_body_types,
    server_body_types,
    thrift,
)

LIMITS = WireLimits()
IMPLEMENTATIONS = ["python", "c"] if hotpath.IMPLEMENTATION == "c" else ["python"]


def _task_item(rng: random.Random, i: int) -> tuple[Any, ...]:
    payload = rng.choice(
        [None, b"", b'{"service_ms": 1}', bytes(rng.randrange(256) for _ in range(40))]
    )
    return (
        rng.choice([f"gw-1-{i}", f"q-é✓-{i}", ""]),
        rng.randrange(-(2**31), 2**31),
        rng.choice([0.0, -3.5, 12.25, 1e300, math.inf, rng.uniform(-1e4, 1e4)]),
        rng.uniform(-1e4, 1e4),
        rng.randrange(-(2**31), 2**31),
        rng.choice([None, "A", "classé"]),
        payload,
        rng.choice([None, "00-" + "a" * 32 + "-" + "b" * 16 + "-01"]),
        rng.choice([None, "", "k=v"]),
    )


@pytest.mark.parametrize("n", [1, 2, 10, 300])
def test_task_frames_are_byte_for_byte_those_of_thriftpy2(n: int) -> None:
    rng = random.Random(n)
    t = thrift()
    for _ in range(20):
        items = [_task_item(rng, i) for i in range(n)]
        expected = Batcher.submit().encode([t.Task(*item) for item in items])
        assert encode_tasks(items) == expected
        assert encode_tasks_py(items) == expected


def test_big_batches_are_cut_into_frames_as_the_batcher_cuts_them() -> None:
    blob = b"x" * (MAX_BATCH_BYTES // 3)
    items = [(f"q{i}", i, 1.0, 2.0, 0, "A", blob, None, None) for i in range(7)]
    t = thrift()
    expected = Batcher.submit().encode([t.Task(*item) for item in items])
    out = encode_tasks(items)
    assert out == expected
    frames = 0
    pos = 0
    while pos < len(out):
        (size,) = struct.unpack_from("!i", out, pos)
        name, _, _, body = decode_message(out[pos + 4 : pos + 4 + size], server_body_types())
        assert (body.task if name == "submit" else body.tasks[0]) is not None
        frames += 1
        pos += 4 + size
    assert frames > 1


@pytest.mark.parametrize(
    "bad",
    [
        ("q", 2**31, 1.0, 2.0, 0, None, None, None, None),  # task_index beyond i32
        ("q", 1, "soon", 2.0, 0, None, None, None, None),  # a budget that is not a number
        ("q", 1, 1.0, 2.0, 0, None, "text", None, None),  # a payload that is not bytes
    ],
)
def test_a_task_the_c_writer_does_not_take_gets_thriftpy2s_verdict(bad: tuple[Any, ...]) -> None:
    t = thrift()
    try:
        expected: bytes | type[Exception] = Batcher.submit().encode([t.Task(*bad)])
    except Exception as exc:
        expected = type(exc)
    if isinstance(expected, bytes):
        assert encode_tasks([bad]) == expected
    else:
        with pytest.raises(expected):
            encode_tasks([bad])


def _results(rng: random.Random, n: int) -> list[Any]:
    t = thrift()
    out = []
    for i in range(n):
        out.append(
            t.TaskResult(
                rng.choice([f"gw-1-{i}", f"ré-{i}"]),
                rng.randrange(-5, 2**31),
                rng.randrange(len(STATUSES)),
                rng.uniform(0, 50),
                rng.choice([0.0, rng.uniform(0, 1e9)]),
                rng.uniform(50, 1e3),  # server time holds the queue wait
                rng.random() < 0.5,
                rng.choice([None, b"", b'{"ok": 1}']),
                rng.choice([None, "", "boom ✗"]),
            )
        )
    return out


def _general(frame: bytes) -> list[tuple[str, int, TaskReport]]:
    """The frame's results the general way (thriftpy2), as the fast decoder gives them."""
    name, _, _, body = decode_message(frame, gateway_body_types(), LIMITS)
    results = [body.result] if name == "result" else body.results
    return [
        (r.query_id, r.task_index, TaskReport(STATUSES[r.status], r.queue_ms, r.service_ms,
                                              r.server_ms, r.missed_deadline, r.result, r.error))
        for r in results
    ]  # fmt: skip


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("n", [0, 1, 2, 64])
def test_result_frames_decode_as_thriftpy2_reads_them(impl: str, n: int) -> None:
    rng = random.Random(n)
    frames = ResultFrames(LIMITS, TaskReport, implementation=impl)  # type: ignore[arg-type]
    for _ in range(10):
        frame = Batcher.result().encode(_results(rng, n))[4:] if n else _empty_batch()
        got = frames.decode(frame)
        assert got == _general(frame)
        assert all(type(report) is TaskReport for _, _, report in got or [])
        assert all(type(report.status) is type(STATUSES[0]) for _, _, report in got or [])


def _empty_batch() -> bytes:
    body = thrift().TaskSink.result_batch_args(results=[])
    return encode_message("result_batch", 4, 0, body)[4:]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_frames_with_anything_unusual_are_left_to_the_general_decoder(impl: str) -> None:
    t = thrift()
    frames = ResultFrames(LIMITS, TaskReport, implementation=impl)  # type: ignore[arg-type]

    def one(**kw: Any) -> bytes:
        fields = dict(query_id="q", task_index=0, status=0, queue_ms=1.0, service_ms=1.0,
                      server_ms=2.0, missed_deadline=False)  # fmt: skip
        fields.update(kw)
        return Batcher.result().encode([t.TaskResult(**fields)])[4:]

    assert frames.decode(one()) is not None
    for bad in (
        one(queue_ms=-1.0),
        one(queue_ms=3.0),  # a queue wait above the server's whole time (2.0)
        one(server_ms=math.nan),
        one(service_ms=2e9),
        one(status=7),
        one(query_id=None),  # a required field missing
        one(error=b"\xff"),  # thriftpy2 reads a string that is not UTF-8 as bytes
        encode_message("status", 2, 3, t.TaskServer.status_result())[4:],  # a reply
        encode_message("ping", 4, 0, t.TaskServer.ping_args(token="x"))[4:],
    ):
        assert frames.decode(bad) is None
    # A bound of taskserver.framecheck passed: the general decoder refuses the frame.
    big = Batcher.result().encode(_results(random.Random(1), 5))[4:]
    assert ResultFrames(WireLimits(max_container_items=4), TaskReport).decode(big) is None
    assert ResultFrames(WireLimits(max_depth=2), TaskReport).decode(big) is None


def _mutants(rng: random.Random, seeds: list[bytes], n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        b = bytearray(rng.choice(seeds))
        kind = rng.random()
        if kind < 0.5:
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind < 0.75:
            del b[rng.randrange(len(b)) :]
        else:
            pos = rng.randrange(len(b))
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
        out.append(bytes(b))
    return out


def test_fuzzed_frames_get_the_same_answer_from_both_decoders_or_none_from_c() -> None:
    # C takes a subset of what the Python twin takes (a field twice or unknown is left to
    # the general decoder), and where both take a frame they read it the same way.
    rng = random.Random(7)
    seeds = [Batcher.result().encode(_results(rng, n))[4:] for n in (1, 2, 3, 10)]
    py = ResultFrames(LIMITS, TaskReport, implementation="python")
    c = ResultFrames(LIMITS, TaskReport) if hotpath.IMPLEMENTATION == "c" else py
    taken = 0
    for frame in _mutants(rng, seeds, 3000):
        got = c.decode(frame)
        if got is not None:
            taken += 1
            assert got == py.decode(frame)
            # never a result the general way would not read just so
            assert got == _general(frame)
    assert taken > 100  # the mutations leave many frames whole (a duration, an index, ...)


def test_the_c_encoder_and_decoder_are_built_here() -> None:
    # The test command installs the package, which compiles them; they run unless the suite
    # runs on the Python twins (TAILGATE_PURE_PYTHON=1).
    import gateway._hotpath  # noqa: F401

    try:
        require_native()
    except ImportError:
        assert hotpath.IMPLEMENTATION == "python"
    else:
        assert hotpath.IMPLEMENTATION == "c"


@pytest.mark.skipif(hotpath.IMPLEMENTATION != "c", reason="gateway._hotpath is not built")
def test_the_slot_index_maps_ids_as_a_dict_does_through_sets_discards_and_growth() -> None:
    import numpy as np

    from gateway._hotpath import SlotIndex

    rng = random.Random(3)
    pool = [f"srv-{i}" for i in range(400)]
    index, mirror = SlotIndex(), {}
    for step in range(20_000):
        key = rng.choice(pool)
        if rng.random() < 0.4:
            assert index.discard(key) == (mirror.pop(key, None) is not None)
        else:
            slot = rng.randrange(-5, 10_000)
            index.set("".join(key), slot)  # an equal string, often another object
            mirror[key] = slot
        if step % 500 == 0 or step > 19_900:
            assert len(index) == len(mirror)
            ids = [rng.choice(list(mirror)) for _ in range(300)] if mirror else []
            ids += [f"srv-{i}" for i in range(400) if f"srv-{i}" in mirror]  # new objects
            got = np.frombuffer(index.lookup(ids), dtype=np.intp)
            assert got.tolist() == [mirror[i] for i in ids]
            absent = [k for k in pool if k not in mirror]
            for key in absent[:20]:
                with pytest.raises(KeyError, match=key):
                    index.lookup([*ids[:3], key])
    assert index.lookup(()) == b""
    present = next(iter(mirror))
    assert index.lookup((present, 7)) is None  # not a str: for the dict to judge
    assert index.lookup([type("Sub", (str,), {})(present)]) is None
    assert not index.discard(7)
    with pytest.raises(TypeError, match="key: str"):
        index.set(7, 1)
    with pytest.raises(TypeError, match="key: str"):
        index.set(type("Sub", (str,), {})("srv-1"), 1)
    with pytest.raises(TypeError, match="no arguments"):
        SlotIndex({})


@pytest.mark.skipif(hotpath.IMPLEMENTATION != "c", reason="gateway._hotpath is not built")
def test_the_slot_index_holds_its_keys_until_they_are_discarded() -> None:
    from gateway._hotpath import SlotIndex

    index = SlotIndex()
    keys = ["".join(("key-", str(i))) for i in range(50)]  # objects of this test's own
    before = [sys.getrefcount(k) for k in keys]
    for i in range(len(keys)):
        index.set(keys[i], i)
    assert [sys.getrefcount(k) for k in keys] == [n + 1 for n in before]
    newer = "".join(("key-", "7"))
    index.set(newer, 70)  # the newest object is kept, the older one released
    assert sys.getrefcount(keys[7]) == before[7] and sys.getrefcount(newer) == 3
    for i in range(25):
        assert index.discard(keys[i])
    assert [sys.getrefcount(k) for k in keys][:25] == before[:25]
    assert sys.getrefcount(newer) == 2
    del index
    assert [sys.getrefcount(k) for k in keys] == before


def test_the_cdf_books_index_follows_registrations_and_moved_rows() -> None:
    """Servers joining, leaving and rejoining, and rows leaving a shared slot on their
    first refresh: the book's C index (where built) maps each id as its dict does."""
    import numpy as np

    from gateway import cdf

    rng = np.random.default_rng(9)
    book = cdf.CdfBook(window_size=64, refresh_every=8)
    prior = rng.lognormal(0.0, 0.5, 64)  # one prior object: its rows share one slot
    live: set[str] = set()
    moved = 0
    for step in range(3000):
        sid = f"s{int(rng.integers(0, 120))}"
        roll = rng.random()
        if roll < 0.15 and sid in live:
            book.remove_server(sid)
            live.discard(sid)
        elif roll < 0.4:
            book.add_server(sid, prior if rng.random() < 0.7 else rng.lognormal(0, 0.4, 64))
            live.add(sid)
        elif live:
            target = sorted(live)[int(rng.integers(0, len(live)))]
            slot = book._slot_of[target]
            book.observe_many(target, rng.lognormal(0.0, 0.5, 8).tolist())
            moved += book._slot_of[target] != slot
        if step % 100 == 0 and len(live) >= 2:
            ids = ["".join(s) for s in sorted(live)]  # equal strings, other objects
            want = [book._slot_of[s] for s in ids]
            assert book._rows_of(ids).tolist() == want
            if book._index is not None:
                assert len(book._index) == len(live)
                assert np.frombuffer(book._index.lookup(ids), np.intp).tolist() == want
    assert moved > 50  # rows did leave their shared slot


def _log_cdf_matrix(rng: Any, points: int, capacity: int) -> Any:
    """Point-major float32 log F of `capacity` rows over `points` ascending grid points."""
    import numpy as np

    steps = rng.exponential(1.0, (capacity, points)).astype(np.float32)
    log_f = -np.cumsum(steps[:, ::-1], axis=1)[:, ::-1]  # rising to ~0 at the last point
    log_f[rng.random(capacity) < 0.2, -5:] = 0.0  # some rows reach F = 1 early
    return np.ascontiguousarray(log_f.T, dtype=np.float32)


@pytest.mark.skipif(hotpath.IMPLEMENTATION != "c", reason="gateway._hotpath is not built")
def test_grid_crossing_and_probe_agree_bit_for_bit_with_their_python_twins() -> None:
    import numpy as np

    from gateway._hotpath import crossing, probe
    from gateway.cdf import _crossing_py, _probe_py

    rng = np.random.default_rng(11)
    for points, capacity in ((129, 50), (33, 1000), (2, 3)):
        matrix = _log_cdf_matrix(rng, points, capacity)
        for k in (1, 7, 400, 2500):
            rows = rng.integers(0, capacity, k).astype(np.intp)  # repeats count each time
            sums = [_probe_py(matrix, rows, i) for i in range(points)]
            assert sums == sorted(sums)  # the bisection's premise
            for i in range(points):
                assert probe(matrix, rows, i) == sums[i]
            levels = [sums[0] - 1.0, sums[-1] + 1.0, *rng.uniform(sums[0], sums[-1], 20)]
            levels += [sums[points // 2]]  # a level met exactly: the first point at it
            for level in levels:
                i = int(np.searchsorted(np.array(sums), level, side="left"))
                # the index, and the sums at i - 1 and at i where the bisection took them
                level = float(level)
                for got in (crossing(matrix, rows, level), _crossing_py(matrix, rows, level)):
                    assert got[0] == i
                    assert got[1] == sums[i - 1] if i > 0 else math.isnan(got[1])
                    assert got[2] == sums[i] if i < points else math.isnan(got[2])


def test_a_lane_sum_is_the_sum_of_the_rows_values() -> None:
    import numpy as np

    from gateway.cdf import SUM_LANES, _probe_py

    rng = np.random.default_rng(12)
    matrix = _log_cdf_matrix(rng, 3, 200)
    for k in (1, SUM_LANES - 1, SUM_LANES, SUM_LANES + 1, 3 * SUM_LANES + 5, 1000):
        rows = rng.integers(0, 200, k).astype(np.intp)
        for point in range(3):
            exact = math.fsum(matrix[point, rows].astype(np.float64).tolist())
            assert _probe_py(matrix, rows, point) == pytest.approx(exact, rel=1e-13, abs=1e-300)
    # -0.0 is the identity the lanes start from: a sum of signed zeros keeps its sign.
    zeros = np.full((1, 4), -0.0, dtype=np.float32)
    assert math.copysign(1.0, _probe_py(zeros, np.array([0, 3, 1], dtype=np.intp), 0)) == -1.0


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_the_grid_search_of_a_solve_agrees_with_its_parts(impl: str) -> None:
    """search = crossing over the coarse points, then over the cell's block; the least
    threshold; None for one row however often repeated. C and Python to the bit."""
    import numpy as np

    from gateway import cdf

    rng = np.random.default_rng(13)
    cells, steps, capacity = 16, 5, 300
    fine = _log_cdf_matrix(rng, cells * (steps - 1) + 1, capacity)
    coarse = np.ascontiguousarray(fine[:: steps - 1])
    index = np.arange(cells)[:, None] * (steps - 1) + np.arange(steps)
    blocks = np.ascontiguousarray(fine[index])
    threshold = rng.uniform(1.0, 9.0, capacity + 3)
    search = cdf._search_py if impl == "python" else cdf._c_search
    seen = set()
    for k in (2, 9, 64, 1000):
        rows = rng.integers(0, capacity, k).astype(np.intp)
        sums = [cdf._probe_py(coarse, rows, i) for i in range(cells + 1)]
        levels = [sums[0] - 1.0, sums[-1] + 1.0, sums[3], *rng.uniform(sums[0], sums[-1], 30)]
        for level in map(float, levels):
            got = search(coarse, blocks, rows, level, threshold)
            want = cdf._search_py(coarse, blocks, rows, level, threshold)
            assert got is not None and want is not None
            pairs = zip(got, want, strict=True)
            assert all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in pairs)
            cell, step, below, at, least = got
            assert cell == cdf._crossing_py(coarse, rows, level)[0]
            assert least == threshold[rows].min()
            if 1 <= cell <= cells:
                assert (step, below, at) == cdf._crossing_py(blocks[cell - 1], rows, level)
                seen.add("inside")
            else:
                assert step == -1 and math.isnan(below) and math.isnan(at)
                seen.add("outside")
    assert seen == {"inside", "outside"}
    one = np.full(50, 7, dtype=np.intp)
    assert search(coarse, blocks, one, float(sums[3]), threshold) is None
    threshold[9] = math.nan  # numpy's min: a NaN among them is the minimum
    least = search(coarse, blocks, np.array([2, 9, 4], dtype=np.intp), -1.0, threshold)[4]
    assert math.isnan(least)
    with pytest.raises(ValueError, match="rows is empty"):
        search(coarse, blocks, np.array([], dtype=np.intp), -1.0, threshold)
    with pytest.raises(IndexError, match=r"rows\[1\] = 300 is outside"):
        search(coarse, blocks, np.array([0, 300], dtype=np.intp), -1.0, threshold)
    if impl == "c":  # the C side reads raw buffers: it checks their shapes
        rows = np.array([0, 1], dtype=np.intp)
        with pytest.raises(TypeError, match="blocks: a C-contiguous float32"):
            search(coarse, blocks[1:], rows, -1.0, threshold)
        with pytest.raises(TypeError, match="blocks: a C-contiguous float32"):
            search(coarse, blocks.astype(np.float64), rows, -1.0, threshold)
        with pytest.raises(TypeError, match="threshold: a 1-D float64"):
            search(coarse, blocks, rows, -1.0, threshold[: capacity - 1])
        with pytest.raises(TypeError, match="threshold: a 1-D float64"):
            search(coarse, blocks, rows, -1.0, threshold.astype(np.float32))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_grid_search_refuses_what_it_cannot_read(impl: str) -> None:
    import numpy as np

    from gateway import cdf

    if impl == "c":
        from gateway._hotpath import crossing, probe
    else:
        crossing, probe = cdf._crossing_py, cdf._probe_py
    matrix = np.zeros((4, 10), dtype=np.float32)
    rows = np.array([0, 9], dtype=np.intp)
    with pytest.raises(IndexError, match=r"rows\[1\] = 10 is outside \[0, 10\)"):
        crossing(matrix, np.array([0, 10], dtype=np.intp), -1.0)
    with pytest.raises(IndexError, match=r"rows\[0\] = -1 is outside"):
        probe(matrix, np.array([-1], dtype=np.intp), 0)
    with pytest.raises(IndexError, match=r"point 4 is outside \[0, 4\)"):
        probe(matrix, rows, 4)
    assert crossing(matrix, rows, -1.0)[0] == 0 and crossing(matrix, rows, 1.0)[0] == 4
    if impl == "c":  # the C side reads raw buffers: it checks what they hold
        with pytest.raises(TypeError, match="2-D float32"):
            crossing(matrix.astype(np.float64), rows, -1.0)
        with pytest.raises(TypeError, match="2-D float32"):
            crossing(matrix[0], rows, -1.0)
        with pytest.raises((TypeError, ValueError, BufferError)):
            crossing(matrix[:, ::2], rows, -1.0)  # not contiguous
        with pytest.raises(TypeError, match="native intp"):
            crossing(matrix, rows.astype(np.int32), -1.0)


def test_the_cdf_book_solves_the_same_with_the_c_lookup_and_search_or_their_twins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import numpy as np

    from gateway import cdf

    rng = np.random.default_rng(5)
    book = cdf.CdfBook(window_size=512)
    for i in range(300):
        book.add_server(f"s{i}", rng.lognormal(rng.uniform(-1, 1), 0.5, 512))
    ks = (2, 20, 100, 300, 1000)  # repeats included: choices with replacement
    picks = [[f"s{j}" for j in rng.choice(300, k)] for k in ks for _ in range(4)]
    first = [book.solve(p, 99.0) for p in picks]
    searches = [
        (cdf._crossing_py, cdf._probe_py, cdf._search_py),
        (cdf._crossing, cdf._probe, cdf._search),
    ]
    index = book._index
    for lookup in (index, None):
        for crossing, probe, search in searches:
            monkeypatch.setattr(book, "_index", lookup)
            monkeypatch.setattr(cdf, "_crossing", crossing)
            monkeypatch.setattr(cdf, "_probe", probe)
            monkeypatch.setattr(cdf, "_search", search)
            assert [book.solve(p, 99.0) for p in picks] == first
            with pytest.raises(KeyError, match="unknown server id 'x'"):
                book.solve(["s1"] * 30 + ["x"], 99.0)
