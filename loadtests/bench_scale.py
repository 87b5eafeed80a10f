"""Many task servers behind one gateway: its memory, idle CPU, listing and query tail by N.

For each N: a real gateway process (``tailgate gateway``) and N emulated task servers with
zero service time, ``per_process`` of them to a process (``tailgate taskserver --count``),
which register themselves with it (and refresh their registration, and answer its
heartbeats, as real ones do). Once all N are up and a settling pause has passed:

- gateway RSS: its resident memory (/proc), and per server beyond the smallest N;
- gateway CPU while idle: its CPU share (user + system, /proc) over ``idle_s`` seconds in
  which no query runs (heartbeats and registration refreshes only);
- ``GET /v1/servers``: the median time of the whole listing, and of one page of 100;
- fanout-100 p99: the gateway's latency_ms of queries of fanout 100 (random servers of the
  pool) from ``clients`` clients, p50 and p99 (fanout min(100, N)); and the gateway-added
  part of it (dispatch_ms + merge_ms of each answer, as in bench_latency): what the gateway
  itself adds, apart from the N servers' processes sharing the machine's cores;
- full GCs: the gateway's full garbage-collector passes while those queries ran and their
  summed pause (its `tailgate_gc_pause_seconds{generation="2"}`);
- CPU a query: the gateway's CPU (user + system, /proc) over those queries, per query, and
  the server processes' likewise: whether the gateway's own work grows with N, or what it
  shares the cores with does; and the gateway's read(2) and write(2) calls per task: as N
  grows at one load, fewer tasks share a link's frame, up to one frame each way a task;
- RSS after the queries: a server's CDF row becomes its own (its window, a sorted copy and
  a slot on the solver's grid, ~84 KiB at the default window) at its first refresh, after
  `cdf_refresh_every` samples (256): about 256 x N / 100 queries of fanout 100 (the warm-up
  queries count too).

On one small machine the server processes share the cores with the gateway; what the
gateway spends is its own (/proc), its latencies are those of the whole machine.

    python -m loadtests.bench_scale [--servers 10,100,500,1000] [--per-process 250]
        [--processes P] [--idle-s 10] [--queries 300] [--clients 4] [--busy K] [--config FILE]

With ``--processes P`` every N runs in the same P server processes (N / P servers each):
on a small machine each query of fanout 100 wakes up to min(100, processes) of them, so
the process count, not N, sets much of the tail; this keeps it fixed across N.

With ``--busy K`` only the first K servers of every N take the queries (fanout min(100, K));
the others register in a pool ``spare`` and are never queried, so N - K servers are
registered but idle: what the gateway's query path pays for servers it does not use. Pools
are whole processes: use ``--per-process`` so that K servers fill whole processes at every N.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import statistics
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from loadtests.bench_http import Gateway, stop_on_sigterm
from loadtests.procs import cpu_seconds, io_syscalls


def rss_mib(pid: int) -> float:
    """Resident memory of a process in MiB (/proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass(frozen=True, slots=True)
class Row:
    """The figures for one N."""

    servers: int
    rss_mib: float
    idle_cpu: float
    """Share of one core."""
    list_ms: float
    page_ms: float
    fanout: int
    p50_ms: float
    p99_ms: float
    added_p50_us: float
    added_p99_us: float
    full_gcs: int
    """Full garbage-collector passes of the gateway while the measured queries ran."""
    full_gc_ms: float
    """Their total pause (tailgate_gc_pause_seconds{generation="2"})."""
    gateway_us: float
    """The gateway's CPU (user + system) per measured query, µs."""
    servers_us: float
    """The server processes' CPU per measured query, µs: with the gateway on few cores,
    what they take is what its latencies wait behind."""
    reads: float
    """The gateway's read(2) calls per task of the measured queries (HTTP's included)."""
    writes: float
    """Its write(2) calls per task: one a task when no two tasks share a link's frame."""
    rss_after_mib: float
    """The gateway's RSS after the queries: with enough of them that each server took a CDF
    refresh's samples (`cdf_refresh_every`, 256), its row holds a window of its own (README:
    memory once servers take traffic)."""


async def _timed_get(http: aiohttp.ClientSession, url: str, repeats: int) -> float:
    """Median milliseconds of GET url (body read)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        async with http.get(url) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"GET {url}: {r.status}")
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


async def _queries(
    http: aiohttp.ClientSession, url: str, fanout: int, n: int, clients: int
) -> list[tuple[float, float]]:
    """(latency_ms, gateway-added µs) of n queries of this fanout from `clients` clients."""
    body = json.dumps({"class": "C", "targets": {"pool": "default", "fanout": fanout}}).encode()
    left, out = [n], []

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            async with http.post(
                url + "/v1/queries", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                ans = await r.json()
                if r.status == 200:
                    added_us = (ans["dispatch_ms"] + ans["merge_ms"]) * 1000.0
                    out.append((ans["latency_ms"], added_us))

    await asyncio.gather(*(client() for _ in range(clients)))
    return out


async def _full_gcs(http: aiohttp.ClientSession, url: str) -> tuple[int, float]:
    """The gateway's full GC passes so far and their summed pause in ms (its /metrics)."""
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    found = {}
    for line in text.splitlines():
        for part in ("count", "sum"):
            if line.startswith(f'tailgate_gc_pause_seconds_{part}{{generation="2"}}'):
                found[part] = float(line.rsplit(" ", 1)[1])
    return int(found.get("count", 0)), found.get("sum", 0.0) * 1000.0


def _per_process(n: int, args: argparse.Namespace) -> int:
    """Servers a process for N: --per-process, or N spread over --processes processes."""
    if args.processes:
        return max(1, math.ceil(n / args.processes))
    return int(args.per_process)


async def measure(n: int, args: argparse.Namespace) -> Row:
    """Start N servers and a gateway; measure them."""
    gw_at = Gateway(
        n,
        _per_process(n, args),
        up_timeout_s=60.0 + n / 20.0,
        config=args.config,
        busy=args.busy,
    )
    async with gw_at as gw:
        await asyncio.sleep(args.settle_s)
        assert gw.proc is not None
        pid = gw.proc.pid
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        await asyncio.sleep(args.idle_s)
        idle = (cpu_seconds(pid) - cpu0) / (time.perf_counter() - t0)
        rss = rss_mib(pid)
        fanout = min(100, gw.busy)
        async with aiohttp.ClientSession() as http:
            whole = await _timed_get(http, gw.url + "/v1/servers", 5)
            page = await _timed_get(http, gw.url + "/v1/servers?limit=100", 5)
            await _queries(http, gw.url, fanout, min(args.queries // 5, 50), args.clients)
            gcs0, gc_ms0 = await _full_gcs(http, gw.url)
            fleet = [p.pid for p in gw.fleet]
            cpu0, fleet0 = cpu_seconds(pid), sum(map(cpu_seconds, fleet))
            io0 = io_syscalls(pid)
            answers = await _queries(http, gw.url, fanout, args.queries, args.clients)
            cpu1, fleet1 = cpu_seconds(pid), sum(map(cpu_seconds, fleet))
            io1 = io_syscalls(pid)
            gcs1, gc_ms1 = await _full_gcs(http, gw.url)
        rss_after = rss_mib(pid)
    tasks = max(len(answers) * fanout, 1)
    lat = sorted(a for a, _ in answers)
    added = sorted(b for _, b in answers)
    return Row(
        n, rss, idle, whole, page, fanout, *_p50_p99(lat), *_p50_p99(added),
        gcs1 - gcs0, gc_ms1 - gc_ms0,
        (cpu1 - cpu0) * 1e6 / max(len(answers), 1), (fleet1 - fleet0) * 1e6 / max(len(answers), 1),
        (io1[0] - io0[0]) / tasks, (io1[1] - io0[1]) / tasks, rss_after,
    )  # fmt: skip


def _p50_p99(xs: list[float]) -> tuple[float, float]:
    """Median and nearest-rank 99th percentile of sorted values (nan for none)."""
    if not xs:
        return float("nan"), float("nan")
    return statistics.median(xs), xs[min(len(xs) - 1, int(0.99 * len(xs)))]


async def main_async(args: argparse.Namespace) -> None:
    stop_on_sigterm()
    spread = f"in {args.processes} processes" if args.processes else f"{args.per_process} a process"
    print(
        f"one gateway, N emulated task servers ({spread}, zero service "
        f"time); idle CPU over {args.idle_s:g} s; queries: {args.queries} from "
        f"{args.clients} clients"
        + (f", to the first {args.busy} servers (the rest registered in pool spare)"
           if args.busy is not None else "")
    )  # fmt: skip
    print(
        "servers   gateway RSS   per server   idle CPU   per server   GET /v1/servers"
        "        fanout   latency_ms          gateway-added µs    full GCs   CPU µs a query"
        "      socket calls a task   RSS after"
    )
    print(
        "              MiB          KiB      % core     % core       all / page of 100 ms"
        "            p50 /    p99          p50 /    p99                gateway / servers"
        "     reads / writes     queries MiB"
    )
    first: Row | None = None
    for n in args.servers:
        row = await measure(n, args)
        first = first or row
        extra = row.servers - first.servers
        per_kib = (row.rss_mib - first.rss_mib) * 1024.0 / extra if extra else float("nan")
        print(
            f"{row.servers:>7,}   {row.rss_mib:>11.1f}   {per_kib:>10.1f}   "
            f"{row.idle_cpu:>8.1%}   {row.idle_cpu / row.servers:>10.4%}   "
            f"{row.list_ms:>8.1f} / {row.page_ms:>5.1f}      {row.fanout:>6}   "
            f"{row.p50_ms:>6.1f} / {row.p99_ms:>6.1f}     "
            f"{row.added_p50_us:>6.0f} / {row.added_p99_us:>6.0f}   "
            f"{row.full_gcs:>3} / {row.full_gc_ms:>5.0f}   "
            f"{row.gateway_us:>7,.0f} / {row.servers_us:>7,.0f}   "
            f"{row.reads:>7.2f} / {row.writes:>6.2f}   {row.rss_after_mib:>11.1f}",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> None:
    """Parse options and run, on uvloop when installed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--servers",
        default=[10, 100, 500, 1000],
        type=lambda s: [int(x) for x in s.split(",") if x],
        help="comma-separated N (up to 10,000 where the machine's memory allows)",
    )
    parser.add_argument("--per-process", type=int, default=250)
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        help="spread every N over this many server processes instead (0: --per-process): "
        "on a small machine the number of server processes, not N, sets the tail",
    )
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--busy",
        type=int,
        default=None,
        help="of every N, only this many servers take the queries (pool default); the "
        "others register in pool spare and are never queried: what registered but idle "
        "servers cost the queries",
    )
    parser.add_argument(
        "--config",
        help="the gateway's tailgate.toml (default: built-in; with --busy, one naming the "
        "pools default and spare, written for the run)",
    )
    args = parser.parse_args(argv)
    if args.busy is not None and args.busy < 1:
        parser.error(f"--busy: must be >= 1, got {args.busy}")
    with contextlib.ExitStack() as stack:
        if args.busy is not None:
            args.config = _two_pool_config(parser, args.config, stack)
        _run(args)


def _two_pool_config(
    parser: argparse.ArgumentParser, given: str | None, stack: contextlib.ExitStack
) -> str:
    """The configuration of a --busy run: the given one if it names pools default and
    spare (else an error), or one written for the run that names just those two."""
    if given is not None:
        try:
            with open(given, "rb") as f:
                pools = tomllib.load(f).get("pools")
        except (OSError, tomllib.TOMLDecodeError) as exc:
            parser.error(f"--config: {exc}")
        # Without [[pools]] the built-in ones apply: default and edge.
        if not pools:
            names = {"default", "edge"}
        else:
            names = {p.get("name", "default") for p in pools if isinstance(p, dict)}
        if not {"default", "spare"} <= names:
            parser.error(f"--busy: {given} must name the pools default and spare")
        return given
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-scale-")))
    path = tmp / "tailgate.toml"
    path.write_text('[[pools]]\nname = "default"\n\n[[pools]]\nname = "spare"\n')
    return str(path)


def _run(args: argparse.Namespace) -> None:
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    run(main_async(args))


if __name__ == "__main__":
    main()
