"""Edge agent figures: backfill speed, resident memory while serving, profile service times.

Three parts, each printing its figures (a benchmark, not a test: run it on purpose):

- ``seed``: rows/s of ``seed_store`` (18 months at 5 min, temperature and humidity).
- ``rss``: an agent started as ``python -m deploy.cli edge-agent run`` on that store answers
  range reads over Thrift; VmRSS (from /proc/PID/status) is read while it serves.
- ``profiles``: per heterogeneity profile, ``--agents`` one-slot agents serve unloaded
  1-30-day range reads (one outstanding task each); mean/p95/p99 of the service time
  the task server reports (TaskResult.service_ms) against the profile's targets.

    python -m loadtests.bench_edge [--part seed|rss|profiles|all] [--tasks 2000] [--agents 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from edge_agent.backfill import BackfillResult, seed_store
from edge_agent.profiles import PROFILE_TARGETS
from edge_agent.sensing import iso
from taskserver.wire import Batcher, TaskStatus, ThriftConnection, gateway_body_types, thrift

DAY_S = 86_400


class TaskClient:
    """A minimal gateway side of the wire: submit tasks to one server and await results."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._conn: ThriftConnection | None = None
        self._waiting: dict[tuple[str, int], asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)

    async def __aenter__(self) -> TaskClient:
        host, port = self.address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        _, self._conn = await loop.create_connection(
            lambda: ThriftConnection(
                gateway_body_types(), self._on_message, self._on_lost, batcher=Batcher.submit()
            ),
            host,
            int(port),
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._conn is not None:
            self._conn.close()

    def _on_message(self, name: str, mtype: int, seqid: int, body: Any) -> None:
        for res in [body.result] if name == "result" else body.results or []:
            fut = self._waiting.pop((res.query_id, res.task_index), None)
            if fut is not None and not fut.done():
                fut.set_result(res)

    def _on_lost(self, exc: Exception | None) -> None:
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"connection lost: {exc}"))
        self._waiting.clear()

    async def run(self, payload: dict[str, Any], budget_ms: float = 10_000.0) -> Any:
        """Submit one task and return its TaskResult."""
        assert self._conn is not None, "use `async with TaskClient(...)`"
        qid = f"q{next(self._ids)}"
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[(qid, 0)] = fut
        task = thrift().Task(qid, 0, budget_ms, budget_ms, 1, "A", json.dumps(payload).encode())
        self._conn.send_item(task)
        return await asyncio.wait_for(fut, budget_ms / 1000.0 + 30.0)

    async def status(self) -> Any:
        """The server's ServerStatus (a two-way call)."""
        assert self._conn is not None
        return await self._conn.call("status", thrift().TaskServer.status_args(), 10.0)


def rss_kib(pid: int) -> int:
    """Resident set size of a process, in KiB (VmRSS of /proc/PID/status)."""
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+)\s+kB", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no VmRSS for pid {pid}")
    return int(match.group(1))


def range_payload(rng: random.Random, now_s: float, store_days: float = 540.0) -> dict[str, Any]:
    """A range read of 1..30 days, somewhere in the last `store_days` of the store."""
    span_s = rng.randint(1, 30) * DAY_S
    start = now_s - rng.uniform(span_s, store_days * DAY_S)
    return {
        "op": "range",
        "sensors": ["temperature", "humidity"],
        "start": iso(int(start)),
        "end": iso(int(start + span_s)),
    }


@contextlib.asynccontextmanager
async def agent_process(db: str, *args: str) -> Any:
    """`python -m deploy.cli edge-agent run` on a free port; yields (process, address)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "deploy.cli",
        "--log-level",
        "WARNING",
        "edge-agent",
        "run",
        "--id",
        "bench-1",
        "--cluster",
        "bench",
        "--port",
        "0",
        "--db",
        db,
        "--exit-with-parent",
        *args,
        stdout=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        yield proc, json.loads(line)["address"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def bench_seed(db: str, months: float = 18.0, interval_s: int = 300) -> BackfillResult:
    """Backfill `db` and print rows and rows/s."""
    result = seed_store(db, months=months, interval_s=interval_s)
    print(
        f"seed: {result.rows} rows ({months:g} months every {interval_s} s, 2 sensors) "
        f"in {result.seconds:.2f} s = {result.rows_per_s:,.0f} rows/s"
    )
    return result


async def bench_rss(db: str, tasks: int = 200) -> int:
    """VmRSS (KiB) of an agent after it answered `tasks` range reads; printed."""
    rng = random.Random(1)
    async with agent_process(db, "--sample-interval-s", "0.5") as (proc, address):
        idle = rss_kib(proc.pid)
        async with TaskClient(address) as client:
            for _ in range(tasks):
                res = await client.run(range_payload(rng, time.time()))
                if res.status != TaskStatus.OK:
                    raise RuntimeError(f"task failed: {res.error}")
            serving = rss_kib(proc.pid)
    print(f"rss: {idle / 1024:.1f} MiB idle, {serving / 1024:.1f} MiB after {tasks} range reads")
    return serving


async def bench_profile(db: str, profile: str, tasks: int, agents: int) -> tuple[float, ...]:
    """Mean/p95/p99 (ms) of the service times of `tasks` unloaded range reads.

    Unloaded: each of `agents` agents (one slot each) gets its next task only when the last
    one is answered, so the service time the task server reports includes no queueing.
    """
    now = time.time()
    per_agent = -(-tasks // agents)

    async def drive(i: int) -> list[float]:
        rng = random.Random(i)
        args = ("--profile", profile, "--seed", str(i), "--sample-interval-s", "600")
        times = []
        async with agent_process(db, *args) as (_, address), TaskClient(address) as client:
            for _ in range(per_agent):
                res = await client.run(range_payload(rng, now))
                if res.status != TaskStatus.OK:
                    raise RuntimeError(f"task failed: {res.error}")
                times.append(float(res.service_ms))
        return times

    times = sorted(t for ts in await asyncio.gather(*(drive(i) for i in range(agents))) for t in ts)
    q = statistics.quantiles(times, n=100, method="inclusive")
    return statistics.fmean(times), q[94], q[98]


async def bench_profiles(db: str, tasks: int, agents: int, names: Sequence[str]) -> None:
    """Print achieved vs target mean/p95/p99 per profile."""
    print(f"profiles ({tasks} unloaded 1-30-day range reads each, on {agents} agents), ms:")
    print(f"  {'profile':<12} {'mean':>13} {'p95':>13} {'p99':>13}   (achieved / target)")
    for name in names:
        got = await bench_profile(db, name, tasks, agents)
        want = PROFILE_TARGETS.get(name, (float("nan"),) * 3)
        cells = " ".join(f"{g:6.1f} / {w:4.0f}" for g, w in zip(got, want, strict=True))
        print(f"  {name:<12} {cells}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the chosen parts and print their figures."""
    parser = argparse.ArgumentParser(prog="bench_edge", description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["seed", "rss", "profiles", "all"], default="all")
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per profile (2000)")
    parser.add_argument("--agents", type=int, default=2, help="agents per profile run (2)")
    parser.add_argument("--profiles", default=",".join(["none", *PROFILE_TARGETS]))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-edge-") as tmp:
        db = str(Path(tmp) / "edge.db")
        bench_seed(db)
        if args.part in ("rss", "all"):
            asyncio.run(bench_rss(db))
        if args.part in ("profiles", "all"):
            names = [n for n in args.profiles.split(",") if n]
            asyncio.run(bench_profiles(db, args.tasks, args.agents, names))


if __name__ == "__main__":
    main()
