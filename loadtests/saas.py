"""Load driver of the Sensing-as-a-Service scenario (TailGuard's Pi testbed).

Three query classes over edge agents in four clusters (server-room, wet-lab, faculty, gta);
each class's SLO (percentile and latency) is read from the gateway's GET /v1/classes at the
start of a run (deploy/saas.toml gives A p99 <= 800 ms, B 1300 ms, C 1800 ms):

- A (50%): one agent; 80% in server-room, the rest a random agent elsewhere;
- B (40%): fanout 4, one random agent per cluster;
- C (10%): fanout 32, every agent.

Each query reads 1 to 30 days (uniform) of temperature readings from a random start within
the agents' 18 months. Arrivals are Poisson at a given rate for a bounded time; every query
is bounded by its SLO plus the gateway's grace, so a run ends.

    python -m loadtests.saas run --gateway URL --rate 10 --duration 60
    python -m loadtests.saas maxrate --seeds 1,2,3 --agents-per-process 8 --read-sample 0.05

`run` drives a running gateway; `maxrate` starts `tailgate up --config deploy/saas.toml
--edge-agents 32 --agents-per-process 8` (dense agents) once per queue policy and seed,
and bisects the highest rate at which every class meets its SLO (loadtests.saas_maxrate).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector

CLASSES = ("A", "B", "C")
"""The mix's classes; the gateway must configure each (GET /v1/classes)."""
SHARES = (("A", 0.5), ("B", 0.4), ("C", 0.1))
HOME_CLUSTER = "server-room"
RETENTION_DAYS = 540
"""Starts are drawn this far back at most (inside the agents' 18-month retention)."""


class GatewayClassesError(RuntimeError):
    """The gateway's GET /v1/classes could not be read or lacks a class of the mix."""


@dataclass(frozen=True)
class ClassSlo:
    """One class's SLO as the gateway has it: the percentile's latency within latency_ms."""

    percentile: float
    latency_ms: float


@dataclass
class ClassStats:
    """What one class's queries did."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def p(self, q: float) -> float:
        """The q-th percentile latency of answered queries (inverted CDF), nan if none."""
        if not self.latencies_ms:
            return math.nan
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


@dataclass
class RunReport:
    """One run at one rate."""

    rate_per_s: float
    duration_s: float
    classes: dict[str, ClassStats]
    slos: dict[str, ClassSlo]
    """Class -> its SLO, from the gateway's GET /v1/classes."""
    tasks: int = 0
    missed_tasks: int = 0
    busy_ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @property
    def miss_ratio(self) -> float:
        """Task deadline-miss ratio over answered queries."""
        return self.missed_tasks / self.tasks if self.tasks else 0.0

    def met(self, cls: str) -> bool:
        """The class's SLO percentile is within its latency and none of its queries failed."""
        s, slo = self.classes[cls], self.slos[cls]
        return bool(s.latencies_ms) and not s.errors and s.p(slo.percentile) <= slo.latency_ms

    @property
    def all_met(self) -> bool:
        """Every class meets its SLO."""
        return all(self.met(c) for c in CLASSES)

    def utilisation(self, agents: int) -> float:
        """Mean agent busy share: service time of answered tasks over agents x duration."""
        return sum(self.busy_ms.values()) / (agents * self.duration_s * 1000.0) if agents else 0.0

    def to_json(self, agents: int) -> dict[str, Any]:
        """Plain figures for printing or files."""
        return {
            "rate_per_s": self.rate_per_s,
            "duration_s": self.duration_s,
            "all_met": self.all_met,
            "task_miss_ratio": round(self.miss_ratio, 5),
            "agent_utilisation": round(self.utilisation(agents), 4),
            "classes": {
                c: {
                    "percentile": self.slos[c].percentile,
                    "slo_ms": self.slos[c].latency_ms,
                    "at_percentile_ms": round(s.p(self.slos[c].percentile), 1),
                    "p99_ms": round(s.p(99), 1),
                    "p50_ms": round(s.p(50), 1),
                    "answered": len(s.latencies_ms),
                    "errors": dict(s.errors),
                    "met": self.met(c),
                }
                for c, s in self.classes.items()
            },
        }


def make_query(rng: random.Random, now: datetime) -> dict[str, Any]:
    """One query of the mix: its class, targets and sensing task."""
    u = rng.random()
    cls = "A" if u < SHARES[0][1] else "B" if u < SHARES[0][1] + SHARES[1][1] else "C"
    if cls == "A":
        if rng.random() < 0.8:
            targets: dict[str, Any] = {"pool": "edge", "cluster": HOME_CLUSTER, "fanout": 1}
        else:
            targets = {"pool": "edge", "exclude_cluster": HOME_CLUSTER, "fanout": 1}
    elif cls == "B":
        targets = {"pool": "edge", "per_cluster": 1}
    else:
        targets = {"pool": "edge", "all": True}
    days = rng.uniform(1.0, 30.0)
    start = now - timedelta(days=rng.uniform(days, RETENTION_DAYS))
    end = start + timedelta(days=days)
    task = {"op": "range", "sensor": "temperature", "start": _iso(start), "end": _iso(end)}
    return {"class": cls, "targets": targets, "task": task}


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def fetch_slos(session: ClientSession, url: str) -> dict[str, ClassSlo]:
    """The SLO of each class of the mix from GET /v1/classes; GatewayClassesError if one lacks."""
    endpoint = url.rstrip("/") + "/v1/classes"
    try:
        async with session.get(endpoint) as resp:
            resp.raise_for_status()
            answer = await resp.json()
        have = {
            str(c["name"]): ClassSlo(float(c["percentile"]), float(c["latency_ms"]))
            for c in answer["classes"]
        }
    except (ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
        raise GatewayClassesError(
            f"cannot read the classes at {endpoint}: {type(exc).__name__}: {exc}"
        ) from exc
    missing = [c for c in CLASSES if c not in have]
    if missing:
        raise GatewayClassesError(
            f"gateway at {url} lacks class(es) {missing} of the SaaS mix (it has "
            f"{sorted(have)}): start it with --config deploy/saas.toml"
        )
    return {c: have[c] for c in CLASSES}


async def drive(
    url: str, rate_per_s: float, duration_s: float, *, seed: int = 1, warmup_s: float = 0.0
) -> RunReport:
    """Poisson arrivals at rate_per_s for warmup_s + duration_s; stats after the warm-up.

    The classes' SLOs come from the gateway first (`fetch_slos`).
    """
    rng = random.Random(seed)
    async with ClientSession(timeout=ClientTimeout(total=10.0)) as session:
        slos = await fetch_slos(session, url)
    report = RunReport(rate_per_s, duration_s, {c: ClassStats() for c in CLASSES}, slos)
    endpoint = url.rstrip("/") + "/v1/queries"
    # Every query ends by its SLO plus the gateway's grace; this only guards a dead gateway.
    timeout = ClientTimeout(total=max(s.latency_ms for s in slos.values()) / 1000.0 + 30.0)
    pending: set[asyncio.Task[None]] = set()

    async def one(session: ClientSession, body: dict[str, Any], counted: bool) -> None:
        stats = report.classes[body["class"]]
        t0 = time.perf_counter()
        try:
            async with session.post(endpoint, json=body) as resp:
                answer = await resp.json()
                status = resp.status
        except (ClientError, TimeoutError, json.JSONDecodeError) as exc:
            if counted:
                stats.errors[type(exc).__name__] += 1
            return
        if not counted:
            return
        if status != 200:
            code = (
                answer.get("error", {}).get("code", str(status))
                if isinstance(answer, dict)
                else str(status)
            )
            stats.errors[code] += 1
            return
        stats.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        for task in answer.get("tasks", ()):
            report.tasks += 1
            report.missed_tasks += bool(task.get("missed_deadline"))
            report.busy_ms[task.get("server", "?")] += float(task.get("service_ms") or 0.0)

    connector = TCPConnector(limit=0)
    async with ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()
        due = 0.0
        stop = warmup_s + duration_s
        while True:
            due += rng.expovariate(rate_per_s)
            if due >= stop:
                break
            delay = start + due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = make_query(rng, datetime.now(UTC))
            task = asyncio.create_task(one(session, body, due >= warmup_s))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)
    return report


def format_report(r: RunReport, agents: int) -> str:
    """A few lines per run."""
    lines = [
        f"rate {r.rate_per_s:g} q/s for {r.duration_s:g} s: "
        f"{'all classes meet their SLOs' if r.all_met else 'SLO missed'}; "
        f"task miss ratio {r.miss_ratio:.2%}; agent utilisation {r.utilisation(agents):.1%}"
    ]
    for c, s in r.classes.items():
        errs = f", errors {dict(s.errors)}" if s.errors else ""
        slo = r.slos[c]
        lines.append(
            f"  {c}: p{slo.percentile:g} {s.p(slo.percentile):7.1f} ms (SLO {slo.latency_ms:g}) "
            f"p50 {s.p(50):6.1f} ms, "
            f"{len(s.latencies_ms)} answered{errs} {'ok' if r.met(c) else 'MISSED'}"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # the CLI lives in loadtests.saas_cli (it also runs maxrate)
    from loadtests.saas_cli import main

    sys.exit(main())
