"""The bounds check of a Thrift frame: the attacks it refuses, and its C and Python walks agree."""

from __future__ import annotations

import random
import struct

import pytest

from taskserver import framecheck
from taskserver.framecheck import WireLimits, check_frame, check_frame_py
from taskserver.native import require_native
from taskserver.wire import (
    ONEWAY,
    Batcher,
    ProtocolViolation,
    ThriftConnection,
    decode_message,
    encode_message,
    gateway_body_types,
    server_body_types,
    thrift,
)

LIMITS = WireLimits()
# Wire types: 2 bool, 3 byte, 4 double, 6 i16, 8 i32, 10 i64, 11 string, 12 struct, 13 map,
# 14 set, 15 list.


def _i32(v: int) -> bytes:
    return struct.pack("!i", v)


def _head(name: bytes, mtype: int = ONEWAY) -> bytes:
    return struct.pack("!I", 0x80010000 | mtype) + _i32(len(name)) + name + _i32(0)


def _field(ttype: int, fid: int) -> bytes:
    return bytes([ttype]) + struct.pack("!h", fid)


def _tasks(n: int) -> list:
    t = thrift()
    return [t.Task(f"gw-1-q{i}", i, 12.5, 99.0, 1, "A", b'{"service_ms": 1}') for i in range(n)]


def _both(frame: bytes, limits: WireLimits = LIMITS) -> tuple[str, str] | None:
    """The verdict, checked to be the same from both walks."""
    py = check_frame_py(frame, limits)
    assert check_frame(frame, limits) == py
    return py


# The attacks reproduced from the field: each frame is a few dozen bytes.
ATTACKS = {
    # submit_batch declaring a list<Task> of 2**31 - 1 elements: 25 bytes of message.
    "list of 2**31-1 tasks": _head(b"submit_batch") + _field(15, 1) + bytes([12]) + _i32(2**31 - 1),
    # a list of 1,000 tasks in a frame that holds none of them
    "list beyond the frame": _head(b"submit_batch") + _field(15, 1) + bytes([12]) + _i32(1000),
    # a string of 10**9 bytes
    "string of 1e9 bytes": _head(b"ping", 1) + _field(11, 1) + _i32(10**9) + b"x",
    "negative string length": _head(b"ping", 1) + _field(11, 1) + _i32(-5) + b"\0",
    # sets and maps of zero-width types: thriftpy2 skips those in zero bytes, for ever
    "set of void": _head(b"submit") + _field(14, 9) + bytes([1]) + _i32(2**31 - 1) + b"\0",
    "map of void": _head(b"submit") + _field(13, 9) + bytes([1, 1]) + _i32(2**31 - 1) + b"\0",
    "map beyond the frame": _head(b"submit") + _field(13, 9) + bytes([8, 8]) + _i32(10**6),
    "unknown field type": _head(b"submit") + _field(9, 1) + b"\0" * 8,
    "deep nesting": _head(b"submit") + (_field(12, 1)) * 40 + b"\0" * 41,
    "not strict binary": _i32(4) + b"ping" + bytes([1]) + _i32(0) + b"\0",
    "name beyond the frame": struct.pack("!I", 0x80010001) + _i32(10**6) + b"ping",
    "cut short": _head(b"ping", 1) + _field(11, 1) + _i32(4) + b"ab",
    "trailing bytes": _head(b"ping", 1) + b"\0" + b"junk",
}
REASONS = {
    "list of 2**31-1 tasks": "container_length",
    "list beyond the frame": "container_length",
    "string of 1e9 bytes": "string_length",
    "negative string length": "string_length",
    "set of void": "type",
    "map of void": "type",
    "map beyond the frame": "container_length",
    "unknown field type": "type",
    "deep nesting": "depth",
    "not strict binary": "header",
    "name beyond the frame": "header",
    "cut short": "string_length",
    "trailing bytes": "trailing",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_each_attack_is_refused_before_decoding(name: str) -> None:
    verdict = _both(ATTACKS[name])
    assert verdict is not None and verdict[0] == REASONS[name], verdict
    with pytest.raises(ProtocolViolation) as exc:
        decode_message(ATTACKS[name], server_body_types())
    assert exc.value.reason == REASONS[name]


def test_the_25_byte_frame_names_its_declared_count() -> None:
    frame = ATTACKS["list of 2**31-1 tasks"]
    assert len(frame) == 4 + 4 + 12 + 4 + 3 + 1 + 4  # header, name, seqid, field, list head
    assert _both(frame) == (
        "container_length",
        "count 2147483647 at byte 27 exceeds the limit 1048576",
    )
    # Under the configured maximum, the frame's own size still refuses it.
    roomy = WireLimits(max_container_items=2**31 - 1)
    assert _both(frame, roomy) == (
        "container_length",
        "count 2147483647 at byte 27 needs at least 2147483647 bytes, 0 left in the frame",
    )


def test_our_own_messages_pass() -> None:
    t = thrift()
    svc, sink = t.TaskServer, t.TaskSink
    frames = [
        Batcher.submit().encode(_tasks(1)),
        Batcher.submit().encode(_tasks(50)),
        Batcher.result().encode(
            [t.TaskResult(f"q{i}", i, 0, 0.1, 0.2, 0.3, False, b"{}", None) for i in range(7)]
        ),
        encode_message("status", 1, 3, svc.status_args(claim=t.OwnerClaim("gw", 3000.0, b"p"))),
        encode_message("cancel", ONEWAY, 0, svc.cancel_args(query_id="q1")),
        encode_message("result", ONEWAY, 0, sink.result_args(result=t.TaskResult("q", 0, 1))),
    ]
    for frame in frames:
        assert _both(frame[4:]) is None
        decode_message(frame[4:], {**server_body_types(), **gateway_body_types()})


def test_limits_below_the_frame_size_are_enforced() -> None:
    frame = Batcher.submit().encode(_tasks(10))[4:]
    assert _both(frame, WireLimits(max_container_items=10)) is None
    assert _both(frame, WireLimits(max_container_items=9))[0] == "container_length"
    assert _both(frame, WireLimits(max_string_bytes=16))[0] == "string_length"
    assert _both(frame, WireLimits(max_depth=2))[0] == "depth"  # message, list, task
    assert _both(frame, WireLimits(max_depth=3)) is None


@pytest.mark.parametrize("bad", [0, -1, 1.5, None])
def test_limits_must_be_positive_integers(bad: object) -> None:
    with pytest.raises(ValueError, match="max_depth: must be a positive integer"):
        WireLimits(max_depth=bad)  # type: ignore[arg-type]


def test_the_c_walk_is_built_here() -> None:
    # The test command installs the package, which compiles it: a missing compiler would
    # leave every frame to the Python walk, several times slower. It runs unless the suite
    # runs on the Python twins (TAILGATE_PURE_PYTHON=1).
    import taskserver._framecheck  # noqa: F401

    assert framecheck.IMPLEMENTATION == ("python" if _pure_python() else "c")


def _pure_python() -> bool:
    try:
        require_native()
    except ImportError:
        return True
    return False


def _mutants(rng: random.Random, seeds: list[bytes], n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        b = bytearray(rng.choice(seeds))
        kind = rng.random()
        if kind < 0.4:  # flip a few bytes
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind < 0.6:  # write a large or negative length somewhere
            at = rng.randrange(max(len(b) - 4, 1))
            b[at : at + 4] = _i32(rng.choice([-1, 2**31 - 1, 10**6, len(b), 0x7F]))
        elif kind < 0.8:  # cut it short or pad it
            b = b[: rng.randrange(len(b))] if rng.random() < 0.5 else b + rng.randbytes(3)
        else:  # splice two messages
            other = rng.choice(seeds)
            b = b[: rng.randrange(len(b))] + other[rng.randrange(len(other)) :]
        out.append(bytes(b))
    return out


def test_the_c_and_python_walks_agree_on_fuzzed_frames() -> None:
    rng = random.Random(20261125)
    seeds = [Batcher.submit().encode(_tasks(k))[4:] for k in (1, 3)] + list(ATTACKS.values())
    refused = 0
    for frame in _mutants(rng, seeds, 20_000):
        verdict = _both(frame)
        if verdict is None:
            # A frame that passes decodes, and decodes within the frame.
            try:
                decode_message(frame, server_body_types())
            except ProtocolViolation as exc:
                assert exc.reason in ("unexpected_message", "undecodable")
        else:
            refused += 1
    assert 0.3 < refused / 20_000 < 1.0  # the mutants exercise both verdicts


class _Transport:
    def __init__(self) -> None:
        self.aborted = False

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.9", 4242) if name == "peername" else None

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        pass


def test_a_connection_closes_on_a_bad_frame_and_reports_it_once() -> None:
    got: list[str] = []
    seen: list[tuple[str, str]] = []
    conn = ThriftConnection(
        server_body_types(),
        lambda n, m, s, b: got.append(n),
        on_violation=lambda v, peer: seen.append((v.reason, peer)),
    )
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    good = Batcher.submit().encode(_tasks(1))
    bad = ATTACKS["list of 2**31-1 tasks"]
    conn.data_received(good + _i32(len(bad)) + bad + good)
    assert got == ["submit"]  # nothing after the bad frame is read
    assert transport.aborted and seen == [("container_length", "127.0.0.9:4242")]
    assert conn.violation is not None and conn.violation.reason == "container_length"


def test_a_frame_length_out_of_bounds_closes_the_connection() -> None:
    seen: list[str] = []
    conn = ThriftConnection(
        server_body_types(),
        lambda *a: None,
        limits=WireLimits(max_frame_bytes=1024),
        on_violation=lambda v, peer: seen.append(str(v)),
    )
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    conn.data_received(_i32(1025))
    assert seen == ["frame_length: 1025 bytes (1..1024 allowed)"]


def test_the_frame_bound_is_configured_on_both_sides() -> None:
    from gateway.config import GatewayConfig
    from taskserver.config import TaskServerConfig
    from taskserver.server import build_service

    svc = build_service(TaskServerConfig(max_frame_bytes=4096))
    conn = svc.protocol_factory()
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(_i32(5000) + b"\0" * 16)
    assert transport.aborted and svc.violations == 1
    assert conn.violation is not None and conn.violation.reason == "frame_length"
    assert WireLimits.for_frames_of(4096).max_string_bytes == 4096
    with pytest.raises(ValueError, match=r"max_frame_bytes: must be 1024\.\.2\*\*30, got 10"):
        GatewayConfig(max_frame_bytes=10)


def test_a_huge_trace_context_is_refused_by_both_walks() -> None:
    # A submit whose Task declares a traceparent (field 8) of 2**31 - 1 bytes: thriftpy2
    # would allocate it before reading; both walks refuse it by the frame's size, and a
    # declared length beyond the configured string limit by that limit.
    t = thrift()
    task = t.Task("gw-1-q1", 0, 12.5, 99.0, 1, "A", b"{}")
    body = Batcher.submit().encode([task])[4:]
    assert body.endswith(b"\0\0")  # the Task's stop byte, then the args' stop byte
    for declared in (2**31 - 1, 10**6):
        frame = body[:-2] + _field(11, 8) + _i32(declared) + b"00-" + b"\0\0"
        verdict = _both(frame)
        assert verdict is not None and verdict[0] == "string_length", verdict
        with pytest.raises(ProtocolViolation):
            decode_message(frame, server_body_types())
    over_limit = body[:-2] + _field(11, 9) + _i32(600) + b"k=v" * 200 + b"\0\0"
    assert _both(over_limit) is None  # inside the frame and the limits: it decodes
    assert _both(over_limit, WireLimits(max_string_bytes=512)) == (
        "string_length",
        f"length 600 at byte {len(body) - 2 + 3} exceeds the limit 512",
    )
    # A task that carries its trace context as the gateway sends it passes and decodes.
    traced = t.Task(
        "gw-1-q1", 0, 12.5, 99.0, 1, "A", b"{}", "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    )
    frame = Batcher.submit().encode([traced])[4:]
    assert _both(frame) is None
    _, _, _, args = decode_message(frame, server_body_types())
    assert args.task.traceparent == traced.traceparent
