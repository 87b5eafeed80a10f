"""Replay a simulator scenario on real processes: `tailgate live run SCENARIO --load L`.

Starts a gateway (the scenario's classes, pool, queueing and policy, every duration times
`scale`: see `loadtests.live_plan`) and the scenario's N emulated task servers, packed
``per_process`` to a process (``tailgate taskserver --count``), all registering with a
token over loopback. It then sends the simulator's very queries open-loop at their scaled
arrival times over real HTTP, collects every answer, and reports what ``tailgate sim run``
reports (per class and fanout type, in the scenario's own units: live latencies are
divided by the scale), beside the simulator's report of the same queries.

A scenario with pools of servers, or with ``pick = "least-wait"``, replays with the gateway
picking each query's servers (`loadtests.live_plan.gateway_picks`): all N servers form the
gateway's one pool, which picks as the scenario says, and each query's payload times every
server (a slow pool's servers get its ``service_scale`` times the base draw). ``--pick
random|least-wait`` overrides the scenario's ``[run] pick`` for the replay and for the
simulator beside it, so the two picks can be compared live on the same draws.

The driver must not be the bottleneck: it reports its lateness (actual - scheduled send
time) and the gateway's CPU share; a run whose driver lateness p99 exceeds 1% of the
smallest scaled SLO is marked INVALID.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from admission.tails import nearest_rank
from loadtests.live_plan import (
    gateway_picks,
    live_gateway_toml,
    plan_queries,
    pool_of_servers,
    process_counts,
)
from loadtests.sim.engine import SimResult, simulate
from loadtests.sim.report import Report, report
from loadtests.sim.scenario import Scenario
from taskserver.spawn import tailgate_argv, taskserver_argv

__all__ = ["LiveMaxLoad", "LiveRun", "live_max_load", "run_live"]

START_TIMEOUT_S = 30.0


@dataclass(slots=True)
class LiveRun:
    """What a live replay measured, and the simulator's report of the same queries."""

    live: Report
    sim: Report
    scale: float
    sent: int
    answered: dict[int, int]
    """Answers by HTTP status."""
    lateness_p99_ms: float
    """Driver lateness (actual - scheduled send), p99, wall ms."""
    lateness_max_ms: float
    gateway_cpu_share: float
    """Gateway process CPU time over the replay's wall time (1.0 = one core)."""
    servers_cpu_share: float
    wall_s: float
    valid: bool
    gap: dict[str, tuple[float, float]]
    """Where live time goes beyond the model, p50 and p99 in scenario ms (`_gap_parts`)."""
    waits: dict[str, dict[str, float]]
    """With wait estimates: per class (and "all"), the estimator's accuracy on the tasks the
    gateway expected to wait (tasks, R², error p50 / p99 in scenario ms; error = actual -
    estimated)."""
    targets: str = "as drawn"
    """Who picked each query's servers: "as drawn" (the simulator's), or the gateway's pick
    ("random", "least-wait")."""
    pool_tasks: dict[str, float] = field(default_factory=dict)
    """A scenario with pools: each pool's share of the answered tasks, live."""

    def to_text(self) -> str:
        """The live report, the simulator's, and the run's own figures."""
        flag = "valid" if self.valid else "INVALID (driver late by more than 1% of the SLO)"
        answered = ", ".join(f"{k}: {v}" for k, v in sorted(self.answered.items()))
        picked = "as drawn" if self.targets == "as drawn" else f"by the gateway, {self.targets}"
        return "\n".join(
            [
                f"== live (time scale {self.scale:g}; latencies in scenario ms) ==",
                self.live.to_text(),
                "== simulator, the same queries ==",
                self.sim.to_text(),
                f"sent {self.sent} queries in {self.wall_s:.1f} s (answers {answered}); driver "
                f"lateness p99 {self.lateness_p99_ms:.2f} ms, max {self.lateness_max_ms:.2f} ms"
                f"; gateway CPU {self.gateway_cpu_share:.0%} of a core, servers "
                f"{self.servers_cpu_share:.0%}; servers {picked}; {flag}",
                *(
                    [
                        "tasks per pool (live): "
                        + ", ".join(f"{k} {v:.1%}" for k, v in self.pool_tasks.items())
                    ]
                    if self.pool_tasks
                    else []
                ),
                "beyond the model (scenario ms, p50 / p99): "
                + "; ".join(f"{k} {a:.4f} / {b:.4f}" for k, (a, b) in self.gap.items()),
                *(
                    [
                        "queue-wait estimates (QLM §6; tasks the gateway expected to wait, "
                        "error = actual - estimated wait on the server, scenario ms): "
                        + "; ".join(
                            f"{k} {int(v['tasks']):,} tasks, R² {v['r2']:.3f}, error p50 "
                            f"{v['p50']:+.4f} / p99 {v['p99']:+.4f}"
                            for k, v in self.waits.items()
                        )
                    ]
                    if self.waits
                    else []
                ),
            ]
        )


def _gap_parts(
    plan: list[Any], answers: list[dict[str, Any] | None], scale: float
) -> dict[str, tuple[float, float]]:
    """What the live system adds to the simulator's model, per part, p50 and p99 in
    scenario ms (the simulator's task time is queueing + the drawn service time, nothing
    else):

    - ``emulation``: achieved - drawn service time, per task: the server's dequeue to
      result (the executor's sleep, and how late its loop ran the task and woke it);
    - ``gateway+wire``: query latency - the slowest task's time on its server (receipt to
      result): the gateway's dispatch and merge, both loopback hops, the HTTP answer.

    (`_replay` adds ``query, live - simulated``: each query's live latency minus the
    simulator's for the same query, where both answered every query and the plan sent each
    query to the simulator's servers.) A payload that times every server (the gateway
    picks) gives the drawn time of whichever server ran the task.
    """
    emulation: list[float] = []
    outside: list[float] = []
    for q, a in zip(plan, answers, strict=True):
        if a is None or "latency_ms" not in a or not a.get("tasks"):
            continue
        drawn = q.body["task"]["service_ms_on"]
        slowest = 0.0
        for t in a["tasks"]:
            if t.get("status") != "ok" or t.get("server_ms") is None:
                continue
            emulation.append(t["service_ms"] - drawn[t["server"]])
            slowest = max(slowest, t["server_ms"])
        outside.append(a["latency_ms"] - slowest)
    parts = {"emulation": emulation, "gateway+wire": outside}
    return {
        k: (nearest_rank(sorted(v), 50.0) / scale, nearest_rank(sorted(v), 99.0) / scale)
        for k, v in parts.items()
        if v
    }


def _pool_tasks(
    scn: Scenario, answers: list[dict[str, Any] | None], per_process: int
) -> dict[str, float]:
    """Each scenario pool's share of the tasks that ran (status ok), live; empty without
    pools. Where least-wait moves work to the faster pool, this is where it shows."""
    if not scn.servers.pools:
        return {}
    pool_of = pool_of_servers(scn, "em", per_process)
    counts = dict.fromkeys((p.name for p in scn.servers.pools), 0)
    for a in answers:
        for t in (a or {}).get("tasks") or ():
            pool = pool_of.get(t.get("server")) if t.get("status") == "ok" else None
            if pool is not None:
                counts[pool] += 1
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()} if total else {}


def _wait_accuracy(
    scn: Scenario, plan: list[Any], answers: list[dict[str, Any] | None], scale: float
) -> dict[str, dict[str, float]]:
    """The gateway's queue-wait estimates against the waits the tasks had on their servers
    (server_ms - service_ms: receipt to the start of service, no wire), per class, over the
    tasks the gateway expected to wait (estimate > 0: it saw their server busy), as the
    wait-estimator experiment reports QLM §6's accuracy in the simulator."""
    est: dict[str, list[float]] = {}
    act: dict[str, list[float]] = {}
    for q, a in zip(plan, answers, strict=True):
        if a is None or not a.get("tasks"):
            continue
        cls = str(a.get("class") or q.body.get("class"))
        for t in a["tasks"]:
            e = t.get("estimated_wait_ms")
            if t.get("status") != "ok" or e is None or e <= 0:
                continue
            if t.get("server_ms") is None or t.get("service_ms") is None:
                continue
            w = max(t["server_ms"] - t["service_ms"], 0.0)
            for key in ("all", cls):
                est.setdefault(key, []).append(e / scale)
                act.setdefault(key, []).append(w / scale)
    out: dict[str, dict[str, float]] = {}
    for key in ["all", *(c.name for c in scn.classes)]:
        if key not in est:
            continue
        e, w = np.asarray(est[key]), np.asarray(act[key])
        err = w - e
        tot = float(((w - w.mean()) ** 2).sum())
        out[key] = {
            "tasks": float(e.size),
            "r2": 1.0 - float((err**2).sum()) / tot if tot > 0 else math.nan,
            "p50": float(np.percentile(err, 50)),
            "p99": float(np.percentile(err, 99)),
        }
    return out


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


CHILD_NICE = 19
"""The gateway and the servers run this much nicer than the driver. The driver needs
little CPU but needs it on time: on a machine whose cores the system under test keeps busy
in bursts (a fanout-100 query wakes every server at once), a waking driver otherwise waits
for a time slice and sends late (driver lateness p99 3.4 ms before, on 2 cores)."""


def _child_setup() -> None:
    """In each child before exec: run nicer than the driver, and get SIGTERM if the driver
    dies (Linux's parent-death signal), so no gateway or server outlives a killed replay."""
    os.nice(CHILD_NICE)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux/glibc: the driver's own cleanup is all there is


def _start(argv: list[str], env: dict[str, str], lines: int) -> tuple[subprocess.Popen, list]:
    """Start a process and read its `lines` JSON announcements, within START_TIMEOUT_S (a
    child that hangs without a word is killed, not waited on forever)."""
    p = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        preexec_fn=_child_setup,  # no threads yet
    )
    assert p.stdout is not None
    out: list[dict[str, Any]] = []
    buf = b""
    deadline = time.monotonic() + START_TIMEOUT_S
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        while len(out) < lines:
            left = deadline - time.monotonic()
            chunk = os.read(p.stdout.fileno(), 65536) if left > 0 and sel.select(left) else b""
            if not chunk:
                p.kill()
                p.wait(5)
                p.stdout.close()
                raise RuntimeError(f"{argv[4:7]} did not start (exit {p.returncode})")
            buf += chunk
            *done, buf = buf.split(b"\n")
            out += [json.loads(line) for line in done if line.strip()]
    return p, out


async def _wait_servers_up(http: aiohttp.ClientSession, url: str, n: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        async with http.get(url + "/v1/servers") as r:
            servers = (await r.json())["servers"]
        if sum(s["state"] == "up" for s in servers) >= n:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"only some of the {n} servers came up within {START_TIMEOUT_S:g} s")


async def _drive(
    url: str, plan: list[Any], concurrency: int
) -> tuple[list[dict[str, Any] | None], list[int], list[float], float]:
    """Send every planned query at its time; answers (None: no JSON), statuses, lateness.

    The loop does as little as it can between sends: bodies are encoded before the run,
    answers kept as bytes and parsed after it (a fanout-100 answer is ~30 KB of JSON).
    """
    raw: list[bytes | None] = [None] * len(plan)
    statuses = [0] * len(plan)
    late = [0.0] * len(plan)
    bodies = [json.dumps(q.body).encode() for q in plan]
    headers = {"Content-Type": "application/json"}
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(60)) as http:
        loop = asyncio.get_running_loop()

        async def one(i: int, t0: float) -> None:
            late[i] = loop.time() - (t0 + plan[i].at_s)
            try:
                async with http.post(url + "/v1/queries", data=bodies[i], headers=headers) as r:
                    statuses[i] = r.status
                    raw[i] = await r.read()
            except (aiohttp.ClientError, TimeoutError):
                statuses[i] = 0

        t0 = loop.time() + 0.2
        tasks = []
        for i, q in enumerate(plan):
            delay = t0 + q.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, t0)))
        await asyncio.gather(*tasks)
        wall = loop.time() - t0
    answers: list[dict[str, Any] | None] = []
    for body in raw:
        try:
            answers.append(json.loads(body) if body else None)
        except ValueError:
            answers.append(None)
    return answers, statuses, late, wall


def _live_result(
    scn: Scenario, load: float, policy: str, plan: list[Any], answers: list, scale: float
) -> SimResult:
    """The live answers as a SimResult (scenario units), warm-up queries dropped."""
    names = {c.name: i for i, c in enumerate(scn.classes)}
    first = int(scn.run.warmup * len(plan))
    lat, cls, fan, misses = [], [], [], []
    tasks = missed = rejected = 0
    for q, a in zip(plan[first:], answers[first:], strict=True):
        if a is None or "latency_ms" not in a:
            rejected += 1
            continue
        lat.append(a["latency_ms"] / scale)
        cls.append(names[q.cls])
        fan.append(q.fanout)
        m = sum(bool(t.get("missed_deadline")) for t in a.get("tasks", ()))
        misses.append(m)
        tasks += q.fanout
        missed += m
    return SimResult(
        scenario=scn,
        load=load,
        policy=policy,
        latency_ms=np.asarray(lat),
        cls=np.asarray(cls, dtype=np.int64),
        fanout=np.asarray(fan, dtype=np.int64),
        tasks=tasks,
        missed=missed,
        rejected_queries=rejected,
        measured_queries=len(plan) - first,
        utilisation=float("nan"),
        query_misses=np.asarray(misses),
    )


def run_live(
    scn: Scenario,
    load: float,
    *,
    policy: str | None = None,
    scale: float = 100.0,
    per_process: int = 25,
    service_path: str,
    concurrency: int = 256,
    wait_estimates: bool = False,
) -> LiveRun:
    """Replay `scn` at `load` on real processes and simulate the same queries; with
    `wait_estimates` the gateway estimates every task's queue wait and the report gives
    the estimates' accuracy (QLM §6)."""
    policy = policy or str(scn.run.policy)
    scn = replace(scn, run=replace(scn.run, policy=policy))
    plan = plan_queries(scn, load, scale, "em", per_process)
    token = secrets.token_hex(16)
    env = dict(os.environ, TAILGATE_AGENT_TOKEN=token, PYTHONUNBUFFERED="1")
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="tailgate-live-") as tmp:
        cfg = Path(tmp) / "gateway.toml"
        cfg.write_text(live_gateway_toml(scn, scale, service_path, wait_estimates))
        try:
            gw, (info,) = _start([*tailgate_argv(str(cfg)), "gateway", "--port", "0"], env, 1)
            procs.append(gw)
            url = info["url"]
            for p, n in enumerate(process_counts(scn.servers.count, per_process), start=1):
                argv = taskserver_argv(
                    f"em-{p}",
                    gateway_url=url,
                    policy=policy,
                    slots=scn.servers.slots,
                    extra_args=("--count", str(n)),
                )
                proc, _ = _start(argv, env, n)
                procs.append(proc)
            # On select(): its timeouts wake to the microsecond, so sends leave on time
            # (epoll and uvloop round each wait up to a whole millisecond).
            with asyncio.Runner(
                loop_factory=lambda: asyncio.SelectorEventLoop(selectors.SelectSelector())
            ) as runner:
                return runner.run(
                    _replay(
                        scn,
                        load,
                        policy,
                        plan,
                        url,
                        procs,
                        scale,
                        concurrency,
                        wait_estimates,
                        per_process,
                    )
                )
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
                if proc.stdout is not None:
                    proc.stdout.close()


async def _replay(
    scn: Scenario,
    load: float,
    policy: str,
    plan: list[Any],
    url: str,
    procs: list[subprocess.Popen],
    scale: float,
    concurrency: int,
    wait_estimates: bool = False,
    per_process: int = 25,
) -> LiveRun:
    async with aiohttp.ClientSession() as http:
        await _wait_servers_up(http, url, scn.servers.count)
    cpu0 = [_cpu_s(p.pid) for p in procs]
    # No collector pauses between sends: the plan alone holds ~10^5 tracked objects, and a
    # full collection over them stops the loop for milliseconds. Frozen, they are skipped;
    # off during the run, nothing is collected (aiohttp's few cycles wait until after).
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        answers, statuses, late, wall = await _drive(url, plan, concurrency)
    finally:
        gc.enable()
        gc.unfreeze()
    cpu = [_cpu_s(p.pid) - c for p, c in zip(procs, cpu0, strict=True)]
    answered: dict[int, int] = {}
    for s in statuses:
        answered[s] = answered.get(s, 0) + 1
    lateness = sorted(x * 1000.0 for x in late)
    p99 = nearest_rank(lateness, 99.0)
    min_slo_ms = min(c.slo_ms for c in scn.classes) * scale
    live_result = _live_result(scn, load, policy, plan, answers, scale)
    # The plan is this scenario's workload at this load; the simulator picks as it says.
    sim_result = simulate(scn, load)
    live, sim = report(live_result), report(sim_result)
    gap = _gap_parts(plan, answers, scale)
    waits = _wait_accuracy(scn, plan, answers, scale) if wait_estimates else {}
    picks = gateway_picks(scn)
    if (
        not picks
        and not live_result.rejected_queries
        and not sim_result.rejected_queries
        and len(live_result.latency_ms) == len(sim_result.latency_ms)
    ):
        # The same tasks in the same order: each query's live minus simulated latency. (Where
        # the gateway picks, a query's servers and service times differ from the simulator's:
        # the two then compare as distributions only.)
        diff = sorted((live_result.latency_ms - sim_result.latency_ms).tolist())
        gap["query, live - simulated"] = (
            nearest_rank(diff, 50.0),
            nearest_rank(diff, 99.0),
        )
    return LiveRun(
        live=live,
        sim=sim,
        scale=scale,
        sent=len(plan),
        answered=answered,
        lateness_p99_ms=p99,
        lateness_max_ms=lateness[-1],
        gateway_cpu_share=cpu[0] / wall,
        servers_cpu_share=sum(cpu[1:]) / wall,
        wall_s=wall,
        valid=p99 <= 0.01 * min_slo_ms,
        gap=gap,
        waits=waits,
        targets=scn.run.pick if picks else "as drawn",
        pool_tasks=_pool_tasks(scn, answers, per_process),
    )


@dataclass(slots=True)
class LiveMaxLoad:
    """A live max-load search beside the simulator's, for one policy."""

    policy: str
    live: float
    live_bracket: tuple[float, float]
    sim: float
    sim_bracket: tuple[float, float]
    probes: list[tuple[float, bool, bool]]
    """Live probes: (load, met, valid)."""
    pick: str = "random"
    """How the gateway and the simulator picked each query's servers (the scenario's pick)."""

    def to_text(self) -> str:
        """One line: both max loads, their gap and the live probes."""
        gap = (self.live - self.sim) / self.sim if self.sim > 0 else math.nan
        invalid = sum(not v for _, _, v in self.probes)
        probes = ", ".join(f"{load:.3f}{'+' if met else '-'}" for load, met, _ in self.probes)
        note = f"; {invalid} INVALID probe(s)" if invalid else ""
        return (
            f"{self.policy:>8}, {self.pick} pick: live max load {self.live:.3f} "
            f"{self.live_bracket}, simulated {self.sim:.3f} {self.sim_bracket}, live vs "
            f"simulated {gap:+.1%}; live probes "
            f"{probes}{note}"
        )


def live_max_load(
    scn: Scenario,
    policy: str,
    *,
    tol: float = 0.02,
    lo: float = 0.05,
    hi: float = 0.95,
    around_sim: float | None = None,
    on_probe: Callable[[float, LiveRun], None] | None = None,
    **live: Any,
) -> LiveMaxLoad:
    """Bisect the live max load of one policy (every probe a `run_live`), and the
    simulator's on the same queries. With `around_sim` (e.g. 0.15) the live bisection
    starts from the simulator's max load ± that share instead of [lo, hi]: fewer probes,
    each minutes of wall time; a live max load outside that bracket shows as its edge."""
    from loadtests.sim.maxload import find_max_load

    probes: list[tuple[float, bool, bool]] = []

    def run(s: Scenario, load: float, p: str) -> SimResult:
        r = run_live(s, load, policy=p, **live)
        probes.append((load, r.live.met, r.valid))
        if on_probe is not None:
            on_probe(load, r)
        return r.live.result

    m_sim = find_max_load(scn, policy, lo=lo, hi=hi, tol=tol)
    if m_sim.max_load <= 0.0:
        unjudged = f": {m_sim.unjudged[0][1]}" if m_sim.unjudged else ""
        raise ValueError(
            f"{policy}: the simulator meets no load in [{lo:g}, {hi:g}] on these queries{unjudged}"
        )
    if around_sim is not None:  # bisect live only near the simulator's answer
        lo = max(lo, m_sim.max_load * (1.0 - around_sim))
        hi = min(hi, m_sim.max_load * (1.0 + around_sim))
    m_live = find_max_load(scn, policy, lo=lo, hi=hi, tol=tol, run=run)
    return LiveMaxLoad(
        policy,
        m_live.max_load,
        m_live.bracket,
        m_sim.max_load,
        m_sim.bracket,
        probes,
        str(scn.run.pick),
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m loadtests.live {run,maxload} SCENARIO ...`` (also ``tailgate live``)."""
    import argparse

    from loadtests.sim.scenario import load_scenario
    from loadtests.sim.tailbench import resolve_table
    from taskserver.service_time import ServiceSpec

    # The module docstring's first line, as plain text for --help.
    description = __doc__.split("\n")[0].replace("`", "")
    p = argparse.ArgumentParser(prog="tailgate live", description=description)
    sub = p.add_subparsers(dest="action", required=True)
    run_p = sub.add_parser("run", help="one replay at one load, beside the simulator")
    run_p.add_argument(
        "--load", type=float, required=True, help="offered load, as for tailgate sim run"
    )
    run_p.add_argument("--policy", help="queue policy (default: the scenario's [run] policy)")
    max_p = sub.add_parser("maxload", help="live max load per policy, beside the simulator's")
    max_p.add_argument(
        "--policy", action="append", help="repeat per policy (default: the scenario's)"
    )
    max_p.add_argument("--tol", type=float, default=0.02, help="bisection width (0.02)")
    max_p.add_argument(
        "--verbose", action="store_true", help="print every live probe's full report"
    )
    max_p.add_argument(
        "--around-sim",
        type=float,
        help="bisect live within the simulator's max load ± this share (e.g. 0.15)",
    )
    for q in (run_p, max_p):
        q.add_argument("scenario", help="scenario TOML (as for tailgate sim run)")
        q.add_argument("--scale", type=float, default=100.0, help="time scale (default 100)")
        q.add_argument("--queries", type=int, help="queries per replay (default: the scenario's)")
        q.add_argument("--per-process", type=int, default=25, help="emulated servers per process")
        q.add_argument(
            "--pick",
            choices=("random", "least-wait"),
            help="how a query's servers are picked, live and simulated (default: the "
            "scenario's [run] pick)",
        )
        q.add_argument(
            "--service-quantiles",
            required=True,
            help="the service-time table: a file, or tailbench:masstree, tailbench:shore, "
            "tailbench:xapian (the shipped tables)",
        )
        q.add_argument(
            "--wait-estimates",
            action="store_true",
            help="the gateway estimates every task's queue wait (QLM §6); report their accuracy",
        )
    args = p.parse_args(argv)

    def on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwind, so every started process is stopped

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        scn = load_scenario(args.scenario)
        path = str(Path(resolve_table(args.service_quantiles)).resolve())
        scn = scn.with_service(ServiceSpec(kind="quantiles", path=path))
        if args.queries:
            scn = replace(scn, run=replace(scn.run, queries=args.queries))
        if args.pick:  # before the replay and the simulator beside it
            scn = replace(scn, run=replace(scn.run, pick=args.pick))
        opts = {
            "scale": args.scale,
            "per_process": args.per_process,
            "service_path": path,
            "wait_estimates": args.wait_estimates,
        }
        if args.action == "run":
            run = run_live(scn, args.load, policy=args.policy, **opts)
            print(run.to_text())
            return 0 if run.valid else 3

        def show(load: float, run: LiveRun) -> None:
            if args.verbose:
                print(f"-- probe: load {load:.4f}\n{run.to_text()}", flush=True)

        valid = True
        for policy in args.policy or [str(scn.run.policy)]:
            m = live_max_load(
                scn, policy, tol=args.tol, around_sim=args.around_sim, on_probe=show, **opts
            )
            print(m.to_text(), flush=True)
            valid = valid and all(v for _, _, v in m.probes)
        return 0 if valid else 3
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"tailgate live: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
