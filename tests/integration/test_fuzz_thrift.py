"""Every Thrift port under hostile framing and an idle flood, with a real gateway's link on it.

A task server and an edge agent (each a real process under a 1 GiB address-space limit)
are registered with a real gateway; then each port gets, on connections of their own:
lengths no frame may have (0, negative, just above ``max_frame_bytes``, up to 2**31 - 1),
frames claiming up to ``max_frame_bytes`` that stop short, valid frames with a method
name it does not serve or a message type it does not take, valid messages whose fields
have other wire types, and random bytes; then thousands of idle connections and
half-sent frames, held open. The process must never crash, never hold memory for what a
frame claims, close what breaks the protocol (a counted violation, a rate-limited log
line), and keep answering: the gateway's queries through its link, and a fresh client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import resource
import struct
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from loadtests.fuzz_wire import Target, rss_kib, start_target
from taskserver.framecheck import DEFAULT_MAX_FRAME_BYTES
from taskserver.wire import (
    CALL,
    EXCEPTION,
    ONEWAY,
    REPLY,
    Batcher,
    ThriftConnection,
    encode_message,
    gateway_body_types,
    thrift,
)
from tests.integration.conftest import wait_until
from tests.integration.harness import Proc, start_gateway

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AS_LIMIT = 1 << 30
TOKEN = "fuzz-thrift-token"
MAX_FRAME = DEFAULT_MAX_FRAME_BYTES
HOST = "127.0.0.1"
_I32 = struct.Struct("!i")
SEED = 22

INPUTS_PER_KIND = 2_000
"""Hostile connections of each of the five kinds: 10,000 inputs per port."""
CONCURRENT = 64
"""Hostile connections open at once."""
IDLE = 2_000
"""Connections held open with nothing sent (fewer if the descriptor limit is low)."""
HALF_FRAMES = 500
"""Connections held open after the first 100 bytes of a frame claiming MAX_FRAME."""
RSS_BOUND_KIB = 24 * 1024
"""Growth allowed while the idle flood is held (~2 KiB a connection) and after it; the
half frames alone claim 4 GiB, above the process's address-space limit."""


# -- inputs -------------------------------------------------------------------------------


def _frame(msg: bytes) -> bytes:
    return _I32.pack(len(msg)) + msg


def _head(name: bytes, mtype: int, seqid: int = 1) -> bytes:
    return struct.pack("!I", 0x80010000 | mtype) + _I32.pack(len(name)) + name + _I32.pack(seqid)


class Inputs:
    """Seeded hostile inputs of each kind, as the bytes one connection writes."""

    def __init__(self, seed: int, kind: str) -> None:
        self.rng = random.Random(seed)
        self.kind = kind
        t = thrift()
        self.valid = [
            encode_message("ping", CALL, 1, t.TaskServer.ping_args(token="p")),
            encode_message("status", CALL, 2, t.TaskServer.status_args()),
            encode_message("pipeline_state", CALL, 3, t.TaskServer.pipeline_state_args()),
            Batcher.submit().encode([self._task(i) for i in range(3)]),
            Batcher.submit().encode([self._task(7)]),
        ]

    def _task(self, i: int) -> Any:
        payload = b'{"op": "status"}' if self.kind == "edge-agent" else b'{"service_ms": 1}'
        return thrift().Task(f"fz-{i}", i, 50.0, 500.0, 0, "A", payload)

    def bad_length(self) -> tuple[bytes, bool]:
        """A length prefix no frame may have, then a little of anything: refused at once."""
        rng = self.rng
        size = rng.choice(
            [0, -1, -(2**31), MAX_FRAME + 1, 2**31 - 1, rng.randint(MAX_FRAME + 1, 2**31 - 1)]
        )
        return _I32.pack(size) + rng.randbytes(rng.randint(0, 64)), True

    def truncated(self) -> tuple[bytes, bool]:
        """A frame cut short: a valid one, or a claim of up to MAX_FRAME, then the end."""
        rng = self.rng
        if rng.random() < 0.5:
            frame = rng.choice(self.valid)
            return frame[: rng.randint(1, len(frame) - 1)], False
        claim = _I32.pack(rng.randint(1024, MAX_FRAME))
        return claim + rng.randbytes(rng.randint(0, 2048)), False

    def wrong_method(self) -> tuple[bytes, bool]:
        """A valid frame of a method or a message type this port does not take: refused,
        but for an EXCEPTION message, which a connection takes as the answer to a call of
        its own (none is outstanding: it is dropped)."""
        rng = self.rng
        body = self.valid[rng.randrange(len(self.valid))][4:]
        name_len = _I32.unpack_from(body, 4)[0]
        rest = body[8 + name_len :]  # seqid and the arguments
        if rng.random() < 0.6:
            names = [b"", b"x", b"result", b"result_batch", b"Submit", b"submit\x00", b"\xff"]
            name = rng.choice([*names, rng.randbytes(rng.randint(1, 40))])
            mtype = rng.choice([CALL, ONEWAY])
        else:  # a known name sent as a reply, an exception or an unknown message type
            name = rng.choice([b"ping", b"status", b"submit", b"cancel"])
            mtype = rng.choice([REPLY, EXCEPTION, 0, 5, 127])
        version = struct.pack("!I", 0x80010000 | mtype)
        return _frame(version + _I32.pack(len(name)) + name + rest), mtype != EXCEPTION

    def wrong_types(self) -> tuple[bytes, bool]:
        """A valid message whose fields are re-typed on the wire (the bytes left as they are,
        or re-encoded as that type)."""
        rng = self.rng
        if rng.random() < 0.5:  # flip the type byte of the first field
            frame = bytearray(rng.choice(self.valid))
            name_len = _I32.unpack_from(frame, 8)[0]
            at = 4 + 12 + name_len  # length, version, name length, name, seqid
            if at < len(frame):
                frame[at] = rng.choice([1, 2, 3, 4, 6, 8, 10, 11, 12, 13, 14, 15, 16, 99])
            return bytes(frame), False
        name = rng.choice([b"ping", b"status", b"submit", b"submit_batch", b"cancel"])
        mtype = ONEWAY if name in (b"submit", b"submit_batch", b"cancel") else CALL
        value = rng.choice(
            [
                b"\x08\x00\x01" + _I32.pack(7),  # i32 where a string or struct goes
                b"\x0b\x00\x01" + _I32.pack(3) + b"abc",  # a string
                b"\x04\x00\x01" + struct.pack("!d", float("nan")),  # a double
                b"\x0f\x00\x01\x08" + _I32.pack(2) + _I32.pack(1) + _I32.pack(2),  # list<i32>
                b"\x0c\x00\x01\x08\x00\x01" + _I32.pack(5) + b"\x00",  # struct of i32 query_id
                b"\x0d\x00\x01\x0b\x0b" + _I32.pack(0),  # an empty map<string,string>
            ]
        )
        return _frame(_head(name, mtype) + value + b"\x00"), False

    def garbage(self) -> tuple[bytes, bool]:
        rng = self.rng
        if rng.random() < 0.2:
            return rng.choice(
                [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x02\x00"]
            ), False
        return rng.randbytes(rng.randint(1, 512)), False

    def half_frame(self) -> bytes:
        return _I32.pack(MAX_FRAME) + b"\x80\x01\x00\x04" + self.rng.randbytes(96)


KINDS = ("bad_length", "truncated", "wrong_method", "wrong_types", "garbage")


# -- connections ---------------------------------------------------------------------------


class _Peer(asyncio.Protocol):
    """A client connection that counts what comes back and notices the server's close."""

    def __init__(self) -> None:
        self.closed = asyncio.get_running_loop().create_future()
        self.received = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received += len(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def _open(port: int) -> _Peer:
    _, peer = await asyncio.get_running_loop().create_connection(_Peer, HOST, port)
    return peer


@dataclass
class Tally:
    """What the port did with the hostile inputs."""

    sent: Counter[str] = field(default_factory=Counter)
    must_close: Counter[str] = field(default_factory=Counter)
    closed_by_server: Counter[str] = field(default_factory=Counter)


async def _hostile(port: int, kind: str, data: bytes, must_close: bool, tally: Tally) -> None:
    """Write one input on a connection of its own. One the server must refuse: wait (2 s
    at most) for it to close the connection. Any other: close it once written (the server
    reads the input, then the end of the connection, mid-frame or not)."""
    peer = await _open(port)
    assert peer.transport is not None
    peer.transport.write(data)
    tally.sent[kind] += 1
    if must_close:
        tally.must_close[kind] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(peer.closed), 2.0)
        if peer.closed.done():
            tally.closed_by_server[kind] += 1
        peer.transport.abort()
    else:
        peer.transport.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(peer.closed), 2.0)


async def _status(port: int) -> Any:
    """A ServerStatus through a fresh, well-behaved connection."""
    loop = asyncio.get_running_loop()
    _, conn = await asyncio.wait_for(
        loop.create_connection(
            lambda: ThriftConnection(gateway_body_types(), lambda *a: None), HOST, port
        ),
        2.0,
    )
    try:
        return await conn.call("status", thrift().TaskServer.status_args(), 2.0)
    finally:
        conn.close()


# -- the processes ---------------------------------------------------------------------------


@dataclass
class Served:
    """A fuzzed target, registered with a real gateway."""

    target: Target
    gateway: Proc
    server_id: str
    query: dict[str, Any]


@pytest.fixture
async def served(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Served, aiohttp.ClientSession]]:
    kind = request.param
    target = start_target(kind, tmp_path, as_limit_bytes=AS_LIMIT, token=TOKEN)
    gw: Proc | None = None
    try:
        gw = start_gateway(None, env={"TAILGATE_AGENT_TOKEN": TOKEN})
        server_id, pool = ("fuzz-ts", "default") if kind == "taskserver" else ("fuzz-pi", "edge")
        task = {"service_ms": 1} if kind == "taskserver" else {"op": "status"}
        query = {"class": "C", "targets": {"servers": [server_id]}, "task": task}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            body = {"id": server_id, "address": f"{HOST}:{target.port}", "pool": pool}
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with http.post(gw.url + "/v1/servers", json=body, headers=headers) as r:
                assert r.status == 201, await r.text()
            await wait_until(lambda s: s["state"] == "up", http, gw, server_id)
            yield Served(target, gw, server_id, query), http
    finally:
        if gw is not None:
            gw.stop()
        target.stop()


async def _query_ok(http: aiohttp.ClientSession, s: Served) -> None:
    async with http.post(s.gateway.url + "/v1/queries", json=s.query) as r:
        answer = await r.json()
        assert r.status == 200 and answer["tasks"][0]["status"] == "ok", answer


def _idle_count() -> int:
    """IDLE, or what the descriptor limit leaves room for (this process and the server each
    hold one descriptor per connection)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(0, min(IDLE, soft - HALF_FRAMES - 256))


@pytest.mark.parametrize("served", ["taskserver", "edge-agent"], indirect=True)
async def test_a_thrift_port_survives_hostile_framing_and_an_idle_flood(
    served: tuple[Served, aiohttp.ClientSession],
) -> None:
    s, http = served
    target, port = s.target, s.target.port
    await _query_ok(http, s)
    rss0 = rss_kib(target.popen.pid)
    inputs = Inputs(SEED, target.kind)
    tally = Tally()
    t0 = time.monotonic()

    # 1. Five kinds of hostile input, 2,000 each, interleaved, 64 connections at a time.
    order = [k for k in KINDS for _ in range(INPUTS_PER_KIND)]
    inputs.rng.shuffle(order)
    for start in range(0, len(order), CONCURRENT):
        batch = order[start : start + CONCURRENT]
        await asyncio.gather(*(_hostile(port, k, *getattr(inputs, k)(), tally) for k in batch))
        if start % 2_000 == 0:
            assert target.alive(), target.log()[-2000:]
            await _query_ok(http, s)  # the gateway's own link still serves
    hostile_s = time.monotonic() - t0
    assert sum(tally.sent.values()) == len(KINDS) * INPUTS_PER_KIND
    assert tally.must_close["bad_length"] == INPUTS_PER_KIND
    assert tally.closed_by_server == tally.must_close  # refused: closed by the server
    rss_hostile = rss_kib(target.popen.pid)

    # 2. Thousands of idle connections and half-sent frames claiming MAX_FRAME, held open.
    idle: list[_Peer] = []
    try:
        for start in range(0, _idle_count(), 200):
            n = min(200, _idle_count() - start)
            idle += await asyncio.gather(*(_open(port) for _ in range(n)))
        halves = await asyncio.gather(*(_open(port) for _ in range(HALF_FRAMES)))
        for peer in halves:
            assert peer.transport is not None
            peer.transport.write(inputs.half_frame())
        idle += halves
        await asyncio.sleep(0.5)
        assert target.alive(), target.log()[-2000:]
        held_rss = rss_kib(target.popen.pid)
        for _ in range(3):  # the link and a fresh client are served while the flood is held
            await _query_ok(http, s)
        st = await _status(port)
        assert st.busy == 0 and st.queued == 0
        assert sum(p.closed.done() for p in idle) == 0  # nothing idle was dropped yet
    finally:
        for peer in idle:
            if peer.transport is not None:
                peer.transport.abort()
    await asyncio.sleep(0.5)

    # 3. Still serving; memory back within bounds; every refusal counted, logged briefly.
    assert target.alive(), target.log()[-2000:]
    await _query_ok(http, s)
    rss1 = rss_kib(target.popen.pid)
    refused = target.violations()
    log = target.log()
    closing_lines = log.count("closed the connection from")
    rss = {"start": rss0, "after_hostile": rss_hostile, "flood_held": held_rss, "end": rss1}
    _report(target.kind, tally, hostile_s, len(idle), rss, refused, closing_lines)
    assert held_rss - rss0 < RSS_BOUND_KIB, f"RSS {rss0} -> {held_rss} KiB with the flood held"
    assert rss1 - rss0 < RSS_BOUND_KIB, f"RSS {rss0} -> {rss1} KiB after"
    assert refused.get("frame_length", 0) >= INPUTS_PER_KIND, refused
    assert sum(refused.values()) >= 2 * INPUTS_PER_KIND, refused
    # One line per reason every 10 s, not one per refusal.
    assert closing_lines <= len(refused) * (2 + (time.monotonic() - t0) / 10), closing_lines
    assert "Traceback" not in log


def _report(
    kind: str,
    tally: Tally,
    hostile_s: float,
    idle: int,
    rss: dict[str, int],
    refused: dict[str, int],
    log_lines: int,
) -> None:
    rows = {
        k: {
            "sent": tally.sent[k],
            "must_close": tally.must_close[k],
            "closed_by_server": tally.closed_by_server[k],
        }
        for k in KINDS
    }
    summary = {
        "target": kind,
        "hostile_inputs": sum(tally.sent.values()),
        "hostile_s": round(hostile_s, 1),
        "by_kind": rows,
        "idle_connections_held": idle,
        "rss_kib": rss,
        "violations": refused,
        "violation_log_lines": log_lines,
    }
    print("\n" + json.dumps(summary))
