"""Gateway dispatch throughput against a raw asyncio-streams echo on loopback.

Both runs use the same shape: ``fanout`` server processes on loopback, one
connection to each, many requests in flight, small framed messages (~100 B,
the size of a Task frame). The yardstick echoes frames with asyncio streams
and does nothing else; the gateway run drives the real query path in-process
(GatewayService.run_query: target pick, x_p^u and t_D, Thrift encode and
dispatch, result decode, CDF update, query decided) against real task servers
with zero service time. HTTP parsing is outside both; a third figure adds
rendering each answer's JSON body (decoding every task's result).

    python -m loadtests.bench_dispatch [--seconds 5] [--fanout 10] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import struct
import sys
import time

from prometheus_client import CollectorRegistry

from gateway.config import GatewayConfig
from gateway.queries import QueryOutcome
from gateway.requests import QueryRequest, RegisterRequest, Targets
from gateway.service import GatewayService
from loadtests.procs import ServerProcs, cpu_seconds

FRAME = struct.Struct("!I")
PAYLOAD = b"x" * 96


async def _echo_server(port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readexactly(4)
                body = await reader.readexactly(FRAME.unpack(head)[0])
                writer.write(head + body)

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()


async def raw_echo_rate(servers: int, window: int, seconds: float) -> float:
    """Round trips per second over `servers` echo processes with `window` in flight each."""
    procs = []
    ports = []
    for _ in range(servers):
        p = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "loadtests.bench_dispatch",
            "--serve-echo",
            stdout=asyncio.subprocess.PIPE,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        assert p.stdout is not None
        ports.append(int(await asyncio.wait_for(p.stdout.readline(), 20)))
        procs.append(p)
    done = 0
    stop_at = 0.0

    async def one(port: int) -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        msg = FRAME.pack(len(PAYLOAD)) + PAYLOAD
        for _ in range(window):
            writer.write(msg)
        while time.perf_counter() < stop_at:
            head = await reader.readexactly(4)
            await reader.readexactly(FRAME.unpack(head)[0])
            done += 1
            writer.write(msg)
        writer.close()

    try:
        stop_at = time.perf_counter() + 0.5
        await asyncio.gather(*(one(p) for p in ports))  # warm-up
        done = 0
        start = time.perf_counter()
        stop_at = start + seconds
        await asyncio.gather(*(one(p) for p in ports))
        return done / (time.perf_counter() - start)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            await p.wait()


async def gateway_rate(
    servers: int, fanout: int, concurrency: int, seconds: float, render: bool = False
) -> tuple[float, float]:
    """(tasks/s, queries/s) through GatewayService.run_query."""
    async with ServerProcs(
        servers, ["--service-kind", "constant", "--service-value-ms", "0", "--slots", "1000"]
    ) as sp:
        svc = GatewayService(GatewayConfig(), registry=CollectorRegistry())
        for sid, addr in sp.addresses.items():
            await svc.register(RegisterRequest(sid, "default", addr, 1000))
        for link in svc.links.values():
            await link.wait_up(5)
        req = QueryRequest("B", 99.0, 300.0, 1, Targets(pool="default", fanout=fanout), b"{}")
        queries = 0
        failures = 0
        stop_at = 0.0

        async def worker() -> None:
            nonlocal queries, failures
            while time.perf_counter() < stop_at:
                ans = await svc.run_query(req)
                if render:
                    ans.body  # noqa: B018 - rendering the JSON answer is what is measured
                if ans.outcome in (QueryOutcome.MET, QueryOutcome.MISSED_SLO):
                    queries += 1
                else:
                    failures += 1

        stop_at = time.perf_counter() + 0.5
        await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm-up
        queries = failures = 0
        cpu0 = cpu_seconds(os.getpid()), sum(cpu_seconds(p.pid) for p in sp.procs)
        start = time.perf_counter()
        stop_at = start + seconds
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
        cpu1 = cpu_seconds(os.getpid()), sum(cpu_seconds(p.pid) for p in sp.procs)
        await svc.stop()
        if failures:
            print(f"  ({failures} queries failed)")
        tasks = queries * fanout
        print(
            f"  CPU per task: gateway {(cpu1[0] - cpu0[0]) / tasks * 1e6:.1f} µs, "
            f"task servers {(cpu1[1] - cpu0[1]) / tasks * 1e6:.1f} µs "
            f"(user+system, from /proc)"
        )
        return tasks / elapsed, queries / elapsed


async def main_async(args: argparse.Namespace) -> None:
    # Interleaved rounds, medians reported: a shared 2-core VM drifts by ±15% run to run.
    k, c, t = args.fanout, args.concurrency, args.seconds
    echos, rates, rendered = [], [], []
    for r in range(args.rounds):
        echos.append(await raw_echo_rate(k, c, t))
        rates.append(await gateway_rate(k, k, c, t))
        rendered.append(await gateway_rate(k, k, c, t, render=True))
        print(
            f"  round {r + 1}: echo {echos[-1]:,.0f}/s, gateway {rates[-1][0]:,.0f} tasks/s "
            f"(ratio {rates[-1][0] / echos[-1]:.2f}), with answers rendered "
            f"{rendered[-1][0]:,.0f} tasks/s"
        )
    echo = statistics.median(echos)
    tasks, queries = sorted(rates)[len(rates) // 2]
    full, _ = sorted(rendered)[len(rendered) // 2]
    print(f"raw asyncio-streams echo: {echo:,.0f} round trips/s ({k} connections x {c} in flight)")
    print(
        f"gateway dispatch:         {tasks:,.0f} tasks/s = {queries:,.0f} queries/s "
        f"(fanout {k}, {c} queries in flight, zero service time)"
    )
    print(f"ratio gateway/raw:        {tasks / echo:.2f} (medians of {args.rounds} rounds)")
    print(
        f"with JSON answers built:  {full:,.0f} tasks/s (ratio {full / echo:.2f}): "
        "adds decoding each task's result into the answer body"
    )


def main() -> None:
    """Parse options and run, on uvloop when installed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    if args.serve_echo:
        with contextlib.suppress(KeyboardInterrupt):
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            run(_echo_server(0))
        return
    run(main_async(args))


if __name__ == "__main__":
    main()
