"""Gateway dispatch throughput against a raw asyncio-streams echo on loopback.

Both runs use the same shape: ``fanout`` server processes on loopback, one
connection to each, many requests in flight, small framed messages (~100 B,
the size of a Task frame). The yardstick echoes frames with asyncio streams
and does nothing else; the gateway run drives the real query path in-process
(GatewayService.run_query: target pick, x_p^u and t_D, Thrift encode and
dispatch, result decode, CDF update, query decided) against real task servers
with zero service time. HTTP parsing is outside both; a third figure adds
rendering each answer's JSON body as the HTTP shell sends it (every task's result read
and embedded: QueryAnswer.render). With ``--tls`` each
round also runs the gateway over mutually authenticated TLS links (a throwaway CA made in a
temporary folder, ECDSA P-256 certificates; the task servers require the gateway's), so
the two dispatch figures come from the same rounds of the same machine.

    python -m loadtests.bench_dispatch [--seconds 5] [--fanout 10] [--concurrency 64] [--tls]
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
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.config import GatewayConfig
from gateway.errors import ApiError
from gateway.queries import QueryOutcome
from gateway.requests import QueryRequest, RegisterRequest, Targets
from gateway.service import GatewayService
from loadtests.procs import ServerProcs, cpu_seconds, io_syscalls
from loadtests.tls_ca import ThrowawayCa
from taskserver.heap import settle_heap
from taskserver.tls import ClientAuth, TlsConfig, tls_argv

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


@dataclass(frozen=True, slots=True)
class Links:
    """TLS on the benchmark's links: the gateway's [tls] and the task servers' (None: plain)."""

    gateway: TlsConfig
    servers: TlsConfig

    @classmethod
    def throwaway(cls, folder: Path) -> Links:
        """Mutual TLS with certificates of a new CA in `folder`."""
        ca = ThrowawayCa.create(folder)
        gw, ts = ca.issue("gateway"), ca.issue("servers")

        def config(cert: Path, key: Path, client_auth: ClientAuth) -> TlsConfig:
            return TlsConfig(links=True, cert_file=str(cert), key_file=str(key),
                             ca_file=str(ca.cert), client_auth=client_auth)  # fmt: skip

        return cls(config(gw.cert, gw.key, ClientAuth.NONE),
                   config(ts.cert, ts.key, ClientAuth.REQUIRED))  # fmt: skip


@dataclass(frozen=True, slots=True, order=True)
class Rate:
    """One run of the gateway: its throughput and CPU per task."""

    tasks_per_s: float
    queries_per_s: float
    gateway_cpu_us: float
    """User + system CPU of the gateway's process per task (/proc)."""
    servers_cpu_us: float
    """The same, summed over the task servers' processes."""


async def gateway_rate(
    servers: int,
    fanout: int,
    concurrency: int,
    seconds: float,
    render: bool = False,
    tls: Links | None = None,
) -> Rate:
    """Tasks/s, queries/s and CPU per task through GatewayService.run_query."""
    args = ["--service-kind", "constant", "--service-value-ms", "0", "--slots", "1000"]
    if tls is not None:
        args += tls_argv(tls.servers)
    async with ServerProcs(servers, args) as sp:
        config = GatewayConfig() if tls is None else GatewayConfig(tls=tls.gateway)
        svc = GatewayService(config, registry=CollectorRegistry())
        for sid, addr in sp.addresses.items():
            await svc.register(RegisterRequest(sid, "default", addr, 1000))
        for link in svc.links.values():
            await link.wait_up(5)
        settle_heap()  # as `tailgate gateway` does once it listens (taskserver.heap)
        req = QueryRequest("B", 99.0, 300.0, 1, Targets(pool="default", fanout=fanout), b"{}")
        queries = 0
        failures = 0
        stop_at = 0.0

        async def worker() -> None:
            nonlocal queries, failures
            while time.perf_counter() < stop_at:
                try:
                    ans = await svc.run_query(req)
                except ApiError:  # refused (admission, SLO unreachable): a failed query
                    failures += 1
                    await asyncio.sleep(0)  # a refusal is immediate: let the others run
                    continue
                if render:
                    ans.render()  # the JSON answer as the HTTP shell sends it
                if ans.outcome in (QueryOutcome.MET, QueryOutcome.MISSED_SLO):
                    queries += 1
                else:
                    failures += 1

        stop_at = time.perf_counter() + 0.5
        await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm-up
        queries = failures = 0
        cpu0 = cpu_seconds(os.getpid()), sum(cpu_seconds(p.pid) for p in sp.procs)
        io0 = io_syscalls(os.getpid())
        start = time.perf_counter()
        stop_at = start + seconds
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
        cpu1 = cpu_seconds(os.getpid()), sum(cpu_seconds(p.pid) for p in sp.procs)
        io1 = io_syscalls(os.getpid())
        await svc.stop()
        if failures:
            print(f"  ({failures} queries failed)")
        tasks = queries * fanout
        rate = Rate(
            tasks / elapsed,
            queries / elapsed,
            (cpu1[0] - cpu0[0]) / tasks * 1e6,
            (cpu1[1] - cpu0[1]) / tasks * 1e6,
        )
        links = "plain links" if tls is None else "mutual TLS links"
        print(
            f"  CPU per task ({links}{', answers rendered' if render else ''}): "
            f"gateway {rate.gateway_cpu_us:.1f} µs, task servers {rate.servers_cpu_us:.1f} µs "
            f"(user+system, from /proc); the gateway's socket calls per task: "
            f"{(io1[0] - io0[0]) / tasks:.2f} reads, {(io1[1] - io0[1]) / tasks:.2f} writes"
        )
        return rate


async def main_async(args: argparse.Namespace) -> None:
    if not args.tls:
        await _rounds(args, None)
        return
    with tempfile.TemporaryDirectory(prefix="tailgate-bench-ca-") as folder:
        await _rounds(args, Links.throwaway(Path(folder)))


async def _rounds(args: argparse.Namespace, tls: Links | None) -> None:
    # Interleaved rounds, medians reported: a shared 2-core VM drifts by ±15% run to run.
    k, c, t = args.fanout, args.concurrency, args.seconds
    echos: list[float] = []
    rates: list[Rate] = []
    rendered: list[Rate] = []
    secured: list[Rate] = []
    for r in range(args.rounds):
        echos.append(await raw_echo_rate(k, c, t))
        rates.append(await gateway_rate(k, k, c, t))
        rendered.append(await gateway_rate(k, k, c, t, render=True))
        if tls is not None:
            secured.append(await gateway_rate(k, k, c, t, tls=tls))
        print(
            f"  round {r + 1}: echo {echos[-1]:,.0f}/s, gateway {rates[-1].tasks_per_s:,.0f} "
            f"tasks/s (ratio {rates[-1].tasks_per_s / echos[-1]:.2f}), with answers rendered "
            f"{rendered[-1].tasks_per_s:,.0f} tasks/s"
            + (f", over mutual TLS {secured[-1].tasks_per_s:,.0f} tasks/s" if secured else "")
        )
    echo = statistics.median(echos)
    plain = sorted(rates)[len(rates) // 2]
    tasks, queries = plain.tasks_per_s, plain.queries_per_s
    full = sorted(rendered)[len(rendered) // 2].tasks_per_s
    print(f"raw asyncio-streams echo: {echo:,.0f} round trips/s ({k} connections x {c} in flight)")
    print(
        f"gateway dispatch:         {tasks:,.0f} tasks/s = {queries:,.0f} queries/s "
        f"(fanout {k}, {c} queries in flight, zero service time)"
    )
    print(f"ratio gateway/raw:        {tasks / echo:.2f} (medians of {args.rounds} rounds)")
    print(
        f"with JSON answers built:  {full:,.0f} tasks/s (ratio {full / echo:.2f}): "
        "adds rendering each answer's JSON body, task results included"
    )
    if secured:
        over_tls = sorted(secured)[len(secured) // 2].tasks_per_s

        def cpu(runs: list[Rate]) -> str:
            gw = statistics.median(r.gateway_cpu_us for r in runs)
            ts = statistics.median(r.servers_cpu_us for r in runs)
            return f"gateway {gw:.1f} µs, task servers {ts:.1f} µs"

        print(f"over mutual TLS:          {over_tls:,.0f} tasks/s ({over_tls / tasks:.2f} of "
              "plain dispatch)")  # fmt: skip
        print(f"CPU per task, plain:      {cpu(rates)} (medians)")
        print(f"CPU per task, mutual TLS: {cpu(secured)} (medians)")


def main() -> None:
    """Parse options and run, on uvloop when installed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--tls",
        action="store_true",
        help="also run the gateway over mutual TLS links (a throwaway CA; needs openssl)",
    )
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
