"""Gateway-added latency per query at low load, for fanout 1, 10 and 100.

A real gateway process and real task server processes (zero service time) on
loopback; one client sends one query at a time over HTTP. Figures per query:

- gateway-added = dispatch_ms + merge_ms from the answer: request arrival to
  the last task handed to its link (body parse, validation, target pick,
  x_p^u, the tasks' objects; the links write their frames when the event loop
  next turns, after this), plus the deciding result's arrival to the answer
  ready (its CDF update, outcome, wake-up, answer). This is the gateway's
  Python on the critical path; the wait in between is the socket calls, the
  wire and the task servers;
- gateway CPU = the gateway process's user+system CPU per query (all of its
  work, on or off the critical path, including HTTP parsing and the earlier
  results of the fanout), from /proc;
- latency_ms = the gateway's own end-to-end latency figure;
- client = the whole HTTP round trip as the client sees it.

On one 2-core machine the k task server processes compete with the gateway
for the CPU, so latency_ms and the client figure grow with k for reasons that
have nothing to do with the gateway; the first two figures do not.

    python -m loadtests.bench_latency [--queries 2000] [--fanouts 1,10,100]
        [--per-process 1] [--isolate]

The k servers run one to a process unless ``--per-process`` hosts several in one (fewer
processes beside the gateway on a small machine). With ``--isolate`` the gateway runs on a
CPU of its own and the servers and this client on the others (Linux CPU affinity): the
gateway's figures without their preemptions, as on a machine of its own. The gateway keeps
its history in memory: nothing is left in the working directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import aiohttp

from loadtests.bench_http import Gateway
from loadtests.procs import START_S, START_S_PER_SERVER, cpu_seconds, io_syscalls


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


async def measure(
    fanout: int, queries: int, per_process: int = 1, isolate: bool = False
) -> dict[str, float]:
    """Run `queries` sequential queries of this fanout; return percentiles in µs."""
    processes = -(-fanout // max(per_process, 1))
    up_s = START_S + START_S_PER_SERVER * processes  # as ServerProcs allows
    async with (
        Gateway(fanout, per_process, up_s, isolate=isolate) as gw,
        aiohttp.ClientSession() as http,
    ):
        assert gw.proc is not None
        url = gw.url
        await asyncio.sleep(1.0)
        q = {"class": "C", "targets": {"pool": "default", "all": True}}
        added: list[float] = []
        parts: list[tuple[float, float]] = []
        internal: list[float] = []
        client: list[float] = []
        for i in range(queries + 200):
            if i == 200:
                cpu0, io0 = cpu_seconds(gw.proc.pid), io_syscalls(gw.proc.pid)
            t0 = time.perf_counter()
            async with http.post(url + "/v1/queries", json=q) as r:
                ans = await r.json()
            elapsed_us = (time.perf_counter() - t0) * 1e6
            if r.status != 200:
                raise RuntimeError(f"query failed: {ans}")
            if i < 200:
                continue  # warm-up
            internal.append(ans["latency_ms"] * 1000.0)
            added.append((ans["dispatch_ms"] + ans["merge_ms"]) * 1000.0)
            parts.append((ans["dispatch_ms"] * 1000.0, ans["merge_ms"] * 1000.0))
            client.append(elapsed_us)
            await asyncio.sleep(0.001)
        cpu_us = (cpu_seconds(gw.proc.pid) - cpu0) / queries * 1e6
        io1 = io_syscalls(gw.proc.pid)
    return {
        "added_p50": statistics.median(added),
        "added_p99": _pct(added, 99),
        "internal_p50": statistics.median(internal),
        "internal_p99": _pct(internal, 99),
        "client_p50": statistics.median(client),
        "client_p99": _pct(client, 99),
        "cpu": cpu_us,
        "dispatch_p50": statistics.median(d for d, _ in parts),
        "merge_p50": statistics.median(m for _, m in parts),
        # The gateway's socket calls per task (HTTP's included): the floor under a task when
        # no two tasks share a call, as one query at a time gives.
        "reads": (io1[0] - io0[0]) / (queries * fanout),
        "writes": (io1[1] - io0[1]) / (queries * fanout),
    }


async def main_async(args: argparse.Namespace) -> None:
    if args.isolate:
        print("the gateway on a CPU of its own; task servers and this client on the others")
    print("all figures in µs   gateway-added      gateway CPU   latency_ms         client")
    print("fanout              p50 /   p99        per query     p50 /   p99        p50 /   p99")
    for k in args.fanouts:
        m = await measure(k, args.queries, args.per_process, args.isolate)
        print(
            f"{k:>6}          {m['added_p50']:>7.0f} / {m['added_p99']:>5.0f}   "
            f"{m['cpu']:>9.0f}       {m['internal_p50']:>5.0f} / {m['internal_p99']:>5.0f}   "
            f"{m['client_p50']:>8.0f} / {m['client_p99']:>5.0f}"
        )
        print(
            f"{'':>16}(dispatch {m['dispatch_p50']:.0f} + merge {m['merge_p50']:.0f} at p50; "
            f"socket calls per task {m['reads']:.2f} reads, {m['writes']:.2f} writes)"
        )


def main() -> None:
    """Parse options and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument(
        "--fanouts", default="1,10,100", type=lambda s: [int(x) for x in s.split(",") if x]
    )
    parser.add_argument(
        "--per-process", type=int, default=1, help="task servers a process (1: one each)"
    )
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="the gateway on a CPU of its own, task servers and client on the others",
    )
    args = parser.parse_args()
    if args.per_process < 1 or args.queries < 1 or not args.fanouts or min(args.fanouts) < 1:
        parser.error("--per-process, --queries and every fanout must be >= 1")
    if args.isolate and len(os.sched_getaffinity(0)) < 2:
        parser.error("--isolate needs at least 2 CPUs")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
