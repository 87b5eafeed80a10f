"""Task frames out and result frames in (gateway.hotpath): the C and Python twins agree with
each other and with thriftpy2, and a frame the fast decoder does not take is left whole."""

from __future__ import annotations

import math
import random
import struct
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
def test_slots_of_maps_ids_as_the_dict_does() -> None:
    import numpy as np

    from gateway._hotpath import slots_of

    rng = random.Random(3)
    mapping = {f"srv-{i}": rng.randrange(10_000) for i in range(500)}
    ids = [rng.choice(list(mapping)) for _ in range(2000)]
    got = np.frombuffer(slots_of(mapping, ids), dtype=np.intp)
    assert got.tolist() == [mapping[i] for i in ids]
    assert slots_of(mapping, ()) == b""
    with pytest.raises(KeyError, match="nope"):
        slots_of(mapping, [*ids[:5], "nope"])


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
    searches = [(cdf._crossing_py, cdf._probe_py), (cdf._crossing, cdf._probe)]
    for lookup in (cdf._slots_of, None):
        for crossing, probe in searches:
            monkeypatch.setattr(cdf, "_slots_of", lookup)
            monkeypatch.setattr(cdf, "_crossing", crossing)
            monkeypatch.setattr(cdf, "_probe", probe)
            assert [book.solve(p, 99.0) for p in picks] == first
            with pytest.raises(KeyError, match="unknown server id 'x'"):
                book.solve(["s1"] * 30 + ["x"], 99.0)
