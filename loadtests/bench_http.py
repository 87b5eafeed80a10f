"""The gateway's HTTP path under load: queries/s and CPU per query, and the task rate it holds.

A real gateway process (``tailgate gateway``) and ``servers`` emulated task servers with zero
service time, ``per_process`` of them to a process (``tailgate taskserver --count``), which
register themselves with it. The load comes from this process over HTTP (aiohttp); every
answer is rendered by the gateway and parsed here, as a client would.

1. Closed loop: ``clients`` clients each send a query of fanout ``fanout`` as soon as their
   last one is answered, for ``seconds``. Printed: queries/s and tasks/s answered, the
   gateway process's CPU per query (user + system, from /proc), the gateway-added latency
   (dispatch_ms + merge_ms of each answer, as in bench_latency: request to the last task
   handed to the wire, and the deciding result to the answer) at p50 and p99, and the
   latency the clients saw.
2. Sweep: open-loop Poisson arrivals of queries of fanout ``sweep_fanout`` at rising task
   rates (x ``sweep_factor`` a step, ``step_seconds`` each). Per step: the tasks/s answered,
   the gateway-added and client p99, the gateway's CPU share. The figure is the highest rate
   whose gateway-added p99 stays within ``limit_ms`` (1 ms); the sweep ends at a step whose
   p99 is ten times that, one the load falls behind (answered rate below 90% of offered,
   or the gateway's per-client limit of queries in flight reached), or after ``max_steps``.

On one small machine the task servers and this load generator share the cores with the
gateway; the gateway's CPU per query is its own, its rates are those of the whole machine.
The gateway-added latency leaves out the time a request waits for the gateway's event loop
before its handler starts (in the client's figure, with the wire and the servers).

    python -m loadtests.bench_http [--seconds 10] [--fanout 100] [--clients 32]
        [--servers 100] [--per-process 25] [--sweep-fanout 10] [--no-sweep] [--config FILE]
        [--isolate]

With ``--isolate`` the gateway runs on a CPU of its own and everything else on the others
(Linux CPU affinity): what the gateway adds without the preemptions of the processes beside
it, as on a machine of its own. The task servers and the load then have one CPU fewer.

The queries go to pool ``default``, where the servers register; a configuration given with
``--config`` must keep that pool.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aiohttp

from loadtests.procs import CpuSplit, cpu_seconds, io_syscalls
from taskserver.spawn import tailgate_argv, taskserver_argv

QUERY_CLASS = "C"
"""The class every query asks for (the default config's loosest SLO: 1 s at p95)."""
LIMIT_MS = 1.0
"""The sweep's bound on the gateway-added p99."""
STOP_FACTOR = 10.0
"""The sweep stops at a step whose gateway-added p99 is this many times the limit."""
MAX_IN_FLIGHT = 256
"""Open-loop queries outstanding at most: the gateway's max_in_flight_per_client."""


def _pct(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100.0 * len(s)))] if s else math.nan


@dataclass(frozen=True, slots=True)
class Window:
    """What one stretch of load measured."""

    seconds: float
    queries: int
    """Answered 200."""
    failed: int
    """Answered otherwise (503 shed, 5xx) or not at all."""
    fanout: int
    gateway_cpu_s: float
    added_us: list[float]
    """Gateway-added latency of each answered query (dispatch_ms + merge_ms)."""
    client_us: list[float]
    syscalls: tuple[int, int] = (0, 0)
    """The gateway process's read and write system calls in the window (/proc/PID/io)."""

    @property
    def queries_per_s(self) -> float:
        """Queries answered 200 per second."""
        return self.queries / self.seconds

    @property
    def tasks_per_s(self) -> float:
        """Their tasks per second."""
        return self.queries_per_s * self.fanout

    @property
    def cpu_per_query_us(self) -> float:
        """The gateway process's CPU per answered query."""
        return self.gateway_cpu_s / max(self.queries, 1) * 1e6

    def syscalls_per_task(self) -> tuple[float, float]:
        """The gateway's reads and writes per task of the queries answered: one of each per
        task when no two tasks (or results) share a socket call."""
        tasks = max(self.queries * self.fanout, 1)
        return self.syscalls[0] / tasks, self.syscalls[1] / tasks


class Gateway:
    """A gateway process and its emulated task servers, all registered and up."""

    def __init__(
        self,
        servers: int,
        per_process: int,
        up_timeout_s: float = 60.0,
        *,
        config: str | None = None,
        busy: int | None = None,
        isolate: bool = False,
    ) -> None:
        self.servers = servers
        self.per_process = max(1, min(per_process, servers))
        self.up_timeout_s = up_timeout_s
        self.config = config
        """The gateway's tailgate.toml (None: built-in defaults)."""
        self.busy = servers if busy is None else max(0, min(busy, servers))
        """The first `busy` servers register in pool `default`, the others in pool
        `spare` (which the configuration must name): registered, never queried."""
        self.isolate = isolate
        """The gateway on a CPU of its own (the last this process may use), the task servers
        and this process on the others: its figures without their preemptions, as on a
        machine of its own (Linux; at least 2 CPUs)."""
        self._split: CpuSplit | None = None
        """The CPUs of an isolated run (this process's restored on exit)."""
        self.proc: asyncio.subprocess.Process | None = None
        self.fleet: list[asyncio.subprocess.Process] = []
        self.url = ""
        self.gateway_cpus: set[int] | None = None
        """The CPUs the gateway may run on, when isolated."""

    async def __aenter__(self) -> Gateway:
        try:
            await self._start()
        except BaseException:  # a server that never came up, a cancel: stop what started
            await self.__aexit__()
            raise
        return self

    async def _start(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # History in memory: nothing is left behind in the working directory.
        argv = [*tailgate_argv(self.config, log_level="ERROR"), "gateway", "--port", "0"]
        argv += ["--storage-url", ""]
        if self.isolate:
            self._split = CpuSplit()
            self.gateway_cpus = self._split.own_cpus
        with self._split.own() if self._split is not None else contextlib.nullcontext():
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, env=env
            )
        assert self.proc.stdout is not None
        self.url = json.loads(await asyncio.wait_for(self.proc.stdout.readline(), 30))["url"]
        left, n = self.servers, 0
        while left:
            placed = self.servers - left
            # A process's servers are all in one pool: none spans the busy ones' end.
            up_to = self.busy - placed if placed < self.busy else left
            count = min(self.per_process, left, up_to)
            n += 1
            extra = ["--count", str(count), "--service-kind", "constant"]
            extra += ["--service-value-ms", "0", "--slots", "1000"]
            argv = taskserver_argv(
                f"ts{n}",
                gateway_url=self.url,
                log_level="ERROR",
                extra_args=extra,
                pool=None if placed < self.busy else "spare",
            )
            self.fleet.append(
                await asyncio.create_subprocess_exec(
                    *argv, stdout=asyncio.subprocess.DEVNULL, env=env
                )
            )
            left -= count
        await self._wait_up(self.up_timeout_s)

    async def _wait_up(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as http:
            while True:
                async with http.get(self.url + "/healthz") as r:
                    up = (await r.json()).get("servers_up", 0)
                if up >= self.servers:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {up} of {self.servers} task servers came up")
                await asyncio.sleep(0.2)

    @property
    def cpu_s(self) -> float:
        """The gateway process's CPU seconds so far."""
        assert self.proc is not None
        return cpu_seconds(self.proc.pid)

    @property
    def syscalls(self) -> tuple[int, int]:
        """The gateway process's read and write system calls so far."""
        assert self.proc is not None
        return io_syscalls(self.proc.pid)

    async def __aexit__(self, *exc: object) -> None:
        for p in [*self.fleet, self.proc]:
            if p is not None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        for p in [*self.fleet, self.proc]:
            if p is None:
                continue
            try:
                await asyncio.wait_for(p.wait(), 10)
            except TimeoutError:
                p.kill()
                await p.wait()
        if self._split is not None:
            self._split.restore()
            self._split = None


def stop_on_sigterm() -> None:
    """SIGTERM cancels the running task, as Ctrl-C does, so a benchmark killed that way
    leaves through its `async with Gateway` and stops the processes it started (by
    default SIGTERM ends Python at once, and they would be left running)."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)


@contextlib.asynccontextmanager
async def _session(connections: int) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as http:
        yield http


class Recorder:
    """Answers of one window: latencies of the 200s, a count of the rest."""

    def __init__(self) -> None:
        self.added_us: list[float] = []
        self.client_us: list[float] = []
        self.failed = 0

    async def query(self, http: aiohttp.ClientSession, url: str, body: bytes) -> None:
        """Send one query and record its answer."""
        t0 = time.perf_counter()
        try:
            async with http.post(url, data=body, headers=_JSON) as r:
                raw = await r.read()
                status = r.status
        except aiohttp.ClientError:
            self.failed += 1
            return
        elapsed_us = (time.perf_counter() - t0) * 1e6
        if status != 200:
            self.failed += 1
            return
        ans = json.loads(raw)
        self.added_us.append((ans["dispatch_ms"] + ans["merge_ms"]) * 1000.0)
        self.client_us.append(elapsed_us)


_JSON = {"Content-Type": "application/json"}


def _body(fanout: int) -> bytes:
    return json.dumps(
        {"class": QUERY_CLASS, "targets": {"pool": "default", "fanout": fanout}}
    ).encode()


async def closed_loop(gw: Gateway, fanout: int, clients: int, seconds: float) -> Window:
    """`clients` clients, each sending its next query when the last one is answered."""
    url, body = gw.url + "/v1/queries", _body(fanout)
    async with _session(clients) as http:
        rec = Recorder()
        stop_at = 0.0

        async def client() -> None:
            while time.perf_counter() < stop_at:
                await rec.query(http, url, body)

        stop_at = time.perf_counter() + min(seconds / 4, 2.0)
        await asyncio.gather(*(client() for _ in range(clients)))  # warm-up
        rec = Recorder()
        (r0, w0), cpu0, start = gw.syscalls, gw.cpu_s, time.perf_counter()
        stop_at = start + seconds
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed, cpu = time.perf_counter() - start, gw.cpu_s - cpu0
        r1, w1 = gw.syscalls
    return Window(elapsed, len(rec.added_us), rec.failed, fanout, cpu, rec.added_us, rec.client_us,
                  (r1 - r0, w1 - w0))  # fmt: skip


async def open_loop(
    gw: Gateway, http: aiohttp.ClientSession, fanout: int, tasks_per_s: float, seconds: float
) -> tuple[Window, bool]:
    """Poisson arrivals of queries at `tasks_per_s` / `fanout` per second for `seconds`; the
    window, and whether the in-flight cap held the load back."""
    url, body = gw.url + "/v1/queries", _body(fanout)
    rate = tasks_per_s / fanout
    rng = random.Random(1)
    rec = Recorder()
    pending: set[asyncio.Task[None]] = set()
    capped = False
    cpu0, start = gw.cpu_s, time.perf_counter()
    next_s = start
    while True:
        next_s += rng.expovariate(rate)
        if next_s - start >= seconds:
            break
        delay = next_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(pending) >= MAX_IN_FLIGHT:
            capped = True
            continue  # not sent: the offered load is not met
        t = asyncio.create_task(rec.query(http, url, body))
        pending.add(t)
        t.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending)
    elapsed, cpu = time.perf_counter() - start, gw.cpu_s - cpu0
    window = Window(elapsed, len(rec.added_us), rec.failed, fanout, cpu, rec.added_us,
                    rec.client_us)  # fmt: skip
    return window, capped


async def sweep(
    gw: Gateway,
    fanout: int,
    start: float,
    factor: float,
    step_s: float,
    limit_ms: float,
    max_steps: int,
) -> float | None:
    """Rising task rates until the load falls behind, the gateway-added p99 passes
    STOP_FACTOR x `limit_ms`, or `max_steps`; the highest rate whose p99 is within it."""
    print(f"\nsweep: open-loop Poisson arrivals, fanout {fanout}, {step_s:g} s a step")
    print("  offered    answered   failed   gateway-added µs    client µs          gateway")
    print("  tasks/s     tasks/s            p50 /     p99        p50 /     p99       CPU")
    best: float | None = None
    rate, steps = start, 0
    async with _session(MAX_IN_FLIGHT) as http:
        await open_loop(gw, http, fanout, start, min(step_s, 1.0))  # connections, warm-up
        while True:
            w, capped = await open_loop(gw, http, fanout, rate, step_s)
            p99 = _pct(w.added_us, 99)
            behind = capped or w.tasks_per_s < 0.9 * rate
            print(
                f"  {rate:>8,.0f}  {w.tasks_per_s:>10,.0f}  {w.failed:>7}   "
                f"{_pct(w.added_us, 50):>7.0f} / {p99:>7.0f}   "
                f"{_pct(w.client_us, 50):>7.0f} / {_pct(w.client_us, 99):>7.0f}   "
                f"{w.gateway_cpu_s / w.seconds:>6.0%}" + ("   (load fell behind)" if behind else "")
            )
            if p99 <= limit_ms * 1000.0 and not behind:
                best = w.tasks_per_s
            steps += 1
            if behind or steps >= max_steps or not p99 <= STOP_FACTOR * limit_ms * 1000.0:
                return best
            rate *= factor


async def main_async(args: argparse.Namespace) -> None:
    stop_on_sigterm()
    print(
        f"gateway + {args.servers} emulated task servers (zero service time, "
        f"{args.per_process} a process); load from this process over HTTP"
    )
    gateway = Gateway(args.servers, args.per_process, config=args.config, isolate=args.isolate)
    async with gateway as gw:
        if gw.gateway_cpus is not None:
            others = sorted(os.sched_getaffinity(0))
            print(f"gateway on CPU {sorted(gw.gateway_cpus)}; task servers and load on {others}")
        w = await closed_loop(gw, args.fanout, args.clients, args.seconds)
        print(f"\nclosed loop: fanout {args.fanout}, {args.clients} clients, {w.seconds:.1f} s")
        print("  queries/s   tasks/s   failed   gateway CPU   gateway-added µs   client µs")
        print("                                  per query     p50 /     p99     p50 /     p99")
        print(
            f"  {w.queries_per_s:>9,.1f}  {w.tasks_per_s:>8,.0f}  {w.failed:>7}   "
            f"{w.cpu_per_query_us:>8,.0f} µs   "
            f"{_pct(w.added_us, 50):>6.0f} / {_pct(w.added_us, 99):>6.0f}   "
            f"{_pct(w.client_us, 50):>6.0f} / {_pct(w.client_us, 99):>6.0f}"
        )
        if w.queries:
            reads, writes = w.syscalls_per_task()
            print(
                f"  (gateway CPU per task {w.cpu_per_query_us / args.fanout:.1f} µs; "
                f"mean added {statistics.fmean(w.added_us):.0f} µs; socket calls per task: "
                f"{reads:.2f} reads, {writes:.2f} writes, HTTP's included)"
            )
        if args.sweep:
            best = await sweep(gw, args.sweep_fanout, args.sweep_start, args.sweep_factor,
                               args.step_seconds, args.limit_ms, args.max_steps)  # fmt: skip
            if best is None:
                print(f"sustained: none of the rates kept the gateway-added p99 within "
                      f"{args.limit_ms:g} ms")  # fmt: skip
            else:
                print(f"sustained: {best:,.0f} tasks/s (fanout {args.sweep_fanout}) with the "
                      f"gateway-added p99 within {args.limit_ms:g} ms")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    """Parse options and run, on uvloop when installed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="closed-loop run")
    parser.add_argument("--fanout", type=int, default=100, help="closed-loop fanout")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients")
    parser.add_argument("--servers", type=int, default=100, help="emulated task servers")
    parser.add_argument("--per-process", type=int, default=25, help="task servers a process")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false")
    parser.add_argument("--sweep-fanout", type=int, default=10)
    parser.add_argument("--sweep-start", type=float, default=100.0, help="first tasks/s")
    parser.add_argument("--sweep-factor", type=float, default=2.0)
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=5.0)
    parser.add_argument("--limit-ms", type=float, default=LIMIT_MS)
    parser.add_argument("--config", help="the gateway's tailgate.toml (default: built-in)")
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="the gateway on a CPU of its own, task servers and load on the others",
    )
    args = parser.parse_args(argv)
    if max(args.fanout, args.sweep_fanout if args.sweep else 1) > args.servers:
        parser.error("--fanout and --sweep-fanout must not exceed --servers")
    if args.isolate and len(os.sched_getaffinity(0)) < 2:
        parser.error("--isolate needs at least 2 CPUs")
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    run(main_async(args))


if __name__ == "__main__":
    main()
