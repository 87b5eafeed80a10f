"""What a chaos soak does, decided before it starts: the fault schedule and the queries.

Both are pure functions of a seed (no clock, no socket), so one seed replays the same run:
the same faults on the same targets at the same offsets, and the same queries at the same
open-loop arrival times (`loadtests.soak` executes them against real processes).

Fault schedule. Three tiers of targets: task servers and edge agents (kill -9 then start
again, SIGSTOP then SIGCONT, restart by SIGTERM, partition of their link) and one of the two
gateway replicas (kill -9, stop, restart; the other replica is never faulted, so a client
always has somewhere to go). Every (tier, kind) pair comes first, once each, in a seeded
order that alternates the tiers, so even a two-minute run covers every fault; after that,
seeded random picks. Faults may overlap, within limits that keep the system answerable:
one fault per target at a time, at most `MAX_CONCURRENT` at once, and in each tier at
least one target unfaulted (edge agents and task servers) so a pool never loses every
server to the schedule alone.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "EDGE_OPS",
    "KINDS",
    "Fault",
    "PlannedQuery",
    "build_schedule",
    "plan_queries",
]

KINDS: dict[str, tuple[str, ...]] = {
    "server": ("kill", "stop", "restart", "partition"),
    "agent": ("kill", "stop", "restart", "partition"),
    "gateway": ("kill", "stop", "restart"),
}
"""The faults each tier gets. A gateway replica is not partitioned: its clients' links are
the load itself (a refused connection is what `kill` shows them)."""

HOLD_S: dict[tuple[str, str], tuple[float, float]] = {
    ("server", "kill"): (0.5, 3.0),
    ("agent", "kill"): (0.5, 3.0),
    ("gateway", "kill"): (0.5, 3.0),
    ("server", "stop"): (1.0, 5.0),
    ("agent", "stop"): (1.0, 5.0),
    ("gateway", "stop"): (0.5, 3.0),
    ("server", "partition"): (2.0, 6.0),
    ("agent", "partition"): (2.0, 6.0),
}
"""Range of a fault's hold, seconds: how long a killed process stays dead before it is started
again, a stop lasts, a partition lasts (a restart holds 0: it starts again once drained).
Stops and partitions straddle the gateway's default heartbeat timeout (3 s), so some are
noticed and routed around and some end first. A gateway stops for at most 3 s, well under a
query's client timeout (SLO + grace + 10 s), so a query sent to it is answered late, not
lost."""

RECOVER_S = 6.0
"""Time a fault's target is counted busy after its hold: a drain (at most ~3 s), a process
start, a registration and a heartbeat."""

MAX_CONCURRENT = 2
"""Faults in progress at once, at most."""

TIER_WEIGHTS = {"server": 0.45, "agent": 0.3, "gateway": 0.25}
"""How the random picks after the coverage round share out between the tiers."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled fault: at `at_s` (seconds into the run) do `kind` to `target`."""

    at_s: float
    tier: str
    kind: str
    target: str
    hold_s: float

    @property
    def busy_until_s(self) -> float:
        """When the target counts as recovered, for the schedule's overlap limits."""
        return self.at_s + self.hold_s + RECOVER_S

    def to_json(self) -> dict[str, Any]:
        """The fault as a JSON-ready dict."""
        return asdict(self)


def _coverage(rng: random.Random, tiers: Sequence[str]) -> list[tuple[str, str]]:
    """Every (tier, kind) once: each tier's kinds shuffled, the tiers taken in turn."""
    lists = {t: rng.sample(KINDS[t], len(KINDS[t])) for t in tiers}
    order = rng.sample(list(tiers), len(tiers))
    out: list[tuple[str, str]] = []
    while any(lists.values()):
        for t in order:
            if lists[t]:
                out.append((t, lists[t].pop()))
    return out


def _cap(tier: str, n: int) -> int:
    """Targets of a tier that may be faulted at once: all but one, and at least one."""
    return 1 if tier == "gateway" else max(1, n - 1)


def build_schedule(
    seed: int,
    duration_s: float,
    servers: Sequence[str],
    agents: Sequence[str],
    gateway: str,
    *,
    warmup_s: float = 10.0,
    quiet_s: float = 20.0,
    mean_gap_s: float = 15.0,
) -> list[Fault]:
    """The faults of a run of `duration_s` seconds, in time order.

    No fault starts before `warmup_s` (the system settles and the first RSS is read) or
    ends, recovery included, after ``duration_s - quiet_s`` (the last figures are read on a
    recovered system). The coverage round's faults sit in equal slots of at most
    `mean_gap_s`; the random ones follow at gaps drawn uniformly from 0.5-1.5 times it. A
    fault that would break an overlap limit waits until it would not; one that would then
    end too late is left out.
    """
    if duration_s <= 0 or mean_gap_s <= 0:
        raise ValueError(f"duration_s and mean_gap_s must be > 0, got {duration_s}, {mean_gap_s}")
    rng = random.Random(seed)
    targets = {"server": list(servers), "agent": list(agents), "gateway": [gateway]}
    tiers = [t for t in ("server", "agent", "gateway") if targets[t]]
    end_s = duration_s - quiet_s
    window_s = end_s - warmup_s
    if window_s <= 0 or not tiers:
        return []
    cover = _coverage(rng, tiers)
    # The coverage round's slots leave room for the last fault to end within the window.
    longest_s = max(hi for _, hi in HOLD_S.values()) + RECOVER_S
    slot_s = min(mean_gap_s, max(window_s - longest_s, 0.0) / len(cover))
    faults: list[Fault] = []
    t = warmup_s
    i = 0
    while True:
        if i < len(cover):
            tier, kind = cover[i]
            at = warmup_s + i * slot_s + rng.uniform(0.0, 0.5) * slot_s
        else:
            tier = rng.choices(tiers, [TIER_WEIGHTS[x] for x in tiers])[0]
            kind = rng.choice(KINDS[tier])
            at = t + mean_gap_s * rng.uniform(0.5, 1.5)
        lo, hi = HOLD_S.get((tier, kind), (0.0, 0.0))
        hold = round(rng.uniform(lo, hi), 3)
        pick = rng.random()
        i += 1
        if at >= end_s:
            break
        at = max(at, t)
        fault = _place(faults, targets, tier, kind, round(at, 3), hold, pick)
        if fault is None or fault.busy_until_s > end_s:
            t = at
            continue
        faults.append(fault)
        t = fault.at_s
    return sorted(faults, key=lambda f: f.at_s)


def _place(
    faults: list[Fault],
    targets: dict[str, list[str]],
    tier: str,
    kind: str,
    at: float,
    hold: float,
    pick: float,
) -> Fault | None:
    """The fault at the first time from `at` that keeps the overlap limits; `pick` in [0, 1)
    chooses among the targets free then."""
    starts = sorted({at, *(f.busy_until_s for f in faults if f.busy_until_s > at)})
    for t in starts:
        active = [f for f in faults if f.at_s <= t < f.busy_until_s]
        in_tier = [f for f in active if f.tier == tier]
        if len(active) >= MAX_CONCURRENT or len(in_tier) >= _cap(tier, len(targets[tier])):
            continue
        busy = {f.target for f in active}
        free = [x for x in targets[tier] if x not in busy]
        if free:
            return Fault(t, tier, kind, free[int(pick * len(free))], hold)
    return None


# -- the queries -----------------------------------------------------------------------------

EDGE_OPS = ("latest", "range")
"""Sensing tasks the edge queries carry: the latest reading, or the last ten minutes' range
(its times are filled in when the query is sent: they are relative to now)."""

CLASS_SLO_S = {"A": 0.1, "B": 0.3, "C": 1.0}
"""The built-in classes' SLO latencies (gateway defaults), for each query's client timeout."""


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    """One query of the open-loop plan."""

    at_s: float
    """Send time, seconds into the run (Poisson arrivals)."""
    pool: str
    """The target pool: default (task servers) or edge (edge agents)."""
    body: dict[str, Any]
    """The query body; an edge query's task times are filled in at send time."""
    replica: int
    """Replica (0 or 1) the client tries first; edge queries go to the pool's owner instead,
    as the client last learned it."""
    slo_s: float


def plan_queries(
    seed: int, rate_per_s: float, duration_s: float, servers: int, agents: int
) -> list[PlannedQuery]:
    """Poisson arrivals at `rate_per_s` over `duration_s`, each a query of the soak's mix.

    The mix: 70% to pool ``default`` (a quarter class A on one server, the rest class B on
    1..servers-1 random servers, so one server down leaves enough for every query), 30% to
    pool ``edge`` (class C on one agent: the latest reading or the last ten minutes), none
    of the latter without agents.
    """
    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    rng = random.Random(seed * 7919 + 1)
    out: list[PlannedQuery] = []
    t = rng.expovariate(rate_per_s)
    widest = max(1, servers - 1)
    while t < duration_s:
        replica = rng.randrange(2)
        u = rng.random()
        if agents and u < 0.3:
            op = rng.choice(EDGE_OPS)
            body: dict[str, Any] = {
                "class": "C",
                "targets": {"pool": "edge", "fanout": 1},
                "task": {"op": op, "sensor": "temperature"},
            }
            pool = "edge"
        elif servers and u < 0.475:
            body = {"class": "A", "targets": {"pool": "default", "fanout": 1}, "task": {}}
            pool = "default"
        elif servers:
            k = rng.randint(1, widest)
            body = {"class": "B", "targets": {"pool": "default", "fanout": k}, "task": {}}
            pool = "default"
        else:
            t += rng.expovariate(rate_per_s)
            continue
        out.append(PlannedQuery(round(t, 6), pool, body, replica, CLASS_SLO_S[body["class"]]))
        t += rng.expovariate(rate_per_s)
    return out
