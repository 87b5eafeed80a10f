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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time

import aiohttp

from loadtests.procs import ServerProcs, cpu_seconds, io_syscalls


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


async def _start_gateway() -> tuple[asyncio.subprocess.Process, str]:
    p = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "deploy.cli",
        "--log-level",
        "WARNING",
        "gateway",
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert p.stdout is not None
    info = json.loads(await asyncio.wait_for(p.stdout.readline(), 20))
    return p, info["url"]


async def measure(fanout: int, queries: int) -> dict[str, float]:
    """Run `queries` sequential queries of this fanout; return percentiles in µs."""
    gw, url = await _start_gateway()
    try:
        async with (
            ServerProcs(
                fanout, ["--service-kind", "constant", "--service-value-ms", "0", "--slots", "4"]
            ) as sp,
            aiohttp.ClientSession() as http,
        ):
            for sid, addr in sp.addresses.items():
                body = {"id": sid, "address": addr, "pool": "default", "slots": 4}
                async with http.post(url + "/v1/servers", json=body) as r:
                    assert r.status in (200, 201), await r.text()
            await asyncio.sleep(1.0)
            q = {"class": "C", "targets": {"pool": "default", "all": True}}
            added: list[float] = []
            parts: list[tuple[float, float]] = []
            internal: list[float] = []
            client: list[float] = []
            for i in range(queries + 200):
                if i == 200:
                    cpu0, io0 = cpu_seconds(gw.pid), io_syscalls(gw.pid)
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
            cpu_us = (cpu_seconds(gw.pid) - cpu0) / queries * 1e6
            io1 = io_syscalls(gw.pid)
    finally:
        gw.send_signal(signal.SIGTERM)
        await gw.wait()
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
    print("all figures in µs   gateway-added      gateway CPU   latency_ms         client")
    print("fanout              p50 /   p99        per query     p50 /   p99        p50 /   p99")
    for k in args.fanouts:
        m = await measure(k, args.queries)
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
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
