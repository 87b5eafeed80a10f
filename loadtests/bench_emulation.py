"""How exactly the emulated executor achieves the service times it draws.

Many emulated servers share one event loop (``tailgate taskserver --count N``); each task
sleeps its drawn service time, scaled by a time factor. This drives `servers` emulated
executors in one loop at a given utilisation with Poisson arrivals per server, and reports
achieved minus drawn service time (p50, p99, max; in ms and as a share of the mean service
time) and the process CPU time per task, for each sleep mechanism:

- ``precise``: the executor's own (`taskserver.executors._sleep_precisely`: an asyncio
  sleep ending 1 ms early, then yielding to the loop until the exact time);
- ``plain``: one ``asyncio.sleep`` of the whole time (the loop's timer, rounded by epoll to
  whole milliseconds).

    python -m loadtests.bench_emulation [--service masstree] [--scale 100] [--servers 100]
        [--utilisation 0.5] [--tasks 20000] [--uvloop]

Service times come from the Tailbench table of `--service` in `--data-dir` (default: the
tables shipped in ``loadtests/sim/data/tailbench``), with the paper's tail.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from admission.tails import nearest_rank
from loadtests.sim.tailbench import TAILBENCH_DIR
from taskserver.executors import _sleep_precisely
from taskserver.service_time import ServiceSpec, make_distribution

DEFAULT_DATA_DIR = TAILBENCH_DIR


async def _plain(duration_s: float) -> None:
    await asyncio.sleep(duration_s)


async def run(
    sleeper: Callable[[float], Awaitable[None]],
    *,
    table: Path,
    scale: float,
    servers: int,
    utilisation: float,
    tasks: int,
    seed: int,
) -> dict[str, float]:
    """Emulate `tasks` tasks over `servers` one-slot servers; the error figures."""
    dist = make_distribution(ServiceSpec(kind="quantiles", path=str(table), scale=scale))
    rng = random.Random(seed)
    mean_s = dist.mean_ms / 1000.0
    rate = utilisation / mean_s  # per server, per second
    # Arrivals: (time, server), merged over the servers.
    arrivals: list[tuple[float, int]] = []
    per = tasks // servers
    for s in range(servers):
        t = 0.0
        for _ in range(per):
            t += rng.expovariate(rate)
            arrivals.append((t, s))
    heapq.heapify(arrivals)
    queues: list[asyncio.Queue[float]] = [asyncio.Queue() for _ in range(servers)]
    errors: list[float] = []
    drawn_all: list[float] = []

    async def server(q: asyncio.Queue[float]) -> None:
        while True:
            drawn_s = await q.get()
            start = time.perf_counter()
            await sleeper(drawn_s)
            errors.append(time.perf_counter() - start - drawn_s)
            drawn_all.append(drawn_s)
            q.task_done()

    workers = [asyncio.create_task(server(q)) for q in queues]
    cpu0, t0 = time.process_time(), time.perf_counter()
    while arrivals:
        at, s = heapq.heappop(arrivals)
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        queues[s].put_nowait(dist.sample_ms(rng) / 1000.0)
    for q in queues:
        await q.join()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    mean_drawn = statistics.fmean(drawn_all)
    errors.sort()
    return {
        "tasks": len(errors),
        "mean_service_ms": mean_drawn * 1000,
        "err_p50_ms": nearest_rank(errors, 50.0) * 1000,
        "err_p99_ms": nearest_rank(errors, 99.0) * 1000,
        "err_max_ms": max(errors) * 1000,
        "p99_share": nearest_rank(errors, 99.0) / mean_drawn,
        "cpu_us_per_task": cpu / len(errors) * 1e6,
        "cpu_share": cpu / wall,
    }


def _table(data_dir: Path, service: str) -> Path:
    path = data_dir / f"{service}_quantiles.txt"
    if not path.is_file():
        raise SystemExit(f"no service-time table {path} (--data-dir; masstree, shore, xapian)")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--service", default="masstree")
    p.add_argument("--scale", type=float, default=100.0, help="time scale (service x scale)")
    p.add_argument("--servers", type=int, default=100)
    p.add_argument("--utilisation", type=float, default=0.5)
    p.add_argument("--tasks", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="Tailbench tables")
    p.add_argument("--uvloop", action="store_true", help="run on uvloop")
    p.add_argument(
        "--select",
        action="store_true",
        help="asyncio on select() (µs timeouts) instead of epoll (timeouts rounded up to ms)",
    )
    args = p.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.install()
    print(
        f"{args.servers} servers, {args.tasks} tasks, {args.service} x {args.scale:g}, "
        f"utilisation {args.utilisation:g}, "
        f"{'uvloop' if args.uvloop else 'asyncio on select()' if args.select else 'asyncio'}"
    )
    loop_factory = None
    if args.select:
        import selectors

        def loop_factory() -> asyncio.AbstractEventLoop:
            return asyncio.SelectorEventLoop(selectors.SelectSelector())

    for name, sleeper in (("precise", _sleep_precisely), ("plain", _plain)):
        r = _run_in(
            loop_factory,
            lambda sleeper=sleeper: run(
                sleeper,
                table=_table(args.data_dir, args.service),
                scale=args.scale,
                servers=args.servers,
                utilisation=args.utilisation,
                tasks=args.tasks,
                seed=args.seed,
            ),
        )
        print(
            f"{name:8s} mean service {r['mean_service_ms']:.2f} ms; achieved - drawn: "
            f"p50 {r['err_p50_ms']:+.3f} ms, p99 {r['err_p99_ms']:+.3f} ms "
            f"({r['p99_share']:.1%} of the mean), max {r['err_max_ms']:+.3f} ms; "
            f"CPU {r['cpu_us_per_task']:.0f} us/task, {r['cpu_share']:.0%} of a core"
        )


def _run_in(factory: Callable[[], asyncio.AbstractEventLoop] | None, make: Callable) -> dict:
    """Run the coroutine `make()` returns on a loop from `factory` (default: asyncio's)."""
    if factory is None:
        return asyncio.run(make())
    loop = factory()
    try:
        return loop.run_until_complete(make())
    finally:
        loop.close()


if __name__ == "__main__":
    main()
