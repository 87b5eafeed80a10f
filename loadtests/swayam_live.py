"""Replay a pool scenario live under its autoscaler, beside the pool simulator on the same trace.

    python -m loadtests.swayam_live loadtests/scenarios/swayam.toml --policy swayam
    tailgate live pool loadtests/scenarios/swayam.toml --policy threshold --start-s 35

The pool simulator (`loadtests.sim.pool`) is the model of record for Swayam's claims (§4-5):
SLA compliance per window of requests and backend-seconds. This runs the same trace on real
processes with every duration times the time scale S (service times, the SLO, t_setup, the
idle retirement T, the decision interval, the rate history, the cooldowns, the trace's own
times), so rates are divided by S:

- The gateway starts as ``tailgate up --autoscale --servers N0 --edge-agents 0`` starts it, its
  config read through TAILGATE_CONFIG so that the servers its local actuator starts read it
  too (`pool_gateway_toml`): one server-queueing pool "default" (Swayam routes it by its
  ordered prefix), one class, the service law as the pool's prior, admission off, and the
  policy: ``swayam`` (idle servers retire after T: passive scale-in), ``threshold`` (TailGuard
  §III.E), or ``static``: the threshold loop pinned at the static count. N0 is the
  simulator's starting count (`initial_backends`).
- The driver sends the simulator's very requests (its seeded arrivals and service draws)
  open loop at their scaled times, single-task queries whose payload gives the scaled service
  time (``service_ms``), after a warm-up at the starting rate that both sides run and
  neither measures.
- GET /v1/servers, polled every POLL_S, gives the servers over time: a server counts from the
  scale-out decision that started it (GET /v1/autoscaler, unix seconds) or its registration
  until it leaves.

Reported in scenario units, live beside `simulate_pool` on the same requests with the live
gateway's routing (``dispatch="random"``: a random server of the prefix, its own queue) and
with the simulator's default central FIFO queue (the experiments' model): SLA compliance per
window (`live_compliance`: a failed query is a miss), backend-seconds, peak servers, servers
over time. What the replay does so that both sides start alike, for lack of a knob in the
gateway (gateway.autoscaling):

- Swayam's floor is N0 on both sides (`_floored`): the simulator starts with N0 backends in
  use, and the live gateway routes to every server it started (gateway.service).
- The live model adds d1 = d2 = 0.5 ms (fixed by the replay's config; a gateway measures them
  on its links by default), real time, to the service times it reads from the
  gateway's CDF of post-queuing times: both sides run with that wire (`live_wire`: 0.5 / S
  ms in scenario time, where the scenario says 0.5 ms), and a long CDF window keeps the
  scenario's law, the prior, as those service times (LIVE_CDF_WINDOW).

Where the live system still is not the model: a live server serves once its process has
started and registered (printed; t_setup is only the prediction horizon there; ``--setup-s``
sets it on both sides); the live Swayam loop also decides at once on each SLA violation
(Algorithm 1), without a rate sample when woken within half a period, and waits for the
servers it starts; a live threshold step down stops the
highest server once drained, where the simulator lets it retire after T idle.

As in `loadtests.live`, the driver runs on select(), the gateway and its servers at nice 19,
and a run whose driver lateness p99 exceeds 1% of the scaled target is marked INVALID.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from admission.tails import nearest_rank
from loadtests.live import _child_setup
from loadtests.ports import free_port
from loadtests.sim.pool import (
    POLICIES,
    PoolResult,
    PoolScenario,
    _arrivals,
    bursty_trace,
    initial_backends,
    load_pool_scenario,
    simulate_pool,
)
from loadtests.sim.workload import sample_service_ms
from taskserver.service_time import ServiceSpec
from taskserver.spawn import tailgate_argv
from taskserver.tomlconfig import ConfigError

__all__ = [
    "PlannedRequest",
    "PoolLiveRun",
    "PoolSide",
    "backend_seconds",
    "cut_trace",
    "live_compliance",
    "live_wire",
    "main",
    "plan_requests",
    "pool_gateway_toml",
    "prepare",
    "run_pool_live",
    "server_spans",
    "sim_backend_seconds",
    "sim_side",
    "with_warmup",
]

DEFAULT_SCALE = 10.0
"""Time scale: Xapian's ~1 ms tasks sleep ~10 ms, 2,000 requests/s arrive as 200/s."""
MAX_WALL_S = 300.0
"""Without --duration-s, a replay runs as much of the trace as fits in this wall time."""
WARMUP_INTERVALS = 3
"""Default warm-up, in decision intervals (`default_warmup_s`)."""
POLL_S = 0.25
"""Wall seconds between two GET /v1/servers."""
START_TIMEOUT_S = 60.0
"""For `tailgate up` to start its first servers, plus START_PER_SERVER_S per server."""
START_PER_SERVER_S = 2.0
STOP_TIMEOUT_S = 20.0
FAILED_MS = 1e12
"""A failed or rejected query's response time: slower than any target."""
CLASS = "A"
POOL = "default"
RETRY_DELAY_MS = 1.0
"""Swayam's Δ in the simulator's model of random dispatch (the policy's default), scenario ms."""
LIVE_MODEL_WIRE_MS = 1.0
"""d1 + d2 of the live Swayam model (the replay fixes `[autoscaling] link_delay_ms` to half)."""
LIVE_CDF_WINDOW = 65_536
"""The gateway's per-server CDF window: longer than a replay's results on one server, so the
service times the live Swayam model reads stay the scenario's law (the prior), as in the
simulator, instead of drifting to the post-queuing times measured on this machine."""


# --------------------------------------------------------------------------- pure parts


def cut_trace(
    scn: PoolScenario, start_s: float = 0.0, duration_s: float | None = None
) -> PoolScenario:
    """The scenario on [start_s, start_s + duration_s] of its trace, shifted to start at 0
    (the corners inside kept, the rate interpolated at both ends)."""
    end = float(scn.duration_s if duration_s is None else min(start_s + duration_s, scn.duration_s))
    if not 0 <= start_s < end:
        raise ValueError(
            f"start_s / duration_s: need 0 <= start_s < start_s + duration_s and start_s < "
            f"the trace's {scn.duration_s:g} s, got {start_s:g} / {duration_s}"
        )
    inside = [(t, r) for t, r in zip(scn.trace_s, scn.trace_rate, strict=True) if start_s < t < end]
    at = [float(np.interp(x, scn.trace_s, scn.trace_rate)) for x in (start_s, end)]
    times = [0.0, *(t - start_s for t, _ in inside), end - start_s]
    rates = [at[0], *(r for _, r in inside), at[1]]
    return replace(scn, trace_s=tuple(times), trace_rate=tuple(rates))


def with_warmup(scn: PoolScenario, warmup_s: float) -> PoolScenario:
    """The scenario with `warmup_s` at its starting rate before its trace."""
    if not (warmup_s >= 0 and math.isfinite(warmup_s)):
        raise ValueError(f"warmup_s: must be >= 0, got {warmup_s}")
    if warmup_s == 0:
        return scn
    times = (0.0, *(t + warmup_s for t in scn.trace_s))
    return replace(scn, trace_s=times, trace_rate=(scn.trace_rate[0], *scn.trace_rate))


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of the replay."""

    at_s: float
    """When to send it after the start (wall seconds, scaled)."""
    service_ms: float
    """Its service time on the server (wall ms, scaled)."""


def plan_requests(scn: PoolScenario, scale: float) -> list[PlannedRequest]:
    """The simulator's requests (`simulate_pool` draws the same ones from the same seed), each
    time scaled: sent at arrival x scale, served for service x scale."""
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale: must be > 0, got {scale}")
    arrivals = _arrivals(scn, random.Random(scn.seed))
    service = sample_service_ms(scn.service, np.random.default_rng(scn.seed).random(len(arrivals)))
    return [
        PlannedRequest(a * scale / 1000.0, round(float(s) * scale, 3))
        for a, s in zip(arrivals, service.tolist(), strict=True)
    ]


def _prior_lines(spec: ServiceSpec, scale: float) -> list[str]:
    """The pool's [pools.prior]: the scenario's service law, scaled in time."""
    lines = ["[pools.prior]", f'kind = "{spec.kind}"']
    for name in ("mean_ms", "median_ms", "sigma", "value_ms"):
        value = getattr(spec, name)
        if value is not None:
            lines.append(f"{name} = {value!r}")
    if spec.path:
        lines.append(f"path = {str(Path(spec.path).resolve())!r}")
    lines += [f"scale = {spec.scale * scale!r}", f'tail = "{spec.tail}"']
    return lines


def pool_gateway_toml(scn: PoolScenario, policy: str, scale: float, servers: int) -> str:
    """The replay's config: one class, one pool "default" with the scaled service law as its
    prior, admission off, and the autoscaler with every duration scaled. ``static`` runs
    the threshold loop with min = max = `servers`, so the pool never changes."""
    if policy not in POLICIES:
        raise ValueError(f"policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
    low, high = (servers, servers) if policy == "static" else (scn.min_backends, scn.max_backends)
    overhead_ms = max(0.0, (scn.send_ms + scn.reply_ms) * scale - LIVE_MODEL_WIRE_MS)
    lines = [
        "[gateway]",
        'storage_url = ""',
        f"cdf_window = {LIVE_CDF_WINDOW}",
        "",
        "[[classes]]",
        f'name = "{CLASS}"',
        f"percentile = {scn.percentile!r}",
        f"latency_ms = {scn.target_ms * scale!r}",
        "",
        "[[pools]]",
        f'name = "{POOL}"',
        'queueing = "server"',
        # d1 + d2, scaled, less what the live Swayam model adds itself (none with `live_wire`):
        # the prior's service times are then the service law's, as the model's must be.
        f"prior_overhead_ms = {overhead_ms!r}",
        # Δ of the live Swayam model (random dispatch, eq. (1)) as the simulator's, scaled.
        f"retry_delay_ms = {RETRY_DELAY_MS * scale!r}",
        *_prior_lines(scn.service, scale),
        "",
        "[admission]",
        'policy = "none"',
        "",
        "[autoscaling]",
        f'policy = "{"swayam" if policy == "swayam" else "threshold"}"',
        f'pool = "{POOL}"',
        f"min_replicas = {low}",
        f"max_replicas = {high}",
        f"interval_s = {scn.interval_s * scale!r}",
        f"setup_s = {scn.setup_s * scale!r}",
        f"idle_s = {scn.idle_s * scale!r}",
        f"history_s = {scn.history_s * scale!r}",
        # d1 = d2 fixed, not measured on the links: the simulator beside runs the same model.
        f"link_delay_ms = {LIVE_MODEL_WIRE_MS / 2.0!r}",
        f"burst = {scn.burst!r}",
        f"upper = {scn.upper!r}",
        f"lower = {scn.lower!r}",
        f"window_tasks = {scn.window_tasks}",
        f"up_cooldown_s = {scn.up_cooldown_s * scale!r}",
        f"down_cooldown_s = {scn.down_cooldown_s * scale!r}",
        "",
        "[taskserver]",
        "slots = 1",
        "",
    ]
    return "\n".join(lines)


def live_compliance(latencies_ms: Sequence[float | None], scn: PoolScenario) -> float:
    """`PoolResult.compliance` of live answers in arrival order (scenario ms); a query that
    failed or was rejected (None, or not finite) counts as a miss."""
    values = [
        FAILED_MS if x is None or not math.isfinite(x) else min(float(x), FAILED_MS)
        for x in latencies_ms
    ]
    return PoolResult("live", np.asarray(values, dtype=float), []).compliance(scn)


def server_spans(
    samples: Sequence[tuple[float, frozenset[str]]],
    end_s: float,
    starts_s: Sequence[float] = (),
    start_window_s: float = math.inf,
) -> list[tuple[str, float, float]]:
    """(server, from, to) for every stretch a server was seen in polls of the pool, clipped to
    [0, end_s].

    A poll's set holds until the next poll (the last until end_s). A server that appears
    after the first poll started at the latest scale-out decision in `starts_s` before it was
    seen, if one lies within `start_window_s`, else when it was seen (its process started
    before it registered: the simulator counts a backend from its start, warming included).
    """
    spans: list[tuple[str, float, float]] = []
    opened: dict[str, float] = {}
    starts = sorted(starts_s)
    for k, (t, ids) in enumerate(samples):
        for sid in [s for s in opened if s not in ids]:
            spans.append((sid, opened.pop(sid), t))
        for sid in ids:
            if sid in opened:
                continue
            begin = t
            if k > 0:
                earlier = [s for s in starts if s <= t]
                if earlier and t - earlier[-1] <= start_window_s:
                    begin = earlier[-1]
            opened[sid] = begin
    spans += [(sid, begin, end_s) for sid, begin in opened.items()]
    clipped = [(sid, max(a, 0.0), min(b, end_s)) for sid, a, b in spans]
    return [(sid, a, b) for sid, a, b in clipped if b > a]


def backend_seconds(
    spans: Sequence[tuple[str, float, float]], start_s: float = 0.0, end_s: float = math.inf
) -> float:
    """The time integral of servers started and not yet retired, over [start_s, end_s]."""
    return sum(max(0.0, min(b, end_s) - max(a, start_s)) for _, a, b in spans)


def sim_backend_seconds(result: PoolResult, start_n: int, start_s: float, end_s: float) -> float:
    """A simulator run's backend-seconds over [start_s, end_s], from its timeline: backends
    start and retire only at decisions, so the count after each decision (warm and warming)
    holds until the next one; `start_n` ran before the first."""
    points = [(0.0, start_n)] + [
        (float(p["time_s"]), int(p["warm"] + p["warming"])) for p in result.timeline
    ]
    total = 0.0
    for (t, n), (t_next, _) in zip(points, [*points[1:], (end_s, 0)], strict=True):
        total += n * max(0.0, min(t_next, end_s) - max(t, start_s))
    return total


# --------------------------------------------------------------------------- the report


@dataclass(slots=True)
class PoolSide:
    """One side's figures, in the scenario's units."""

    compliance: float
    backend_seconds: float
    peak: int
    requests: int
    tail_ms: float
    """The p-th response time of the answered requests."""
    failed: int
    timeline: list[tuple[float, int]]
    """(time s, servers serving)."""

    def servers_at(self, t_s: float) -> int | None:
        """Servers at the last point of the timeline at or before t_s."""
        before = [n for t, n in self.timeline if t <= t_s + 1e-9]
        return before[-1] if before else None


def sim_side(
    scn: PoolScenario, result: PoolResult, start_n: int, from_s: float, measured: np.ndarray
) -> PoolSide:
    """A simulator run's figures from `from_s` on (the requests `measured` picks, in arrival
    order); peak and timeline count warm backends, as the experiments do."""
    response = result.response_ms[measured]
    later = [p for p in result.timeline if p["time_s"] >= from_s]
    return PoolSide(
        compliance=PoolResult(result.policy, response, []).compliance(scn),
        backend_seconds=sim_backend_seconds(result, start_n, from_s, scn.duration_s),
        peak=max((int(p["warm"]) for p in later), default=0),
        requests=int(response.size),
        tail_ms=float(np.percentile(response, scn.percentile)) if response.size else math.nan,
        failed=0,
        timeline=[(float(p["time_s"]) - from_s, int(p["warm"])) for p in later],
    )


@dataclass(slots=True)
class PoolLiveRun:
    """A live replay of a pool scenario and the simulator's runs of the same requests."""

    scenario: PoolScenario
    """The replayed window of the trace (the warm-up before it is not in the figures)."""
    policy: str
    scale: float
    warmup_s: float
    live: PoolSide
    sims: dict[str, PoolSide]
    """By the simulator's dispatch: "random" (the live gateway's routing), "central"."""
    sent: int
    answered: dict[int, int]
    """Answers by HTTP status (0: no answer)."""
    lateness_p99_ms: float
    lateness_max_ms: float
    gateway_cpu_share: float
    """Gateway process CPU over the replay's wall time (1.0 = one core)."""
    servers_cpu_share: float
    wall_s: float
    valid: bool
    gateway_url: str = ""
    start_delay_s: list[float] = field(default_factory=list)
    """Live: scale-out decision to the new server's registration, per server (wall s)."""
    actions: int = 0
    """Live scaling actions the gateway's autoscaler took."""

    def gaps(self, dispatch: str = "random") -> dict[str, float]:
        """Live vs simulated, (live - sim) / sim: compliance, backend-seconds, peak."""
        sim = self.sims[dispatch]
        out = {}
        for name in ("compliance", "backend_seconds", "peak"):
            a, b = float(getattr(self.live, name)), float(getattr(sim, name))
            out[name] = (a - b) / b if b and math.isfinite(a) and math.isfinite(b) else math.nan
        return out

    def to_text(self) -> str:
        """The side-by-side table, the timelines and the run's own figures."""
        scn = self.scenario
        labels = {"random": "sim, random dispatch", "central": "sim, central FIFO"}
        sims = [(self.sims[k], labels[k]) for k in labels if k in self.sims]
        head = ["", "live"]
        for _, label in sims:
            head += [label, "gap"]
        rows: list[list[str]] = []
        for label, name, fmt in (
            (
                f"SLA compliance (windows of {scn.window_requests:,}, "
                f"p{scn.percentile:g} <= {scn.target_ms:g} ms)",
                "compliance",
                "{:.1%}",
            ),
            ("backend-seconds", "backend_seconds", "{:,.1f}"),
            ("peak servers", "peak", "{:.0f}"),
            (f"p{scn.percentile:g} response (ms, answered)", "tail_ms", "{:.2f}"),
        ):
            live = float(getattr(self.live, name))
            row = [label, fmt.format(live)]
            for side, _ in sims:
                sim = float(getattr(side, name))
                ok = sim and math.isfinite(live) and math.isfinite(sim)
                row += [fmt.format(sim), f"{(live - sim) / sim:+.1%}" if ok else "-"]
            rows.append(row)
        rows.append(
            ["requests (failed)", f"{self.live.requests:,} ({self.live.failed:,})"]
            + [c for s, _ in sims for c in (f"{s.requests:,}", "")]
        )
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

        def line(cells: list[str]) -> str:
            return "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ).rstrip()

        step = _timeline_step(scn)
        tl = ["t (s)  live  " + "  ".join(label for _, label in sims)]
        for k in range(int(scn.duration_s / step + 1e-9) + 1):
            t = step * k
            cells = [f"{t:>5g}", f"{_fmt(self.live.servers_at(t)):>4}"]
            cells += [f"{_fmt(s.servers_at(t)):>{len(label)}}" for s, label in sims]
            tl.append("  ".join(cells))
        flag = "valid" if self.valid else "INVALID (driver late by more than 1% of the target)"
        answered = ", ".join(f"{k}: {v}" for k, v in sorted(self.answered.items()))
        delays = sorted(self.start_delay_s)
        started = (
            f"{len(delays)} server(s) started live, decision to registration "
            f"{nearest_rank(delays, 50.0):.2f} s median, {delays[-1]:.2f} s max wall "
            f"({nearest_rank(delays, 50.0) / self.scale:.3f} s scenario; t_setup "
            f"{scn.setup_s:g} s)"
            if delays
            else "no server started live"
        )
        return "\n".join(
            [
                f"== {scn.name}: policy {self.policy}, {scn.duration_s:g} s of trace after "
                f"{self.warmup_s:g} s of warm-up, time scale {self.scale:g} (scenario units; "
                "gap = live vs simulated) ==",
                line(head),
                *(line(r) for r in rows),
                "",
                "servers serving (live: registered; simulated: warm)",
                *tl,
                "",
                f"sent {self.sent:,} queries in {self.wall_s:.1f} s (answers {answered}); "
                f"{self.actions} live scaling action(s); {started}",
                f"driver lateness p99 {self.lateness_p99_ms:.2f} ms, max "
                f"{self.lateness_max_ms:.2f} ms (limit {0.01 * scn.target_ms * self.scale:.2f}"
                f" ms); gateway CPU {self.gateway_cpu_share:.0%} of a core, servers "
                f"{self.servers_cpu_share:.0%}; {flag}",
            ]
        )


def _fmt(n: int | None) -> str:
    return "-" if n is None else str(n)


def _timeline_step(scn: PoolScenario) -> float:
    """About a dozen rows, on whole decision intervals."""
    return max(scn.interval_s, math.ceil(scn.duration_s / 12 / scn.interval_s) * scn.interval_s)


# --------------------------------------------------------------------------- the live run


def _tree_cpu_s(pid: int) -> tuple[float, float]:
    """(the process's CPU s, its children's: those running and those it has reaped)."""
    tick = os.sysconf("SC_CLK_TCK")
    own = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    children = (int(own[13]) + int(own[14])) / tick  # cutime + cstime: reaped children
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            children += (int(fields[11]) + int(fields[12])) / tick
    return (int(own[11]) + int(own[12])) / tick, children


def _wait_listening(proc: subprocess.Popen, port: int, timeout_s: float) -> float:
    """When (time.monotonic()) the gateway of `tailgate up` first accepted a connection: it
    builds its autoscaler loop, and starts that loop's rate clock, right after it listens."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.05):
                return time.monotonic()
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"tailgate up did not listen within {timeout_s:g} s (exit {proc.poll()})")


def _wait_banner(proc: subprocess.Popen, out: Path, err: Path, timeout_s: float) -> str:
    """The gateway's URL once `tailgate up` has started its servers and printed its banner."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = out.read_text(errors="replace")
        for ln in text.splitlines():
            if ln.startswith("tailgate: gateway on "):
                return ln.split()[3]
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    tail = err.read_text(errors="replace").strip().splitlines()[-5:]
    raise RuntimeError(
        f"tailgate up did not start within {timeout_s:g} s (exit {proc.poll()}): "
        + " | ".join(tail)
    )


@dataclass(slots=True)
class _Drive:
    latency_ms: list[float | None]
    statuses: list[int]
    late_s: list[float]
    samples: list[tuple[float, frozenset[str]]]
    """(wall s after the start, servers of the pool not down)."""
    wall_s: float
    actions: list[dict[str, Any]]
    wall0: float
    """time.time() at the start: GET /v1/autoscaler gives its times in unix seconds."""


async def _drive(
    url: str,
    plan: list[PlannedRequest],
    end_s: float,
    concurrency: int = 256,
) -> _Drive:
    """Send every request at its time, poll the pool's servers until end_s, then read the
    autoscaler's actions. Bodies are encoded before the run, answers parsed after it."""
    raw: list[bytes | None] = [None] * len(plan)
    statuses = [0] * len(plan)
    late = [0.0] * len(plan)
    bodies = [
        json.dumps(
            {
                "class": CLASS,
                "targets": {"pool": POOL, "fanout": 1},
                "task": {"service_ms": q.service_ms},
            }
        ).encode()
        for q in plan
    ]
    headers = {"Content-Type": "application/json"}
    samples: list[tuple[float, frozenset[str]]] = []
    loop = asyncio.get_running_loop()
    conn = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(60)
    async with (
        aiohttp.ClientSession(connector=conn, timeout=timeout) as http,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(5)) as watch,
    ):
        t0 = loop.time() + 0.2
        wall0 = time.time() + (t0 - loop.time())

        async def poll() -> None:
            while True:
                try:
                    async with watch.get(url + "/v1/servers") as r:
                        servers = (await r.json())["servers"]
                except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                    servers = None
                now = loop.time() - t0
                if servers is not None:
                    ids = frozenset(
                        s["id"] for s in servers if s["pool"] == POOL and s["state"] != "down"
                    )
                    samples.append((now, ids))
                if now >= end_s:
                    return
                await asyncio.sleep(min(POLL_S, max(end_s - now, 0.0) + 1e-3))

        async def one(i: int) -> None:
            late[i] = loop.time() - (t0 + plan[i].at_s)
            try:
                async with http.post(url + "/v1/queries", data=bodies[i], headers=headers) as r:
                    statuses[i] = r.status
                    raw[i] = await r.read()
            except (aiohttp.ClientError, TimeoutError):
                statuses[i] = 0

        poller = asyncio.create_task(poll())
        tasks: list[asyncio.Task[None]] = []
        for i, q in enumerate(plan):
            delay = t0 + q.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        await poller
        wall = loop.time() - t0
        try:
            async with watch.get(url + "/v1/autoscaler") as r:
                actions = list((await r.json()).get("actions") or [])
        except (aiohttp.ClientError, TimeoutError, ValueError):
            actions = []
    latency: list[float | None] = []
    for status, body in zip(statuses, raw, strict=True):
        try:
            answer = json.loads(body) if body and status == 200 else None
        except ValueError:
            answer = None
        value = answer.get("latency_ms") if isinstance(answer, dict) else None
        latency.append(float(value) if isinstance(value, int | float) else None)
    return _Drive(latency, statuses, late, samples, wall, actions, wall0)


def default_warmup_s(scn: PoolScenario) -> float:
    """WARMUP_INTERVALS decision intervals: the first rate samples fall in it, and Swayam's
    regression has its points when the measured window starts."""
    return WARMUP_INTERVALS * scn.interval_s


def live_wire(scn: PoolScenario, scale: float) -> PoolScenario:
    """The scenario with the live system's d1 and d2: the wire is not scaled, and the live
    Swayam model takes 0.5 ms each way (LIVE_MODEL_WIRE_MS), which is that / scale in the
    scenario's time. Both sides run it, so both size the pool with the same model."""
    half = LIVE_MODEL_WIRE_MS / 2.0 / scale
    return replace(scn, send_ms=half, reply_ms=half)


def _floored(scn: PoolScenario, policy: str, start_n: int) -> PoolScenario:
    """Swayam with its starting count as its floor: the live gateway starts Swayam's n at
    min_replicas, not at the servers it starts with (gateway.autoscaling), so a replay that
    starts N0 servers pins min = N0 to begin where the simulator begins, on both sides."""
    if policy != "swayam":
        return scn
    return replace(scn, min_backends=max(scn.min_backends, start_n))


def run_pool_live(
    scn: PoolScenario,
    policy: str,
    *,
    scale: float = DEFAULT_SCALE,
    warmup_s: float | None = None,
    concurrency: int = 256,
) -> PoolLiveRun:
    """Replay `scn` under `policy` on a live gateway and its autoscaled servers, and simulate
    the same requests with both dispatch modes. Both sides first run `warmup_s` at the
    trace's starting rate (default WARMUP_INTERVALS decisions), left out of the figures."""
    warmup_s = default_warmup_s(scn) if warmup_s is None else warmup_s
    scn = live_wire(scn, scale)
    full = with_warmup(scn, warmup_s)
    n0 = initial_backends(full, policy, "random")
    live_scn = _floored(full, policy, n0)
    plan = plan_requests(full, scale)
    end_s = full.duration_s * scale
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with tempfile.TemporaryDirectory(prefix="tailgate-pool-live-") as tmp:
        cfg = Path(tmp) / "tailgate.toml"
        cfg.write_text(pool_gateway_toml(live_scn, policy, scale, n0))
        env["TAILGATE_CONFIG"] = str(cfg)  # the servers the actuator starts read it too
        port = free_port()
        top = n0 if policy == "static" else live_scn.max_backends
        argv = [
            *tailgate_argv(None),
            "up",
            "--autoscale",
            "--servers",
            str(n0),
            "--max-servers",
            str(top),
            "--edge-agents",
            "0",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        out, err = Path(tmp) / "up.out", Path(tmp) / "up.err"
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fo,
                stderr=fe,
                env=env,
                preexec_fn=_child_setup,  # nice 19; SIGTERM if this driver dies
            )
        try:
            _wait_listening(proc, port, START_TIMEOUT_S)
            url = _wait_banner(proc, out, err, START_TIMEOUT_S + START_PER_SERVER_S * n0)
            cpu0 = _tree_cpu_s(proc.pid)
            # No collector pauses between sends (see loadtests.live).
            gc.collect()
            gc.freeze()
            gc.disable()
            try:
                # select(): its timeouts wake to the microsecond, so sends leave on time.
                with asyncio.Runner(
                    loop_factory=lambda: asyncio.SelectorEventLoop(selectors.SelectSelector())
                ) as runner:
                    drive = runner.run(_drive(url, plan, end_s, concurrency))
            finally:
                gc.enable()
                gc.unfreeze()
            cpu1 = _tree_cpu_s(proc.pid)
        finally:
            _stop(proc)
    run = _report(scn, policy, scale, warmup_s, plan, drive, cpu0, cpu1)
    run.gateway_url = url
    return run


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM `tailgate up` (it drains, then stops its servers); SIGKILL if it hangs. Its
    servers run with --exit-with-parent, so none outlives it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _report(
    scn: PoolScenario,
    policy: str,
    scale: float,
    warmup_s: float,
    plan: list[PlannedRequest],
    drive: _Drive,
    cpu0: tuple[float, float],
    cpu1: tuple[float, float],
) -> PoolLiveRun:
    """Live figures over the measured window, beside the simulator's of the same requests."""
    full = with_warmup(scn, warmup_s)
    from_s, end_s = warmup_s * scale, full.duration_s * scale
    # Scale-out decisions (unix seconds) on the run's time line; one that is not within the
    # run (a clock stepped) is left out, and its servers count from their registration.
    starts = [
        float(a["time_s"]) - drive.wall0
        for a in drive.actions
        if int(a.get("to", 0)) > int(a.get("from", 0))
    ]
    starts = [s for s in starts if -START_TIMEOUT_S <= s <= end_s + START_TIMEOUT_S]
    spans = server_spans(drive.samples, end_s, starts, start_window_s=START_TIMEOUT_S)
    first = drive.samples[0][1] if drive.samples else frozenset()
    seen = {}
    for t, ids in drive.samples:
        for sid in ids:
            seen.setdefault(sid, t)
    delays = [seen[sid] - a for sid, a, _ in spans if sid not in first and starts]
    measured = np.asarray([q.at_s >= from_s for q in plan], dtype=bool)
    live_ms = [
        x / scale if x is not None else None
        for x, m in zip(drive.latency_ms, measured, strict=True)
        if m
    ]
    ok = np.asarray([x for x in live_ms if x is not None])
    later = [(t, ids) for t, ids in drive.samples if t >= from_s]
    live = PoolSide(
        compliance=live_compliance(live_ms, scn),
        backend_seconds=backend_seconds(spans, from_s, end_s) / scale,
        peak=max((len(ids) for _, ids in later), default=0),
        requests=len(live_ms),
        tail_ms=float(np.percentile(ok, scn.percentile)) if ok.size else math.nan,
        failed=sum(x is None for x in live_ms),
        timeline=[(t / scale - warmup_s, len(ids)) for t, ids in drive.samples],
    )
    sims = {}
    for dispatch in ("random", "central"):
        n0 = initial_backends(full, policy, dispatch)
        result = simulate_pool(_floored(full, policy, n0), policy, dispatch)
        sims[dispatch] = sim_side(full, result, n0, warmup_s, measured)
    answered: dict[int, int] = {}
    for status in drive.statuses:
        answered[status] = answered.get(status, 0) + 1
    # The driver's lateness where it counts: the measured requests (not the warm-up).
    lateness = sorted(x * 1000.0 for x, m in zip(drive.late_s, measured, strict=True) if m)
    lateness = lateness or [0.0]
    p99 = nearest_rank(lateness, 99.0)
    return PoolLiveRun(
        scenario=scn,
        policy=policy,
        scale=scale,
        warmup_s=warmup_s,
        live=live,
        sims=sims,
        sent=len(plan),
        answered=answered,
        lateness_p99_ms=p99,
        lateness_max_ms=lateness[-1],
        gateway_cpu_share=(cpu1[0] - cpu0[0]) / drive.wall_s,
        servers_cpu_share=(cpu1[1] - cpu0[1]) / drive.wall_s,
        wall_s=drive.wall_s,
        valid=p99 <= 0.01 * scn.target_ms * scale,
        start_delay_s=delays,
        actions=len(drive.actions),
    )


# --------------------------------------------------------------------------- the command


def prepare(
    path: str | Path,
    *,
    trace: str | None = None,
    seed: int | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
    scale: float = DEFAULT_SCALE,
    warmup_s: float | None = None,
    setup_s: float | None = None,
    max_servers: int | None = None,
    data_dir: str | Path | None = None,
) -> PoolScenario:
    """The window of a pool scenario a replay measures: its trace (the file's, or
    ``bursty`` from the seed as the swayam-traces experiment draws it, that scenario's
    default), from `start_s` for `duration_s` (default: what fits in MAX_WALL_S of wall time
    after the warm-up), with the overrides applied."""
    scn = load_pool_scenario(path, data_dir)
    if seed is not None:
        scn = replace(scn, seed=seed)
    trace = trace or ("bursty" if scn.name == "swayam-traces" else "file")
    if trace == "bursty":
        times, rates = bursty_trace(scn.seed)
        scn = replace(scn, trace_s=times, trace_rate=rates)
    elif trace != "file":
        raise ValueError(f"trace: must be 'file' or 'bursty', got {trace!r}")
    if setup_s is not None:
        scn = replace(scn, setup_s=setup_s)
    if max_servers is not None:
        scn = replace(
            scn, max_backends=max_servers, min_backends=min(scn.min_backends, max_servers)
        )
    if duration_s is None:
        warm = default_warmup_s(scn) if warmup_s is None else warmup_s
        duration_s = min(scn.duration_s - start_s, MAX_WALL_S / scale - warm)
        if duration_s <= 0:
            raise ValueError(
                f"no trace fits in {MAX_WALL_S:g} s at scale {scale:g} after {warm:g} s of "
                "warm-up: give --duration-s"
            )
    return cut_trace(scn, start_s, duration_s)


def main(argv: list[str] | None = None) -> int:
    """``python -m loadtests.swayam_live SCENARIO ...`` (also ``tailgate live pool``)."""
    import argparse

    p = argparse.ArgumentParser(
        prog="tailgate live pool", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("scenario", help="pool scenario TOML (loadtests/scenarios/swayam.toml)")
    p.add_argument("--policy", choices=POLICIES, default="swayam", help="(swayam)")
    p.add_argument(
        "--scale", type=float, default=DEFAULT_SCALE, help=f"time scale ({DEFAULT_SCALE:g})"
    )
    p.add_argument("--seed", type=int, help="seed of the requests (and of a bursty trace)")
    p.add_argument(
        "--trace",
        choices=("file", "bursty"),
        help="the scenario's own trace, or bursty_trace(seed) as swayam-traces draws it "
        "(default: bursty for swayam-traces, else file)",
    )
    p.add_argument("--start-s", type=float, default=0.0, help="replay from here (trace s, 0)")
    p.add_argument(
        "--duration-s",
        type=float,
        help=f"trace seconds to replay (default: what fits in {MAX_WALL_S:g} s of wall time)",
    )
    p.add_argument(
        "--warmup-s",
        type=float,
        help="trace seconds at the starting rate before the window, both sides, not measured "
        f"(default: {WARMUP_INTERVALS} decision intervals)",
    )
    p.add_argument("--setup-s", type=float, help="override t_setup (trace s), both sides")
    p.add_argument("--max-servers", type=int, help="cap the pool, both sides")
    p.add_argument("--data-dir", help="folder of the scenario's service-time file")
    args = p.parse_args(argv)

    def on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwind, so the gateway and its servers are stopped

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        scn = prepare(
            args.scenario,
            trace=args.trace,
            seed=args.seed,
            start_s=args.start_s,
            duration_s=args.duration_s,
            scale=args.scale,
            warmup_s=args.warmup_s,
            setup_s=args.setup_s,
            max_servers=args.max_servers,
            data_dir=args.data_dir,
        )
        run = run_pool_live(scn, args.policy, scale=args.scale, warmup_s=args.warmup_s)
    except (ValueError, OSError, RuntimeError, ConfigError) as exc:
        print(f"swayam_live: {exc}", file=sys.stderr)
        return 2
    print(run.to_text())
    return 0 if run.valid else 3


if __name__ == "__main__":
    sys.exit(main())
