"""Instructions the gateway executes per task: a figure a noisy machine does not move.

Runs fanout-k queries through ``GatewayService.run_query`` (the in-process path of
``bench_dispatch``: target pick, x_p^u and t_D, encode and dispatch, result decode, CDF
update, query decided) against task servers with zero service time in their own processes,
under valgrind's callgrind. Callgrind counts what the gateway's process executes, and only
while the measured queries run: instrumentation is turned on after a warm-up (every CDF row
refreshed, every cache filled) and off after them. Printed: instructions per task for each
run, and their median; with ``--against DIR`` the other checkout (its C extensions built in
place) runs in turn with this one, and the ratio is printed pair by pair.

What it is and is not: an instruction is not a nanosecond (cache misses and system calls
cost time without many instructions), so CPU time stays the figure to report; this one
tells whether a change removed work, where timing the whole process on a shared VM moves
by ±15% from run to run. Under callgrind the gateway runs about 50 times slower than
natively while its task servers run at full speed, so results come back many to a frame:
the figure is the gateway's own work per task at large frames, not its batching at native
speed. Needs valgrind (the Debian package ``valgrind``).

    python -m loadtests.bench_instructions [--queries 1000] [--fanout 10] [--runs 3]
                                           [--against DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WARMUP_QUERIES = 300
CALLGRIND_SLOWDOWN = 50.0
"""About how many times slower the gateway runs under callgrind than natively."""
_IR = re.compile(r"I\s+refs:\s+([\d,]+)")


async def _child(queries: int, fanout: int, concurrency: int) -> None:
    """The measured process: a gateway in-process, `queries` queries instrumented."""
    from prometheus_client import CollectorRegistry

    from gateway.config import GatewayConfig
    from gateway.queries import QueryOutcome
    from gateway.requests import QueryRequest, RegisterRequest, Targets
    from gateway.service import GatewayService
    from loadtests.procs import ServerProcs

    def instrument(on: bool) -> None:
        subprocess.run(
            ["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
            check=True,
            capture_output=True,
        )

    args = ["--service-kind", "constant", "--service-value-ms", "0", "--slots", "1000"]
    async with ServerProcs(fanout, args) as sp:
        # Under callgrind the gateway reads its heartbeats' answers as much later as it runs
        # slower: with the default timeout, 64 fanout-100 queries in flight left half of the
        # links down. The timeout is stretched by the same factor (the heartbeats' period is
        # not: the servers' side and the measured work stay as they are).
        timeout_s = GatewayConfig().heartbeat_timeout_s * CALLGRIND_SLOWDOWN
        svc = GatewayService(
            GatewayConfig(heartbeat_timeout_s=timeout_s), registry=CollectorRegistry()
        )
        for sid, addr in sp.addresses.items():
            await svc.register(RegisterRequest(sid, "default", addr, 1000))
        for link in svc.links.values():
            await link.wait_up(60)
        # A generous SLO: under callgrind a query takes tens of milliseconds.
        req = QueryRequest("B", 99.0, 60_000.0, 1, Targets(pool="default", fanout=fanout), b"{}")
        answered = 0

        async def run(n: int) -> None:
            left = n

            async def worker() -> None:
                nonlocal left, answered
                while left > 0:
                    left -= 1
                    ans = await svc.run_query(req)
                    answered += ans.outcome in (QueryOutcome.MET, QueryOutcome.MISSED_SLO)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

        await run(WARMUP_QUERIES)
        answered = 0
        instrument(True)
        await run(queries)
        instrument(False)
        await svc.stop()
        print(f"TASKS {answered * fanout}", flush=True)


def _measure(checkout: Path, args: argparse.Namespace) -> float:
    """Instructions per task of one run with `checkout`'s code."""
    with tempfile.TemporaryDirectory(prefix="tailgate-callgrind-") as tmp:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={tmp}/callgrind.out",
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            f"--queries={args.queries}",
            f"--fanout={args.fanout}",
            f"--concurrency={args.concurrency}",
        ]
        env = dict(os.environ, PYTHONPATH=str(checkout))
        done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    tasks = re.search(r"TASKS (\d+)", done.stdout)
    ir = _IR.search(done.stderr)
    if done.returncode != 0 or tasks is None or ir is None or int(tasks[1]) == 0:
        tail = (done.stdout + done.stderr)[-2000:]
        raise SystemExit(f"bench_instructions: the run in {checkout} failed:\n{tail}")
    return int(ir[1].replace(",", "")) / int(tasks[1])


def main() -> None:
    """Parse options, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=1000, help="measured queries a run")
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=64, help="queries in flight")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout, run in turn")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.queries < 1 or args.fanout < 1 or args.concurrency < 1 or args.runs < 1:
        parser.error("--queries, --fanout, --concurrency and --runs must be >= 1")
    if args.child:
        try:  # as bench_dispatch runs: on uvloop when installed
            import uvloop

            run = uvloop.run
        except ImportError:
            run = asyncio.run
        run(_child(args.queries, args.fanout, args.concurrency))
        return
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not installed (Debian package valgrind)")
    if args.against is not None and not (args.against / "gateway").is_dir():
        parser.error(f"--against {args.against}: not a checkout (no gateway/ in it)")
    here = Path(__file__).resolve().parent.parent
    print(
        f"fanout {args.fanout}, {args.queries} measured queries a run after {WARMUP_QUERIES} "
        f"warm-up, {args.concurrency} in flight, zero service time; instructions per task:"
    )
    ours: list[float] = []
    theirs: list[float] = []
    for r in range(args.runs):
        if args.against is not None:
            theirs.append(_measure(args.against.resolve(), args))
        ours.append(_measure(here, args))
        line = f"  run {r + 1}: {ours[-1]:,.0f}"
        if theirs:
            line += f" (against {theirs[-1]:,.0f}: ratio {ours[-1] / theirs[-1]:.3f})"
        print(line, flush=True)
    print(f"median: {statistics.median(ours):,.0f} instructions per task")
    if theirs:
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        print(
            f"against {args.against}: median {statistics.median(theirs):,.0f}; ratio this / "
            f"that {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
