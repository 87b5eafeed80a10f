"""The wire options the task-server transport chose between, measured on loopback.

Design question: how should the gateway carry thousands of outstanding tasks to
a task server? Option 1 is stock thriftpy2 async RPC (``make_aio_client`` /
``make_aio_server``, a two-way ``run(Task) -> TaskResult`` with a zero-time
handler): a ``TAsyncClient`` carries one call at a time, so P outstanding calls
need a pool of P connections; it is measured with the default client timeout
(every read wrapped in ``wait_for``) and with ``timeout=None``. Option 2 is our
duplex link (taskserver/wire.py): one connection to a real task server (zero
service time), oneway ``submit`` out and oneway ``result`` back, W tasks kept
outstanding, coalesced once per loop iteration. Option 3 is the encode/decode
cost of one ``submit(Task)`` message with the Cython binary protocol (ours) and
thriftpy2's pure-Python one (the kind its async protocol is). Every server runs
in its own process on 127.0.0.1; each run lasts ``--seconds``; options 1 and 2
run in ``--rounds`` interleaved rounds and the table shows medians (a shared
small VM drifts run to run). Option 2's server does real work per task (policy
queue, executor, metrics) that option 1's bare handler skips.

    python -m loadtests.bench_wire [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import signal
import statistics
import struct
import sys
import time
import timeit
from collections.abc import AsyncIterator, Callable
from functools import cache
from types import ModuleType
from typing import Any

import thriftpy2
from thriftpy2.protocol.binary import TBinaryProtocol
from thriftpy2.rpc import make_aio_client, make_aio_server
from thriftpy2.transport.memory import TMemoryBuffer

from loadtests.ports import free_port
from loadtests.procs import ServerProcs
from taskserver.wire import (
    ONEWAY,
    Batcher,
    TaskStatus,
    ThriftConnection,
    decode_message,
    encode_message,
    gateway_body_types,
    server_body_types,
    thrift,
)

uvloop: ModuleType | None
try:
    import uvloop
except ImportError:  # plain asyncio then
    uvloop = None

HOST = "127.0.0.1"
POOLS = (1, 16, 64, 256)
WINDOWS = (1, 16, 64, 256, 4096)
PAYLOAD = b'{"n": 1}'
_LEN = struct.Struct("!i")  # the frame length prefix, as in taskserver.wire
IDL = """
struct Task {
  1: required string query_id, 2: required i32 task_index,
  3: required double deadline_budget_ms, 4: required double slo_budget_ms,
  5: required i32 priority, 6: optional string class_name, 7: optional binary payload,
}
struct TaskResult {
  1: required string query_id, 2: required i32 task_index, 3: required i32 status,
  4: required double queue_ms, 5: required double service_ms, 6: required double server_ms,
  7: required bool missed_deadline, 8: optional binary result, 9: optional string error,
}
service Runner { TaskResult run(1: Task task) }
"""

Row = tuple[str, int, int, float, str]
"""(option, outstanding, sockets, calls or tasks per second, note)."""


@cache
def bench_thrift() -> ModuleType:
    """The two-way benchmark service, loaded from the IDL string above."""
    return thriftpy2.load_fp(io.StringIO(IDL), module_name="bench_wire_thrift")


class _Runner:
    """Zero-service-time handler of the stock RPC server."""

    def __init__(self) -> None:
        self._result = bench_thrift().TaskResult

    async def run(self, task: Any) -> Any:
        return self._result(task.query_id, task.task_index, 0, 0.0, 0.0, 0.0, False, b"", None)


def _free_port() -> int:
    return free_port(HOST)


def serve_stock() -> None:
    """Child-process mode: a stock thriftpy2 aio server; prints its port, runs until SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    loop = uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    port = _free_port()  # make_aio_server refuses port 0
    server = make_aio_server(
        bench_thrift().Runner, _Runner(), HOST, port, client_timeout=None, loop=loop
    )
    server.init_server()
    print(port, flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        loop.run_forever()


async def stock_rate(port: int, pool: int, seconds: float, timeout_ms: int | None) -> Row:
    """Calls/s through P stock TAsyncClients, one worker (one outstanding call) per client."""
    bt = bench_thrift()
    clients = [
        await make_aio_client(bt.Runner, HOST, port, timeout=timeout_ms) for _ in range(pool)
    ]
    calls = wrong = 0
    errors: list[str] = []
    stop_at = time.perf_counter() + seconds

    async def worker(i: int, client: Any) -> None:
        nonlocal calls, wrong
        n = 0
        while time.perf_counter() < stop_at:
            n += 1
            task = bt.Task(f"q{i}", n, 100.0, 200.0, 1, "B", PAYLOAD)
            try:
                res = await client.run(task)
            except Exception as exc:  # report, do not hide, what the stock client raises
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            calls += 1
            wrong += res.query_id != task.query_id or res.task_index != n

    start = time.perf_counter()
    await asyncio.gather(*(worker(i, c) for i, c in enumerate(clients)))
    elapsed = time.perf_counter() - start
    for c in clients:
        c.close()
    note = f"{len(errors)} errors ({errors[0]})" if errors else ""
    note += f" {wrong} wrong payloads" if wrong else ""
    label = f"{timeout_ms} (default)" if timeout_ms else "None"
    return (f"stock aio pool, timeout={label}", pool, pool, calls / elapsed, note.strip())


async def duplex_rate(port: int, window: int, seconds: float) -> Row:
    """Tasks/s on ONE ThriftConnection to a real task server, `window` tasks outstanding."""
    loop = asyncio.get_running_loop()
    task_cls = thrift().Task
    done = sent = peak = not_ok = 0
    running = True
    drained = asyncio.Event()
    conn: ThriftConnection

    def send() -> None:
        nonlocal sent, peak
        sent += 1
        conn.send_item(task_cls("q", sent, 100.0, 200.0, 1, "B", PAYLOAD))
        peak = max(peak, sent - done)

    def on_message(name: str, mtype: int, seqid: int, body: Any) -> None:
        nonlocal done, not_ok
        results = [body.result] if name == "result" else body.results or []
        done += len(results)
        for res in results:
            not_ok += res.status != TaskStatus.OK
            if running:
                send()
        if not running and done >= sent:
            drained.set()

    _, conn = await loop.create_connection(
        lambda: ThriftConnection(gateway_body_types(), on_message, batcher=Batcher.submit()),
        HOST,
        port,
    )
    start = time.perf_counter()
    for _ in range(window):
        send()
    await asyncio.sleep(seconds)
    running = False
    counted, elapsed = done, time.perf_counter() - start
    if done < sent:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(drained.wait(), 5.0)
    conn.close()
    note = f"peak {peak} outstanding"
    note += f", {not_ok} results not OK" if not_ok else ""
    note += f", {sent - done} never came back" if done < sent else ""
    return ("duplex ThriftConnection (ours)", window, 1, counted / elapsed, note)


def encode_costs(number: int = 20000) -> list[tuple[str, float, float]]:
    """(protocol, µs per encode, µs per decode) of one framed submit(Task) message."""
    t = thrift()
    args = t.TaskServer.submit_args(task=t.Task("q-123", 7, 100.0, 200.0, 1, "B", PAYLOAD))
    types = server_body_types()

    def py_encode() -> bytes:
        buf = TMemoryBuffer()
        proto = TBinaryProtocol(buf)
        proto.write_message_begin("submit", ONEWAY, 0)
        proto.write_struct(args)
        proto.write_message_end()
        data = buf.getvalue()
        return _LEN.pack(len(data)) + data

    def py_decode(frame: bytes) -> Any:
        proto = TBinaryProtocol(TMemoryBuffer(frame))
        proto.read_message_begin()
        body = t.TaskServer.submit_args()
        proto.read_struct(body)
        return body

    def cy_encode() -> bytes:
        return encode_message("submit", ONEWAY, 0, args)

    frame = cy_encode()
    assert py_encode() == frame, "the two protocols must produce the same bytes"
    assert py_decode(frame[4:]) == decode_message(frame[4:], types)[3]

    def per_call_us(fn: Callable[[], Any]) -> float:
        return min(timeit.repeat(fn, number=number, repeat=3)) / number * 1e6

    cy_dec = per_call_us(lambda: decode_message(frame[4:], types))
    py_dec = per_call_us(lambda: py_decode(frame[4:]))
    return [
        ("TCyBinaryProtocol (Cython, ours)", per_call_us(cy_encode), cy_dec),
        ("TBinaryProtocol (pure Python)", per_call_us(py_encode), py_dec),
    ]


@contextlib.asynccontextmanager
async def stock_server() -> AsyncIterator[int]:
    """A stock thriftpy2 aio server in a child process; yields its port, stops it on exit."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "loadtests.bench_wire", "--serve-stock"),
        stdout=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        assert proc.stdout is not None
        yield int(await asyncio.wait_for(proc.stdout.readline(), 20))
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def main_async(seconds: float, rounds: int) -> None:
    """Run options 1 and 2 in interleaved rounds, then option 3; print medians."""
    rates: dict[tuple[str, int, int], list[float]] = {}
    notes: dict[tuple[str, int, int], str] = {}
    ts_args = ["--host", HOST, "--service-kind", "constant", "--service-value-ms", "0"]
    async with stock_server() as sport, ServerProcs(1, [*ts_args, "--slots", "100000"]) as sp:
        tport = int(next(iter(sp.addresses.values())).rsplit(":", 1)[1])
        for r in range(rounds):  # interleaved: a shared small VM drifts run to run
            for timeout_ms in (3000, None):
                for pool in POOLS:
                    row = await stock_rate(sport, pool, seconds, timeout_ms)
                    rates.setdefault(row[:3], []).append(row[3])
                    notes[row[:3]] = row[4] or notes.get(row[:3], "")
            for window in WINDOWS:
                row = await duplex_rate(tport, window, seconds)
                rates.setdefault(row[:3], []).append(row[3])
                notes[row[:3]] = row[4] or notes.get(row[:3], "")
            print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    print(f"{'option':<38} {'outstanding':>11} {'sockets':>7} {'per s (median)':>14}  range, note")
    for (option, outstanding, sockets), xs in rates.items():
        span = f"{min(xs):,.0f}-{max(xs):,.0f}"
        print(
            f"{option:<38} {outstanding:>11} {sockets:>7} {statistics.median(xs):>14,.0f}  "
            f"{span} {notes[(option, outstanding, sockets)]}"
        )
    print(f"\n{'encoding one framed submit(Task)':<38} {'encode µs':>11} {'decode µs':>10}")
    for name, enc, dec in encode_costs():
        print(f"{name:<38} {enc:>11.2f} {dec:>10.2f}")


def main() -> None:
    """Parse options and run, on uvloop when installed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-stock", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_stock:
        serve_stock()
    else:
        (uvloop.run if uvloop is not None else asyncio.run)(main_async(args.seconds, args.rounds))


if __name__ == "__main__":
    main()
