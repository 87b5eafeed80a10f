"""Benchmark of the gateway's passes over every server: how long each holds the event loop.

Run on purpose, not in CI: ``python -m loadtests.bench_passes [--servers 1000,10000]
[--repeats 5] [--against DIR]``. For each N it builds one gateway service in this process
with N registered servers (links that are not connected, each with its own CDF row and some
tasks counted), then runs each pass through the entry point the gateway uses, beside a task
that measures how long the loop goes without a turn:

- history sample: what the history recorder reads every ``history_interval_s``;
- GET /metrics: the Prometheus exposition (with its per-server families);
- dashboard: the live part of the dashboard's poll;
- GET /v1/servers, whole and a page of 100 (with its JSON encoding).

Before each run every server gets one more task counted, as between two passes under load.

It prints, per pass, the median over ``repeats`` of its whole time and of the longest the
loop went without a turn while it ran: that longest hold is what a query in flight may
wait behind the pass. ``--against DIR`` runs the same file against another checkout
(DIR's packages first on the path, e.g. a ``git worktree`` of an earlier commit) in
alternation with this one (this, that, that, this: the mean of each tree's two medians), so
a machine whose speed drifts slows both alike; a tree without a sliced pass runs its
one-piece version.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

PASSES = ("history sample", "GET /metrics", "dashboard", "GET /v1/servers", "a page of 100")


def build_service(n: int) -> Any:
    """A gateway service with n registered servers: own CDF rows, tasks counted."""
    from gateway.config import GatewayConfig
    from gateway.links import ServerLink
    from gateway.service import GatewayService

    service = GatewayService(GatewayConfig(storage_url=""))
    samples = [float(j) for j in range(1, 257)]
    for i in range(n):
        sid = f"ts-{i:05d}"
        link = ServerLink(
            sid,
            "127.0.0.1",
            9,
            on_result=lambda *a: None,
            on_failure=lambda *a: None,
            clock=service.clock,
            pool="default",
        )
        status = SimpleNamespace(executor="emulated", policy=None, draining=False, owner=None)
        link._on_status(status)
        service.links[sid] = link
        service.book.add_server(sid, [x * (1.0 + i % 7 / 10) for x in samples])
        service.server_windows.tasks(sid, "default", 5 + i % 3, i % 2)
    return service


def pass_runners(service: Any) -> dict[str, Callable[[], Awaitable[object]]]:
    """Each pass as the gateway runs it (a tree without a sliced one runs it whole)."""
    from prometheus_client import generate_latest

    from gateway import history, server_listing
    from gateway.dashboard import live_snapshot
    from gateway.server_listing import ServerQuery

    async def sample() -> object:
        spread = getattr(history, "read_figures_spread", None)
        return await spread(service) if spread else history.read_figures(service)

    async def scrape() -> object:
        exposition = getattr(service.metrics, "exposition", None)
        return await exposition() if exposition else generate_latest(service.registry)

    async def dashboard() -> object:
        snapshot = live_snapshot(service, time.time())
        return await snapshot if asyncio.iscoroutine(snapshot) else snapshot

    async def listing(query: dict[str, str]) -> object:
        q, links, view = ServerQuery.parse(query), service.links.values(), service.server_view
        spread = getattr(server_listing, "list_servers_spread", None)
        body = (
            await spread(links, q, view) if spread else server_listing.list_servers(links, q, view)
        )
        encode = getattr(server_listing, "encode_listing", None)
        return encode(body) if encode else json.dumps(body)

    return {
        "history sample": sample,
        "GET /metrics": scrape,
        "dashboard": dashboard,
        "GET /v1/servers": lambda: listing({}),
        "a page of 100": lambda: listing({"limit": "100"}),
    }


async def hold_of(run: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """(whole time, longest time without a turn of the loop) of one run, in ms."""
    longest = 0.0

    async def watch() -> None:
        nonlocal longest
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0)
            longest = max(longest, time.perf_counter() - t)

    watcher = asyncio.get_running_loop().create_task(watch())
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    await run()
    whole = time.perf_counter() - t0
    await asyncio.sleep(0)  # the watcher's last turn measures the end of the run
    watcher.cancel()
    return whole * 1e3, min(longest, whole) * 1e3


def busy_interval(service: Any) -> None:
    """One more task counted on every server, as between two passes under load (the
    per-server windows then have something new from each)."""
    windows = service.server_windows
    for sid, link in service.links.items():
        windows.tasks(sid, link.pool, 3, 1)


async def measure(n: int, repeats: int) -> dict[str, list[float]]:
    """Medians of whole time and longest hold, per pass, at n servers."""
    service = build_service(n)
    runners = pass_runners(service)
    for run in runners.values():  # first runs fill caches and rows
        await run()
    out: dict[str, list[float]] = {}
    for name in PASSES:
        runs = []
        for _ in range(repeats):
            busy_interval(service)
            runs.append(await hold_of(runners[name]))
        out[name] = [statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)]
    return out


def run_elsewhere(tree: Path, n: int, repeats: int) -> dict[str, list[float]]:
    """This file run with `tree`'s packages first on the path; its JSON line back."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--servers", str(n)]
    cmd += ["--repeats", str(repeats)]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="1000,10000", help="comma-separated N")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--against", type=Path, help="another checkout, run in alternation")
    ap.add_argument("--json", action="store_true", help="one JSON line (for --against)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.servers.split(",")]
    if args.json:
        print(json.dumps(asyncio.run(measure(sizes[0], args.repeats))))
        return
    here = Path(__file__).resolve().parents[1]
    print(f"passes over N registered servers, median of {args.repeats} runs each, ms")
    print(f"{'servers':>8}  {'pass':<16} {'this tree: whole / longest hold':>32}", end="")
    print(f"  {'--against: whole / longest hold':>32}" if args.against else "")
    for n in sizes:
        ours = run_elsewhere(here, n, args.repeats)
        theirs = run_elsewhere(args.against.resolve(), n, args.repeats) if args.against else {}
        if args.against:  # and once more in the other order
            theirs2 = run_elsewhere(args.against.resolve(), n, args.repeats)
            ours2 = run_elsewhere(here, n, args.repeats)
        for name in PASSES:
            a = ours[name] if not args.against else _mid(ours[name], ours2[name])
            line = f"{n:>8,}  {name:<16} {a[0]:>21,.1f} / {a[1]:>8,.1f}"
            if args.against:
                b = _mid(theirs[name], theirs2[name])
                line += f"  {b[0]:>21,.1f} / {b[1]:>8,.1f}"
            print(line, flush=True)


def _mid(a: list[float], b: list[float]) -> list[float]:
    return [(x + y) / 2 for x, y in zip(a, b, strict=True)]


if __name__ == "__main__":
    main()
