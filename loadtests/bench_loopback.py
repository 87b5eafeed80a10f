"""What one small write and one small read cost on loopback TCP: the floor under a task.

A gateway sends each task to its server in a frame on that server's connection and reads
its result from it; when a query's tasks go to many servers (fanout 100 over 100 servers),
each task costs the gateway a write and a read of its own, whatever Python does around them.
This measures both on this machine with uvloop, as the gateway runs:

- write: this process writes ``size``-byte messages round-robin to ``sockets`` connections
  whose other ends a separate process drains; CPU (user + system) per write;
- read: a separate process writes such messages round-robin to ``sockets`` connections into
  this process, which counts its ``data_received`` calls; CPU per call.

    python -m loadtests.bench_loopback [--sockets 100] [--size 120] [--seconds 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import time
from collections.abc import Sequence


def _cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


async def _sink() -> None:
    """Accept connections and drop what they send; print the port."""

    class Drop(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            pass

    server = await asyncio.get_running_loop().create_server(Drop, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()


async def _connect(port: int, sockets: int) -> list[asyncio.Transport]:
    """`sockets` connections to the loopback port."""
    loop = asyncio.get_running_loop()
    return [
        (await loop.create_connection(asyncio.Protocol, "127.0.0.1", port))[0]
        for _ in range(sockets)
    ]


async def _source(port: int, sockets: int, size: int) -> None:
    """Write `size`-byte messages round-robin to `sockets` connections, with short pauses."""
    transports = await _connect(port, sockets)
    msg = b"x" * size
    while True:
        for t in transports:
            t.write(msg)
        await asyncio.sleep(0.0005)


def _helper(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "loadtests.bench_loopback", *args], stdout=subprocess.PIPE
    )


async def writes(sockets: int, size: int, seconds: float, rounds: int) -> list[tuple[float, float]]:
    """(user, system) µs of CPU per write, per round."""
    sink = _helper("--serve-sink")
    try:
        assert sink.stdout is not None
        transports = await _connect(int(sink.stdout.readline()), sockets)
        msg = b"x" * size
        out = []
        for _ in range(rounds):
            (u0, s0), n, start = _cpu(), 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                for t in transports:
                    t.write(msg)
                n += sockets
                await asyncio.sleep(0)  # the writes go out at once; let the loop run
            u1, s1 = _cpu()
            out.append(((u1 - u0) / n * 1e6, (s1 - s0) / n * 1e6))
        for t in transports:
            t.close()
        return out
    finally:
        sink.kill()
        sink.wait()


async def reads(sockets: int, size: int, seconds: float, rounds: int) -> list[tuple[float, float]]:
    """(user, system) µs of CPU per data_received call, per round."""
    calls = [0]

    class Count(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            calls[0] += 1

    server = await asyncio.get_running_loop().create_server(Count, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    source = _helper("--serve-source", str(port), str(sockets), str(size))
    try:
        await asyncio.sleep(1.0)  # connected and writing
        out = []
        for _ in range(rounds):
            (u0, s0), n0 = _cpu(), calls[0]
            await asyncio.sleep(seconds)
            (u1, s1), n = _cpu(), calls[0] - n0
            out.append(((u1 - u0) / n * 1e6, (s1 - s0) / n * 1e6))
        return out
    finally:
        source.kill()
        source.wait()
        server.close()


async def main_async(args: argparse.Namespace) -> None:
    k, size, t, r = args.sockets, args.size, args.seconds, args.rounds
    print(f"loopback TCP, {k} connections, {size}-byte messages, uvloop; CPU of this process")
    for name, runs in (
        ("write", await writes(k, size, t, r)),
        ("read", await reads(k, size, t, r)),
    ):
        each = ", ".join(f"{u:.2f} + {s:.2f}" for u, s in runs)
        total = sorted(u + s for u, s in runs)[len(runs) // 2]
        print(f"{name:>5}: user + system µs per call, by round: {each}; median {total:.2f} µs")


def main(argv: Sequence[str] | None = None) -> None:
    """Parse options and run on uvloop (the gateway's loop)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sockets", type=int, default=100)
    parser.add_argument("--size", type=int, default=120)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-sink", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-source", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import uvloop

    if args.serve_sink:
        uvloop.run(_sink())
    elif args.serve_source:
        uvloop.run(_source(*args.serve_source))
    else:
        uvloop.run(main_async(args))


if __name__ == "__main__":
    main()
