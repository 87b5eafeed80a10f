"""A simulator scenario as a live replay: the same queries, time-scaled, as HTTP requests.

The simulator draws each scenario's workload once per seed (`loadtests.sim.workload`):
arrival times, classes, fanouts, the server of every task and its service time. A live
replay sends those queries to a real gateway and real emulated task servers, with every
duration multiplied by a time scale (so a Masstree task of 0.18 ms takes 18 ms at scale
100, where the event loop's timers are precise enough):

- query q is sent at ``arrival_ms[q] * scale`` after the start, to its class;
- the emulated servers register under ``PREFIX-1`` … ``PREFIX-N`` (from ``tailgate
  taskserver --count N``), all in the gateway's one pool ``default``;
- class SLOs are the scenario's, scaled; the gateway's CDF prior is the scenario's service
  law, scaled (`live_gateway_toml`).

Who picks a query's servers depends on the scenario (`gateway_picks`):

- *As drawn* (no ``[[servers.pools]]`` and ``pick = "random"``): the query targets its
  tasks' servers by id (``targets.servers``), and its payload gives each of them its task's
  drawn service time, scaled (``service_ms_on``, read by the emulated executor): the
  simulator's very tasks, line by line.
- *By the gateway* (pools of servers, or ``pick = "least-wait"``): the query targets
  ``{"pool": "default", "fanout": k}`` and the gateway's own pick (random, or least-wait:
  the gateway pool gets the scenario's ``pick``) chooses the k servers, as the simulator's
  planner does, from the state it sees. The plan cannot know which servers those are, so
  the payload gives every one of the N servers a service time: for server s, a base draw
  for (query, s) from the scenario's service law, times the ``service_scale`` of s's pool,
  times the time scale. A slow server is slow only because its payload entry says so; the
  gateway learns each server's law online (pool ``cdf = "per-server"``) from its results,
  starting from the law's own prior (see POOLED_CDF_WINDOW). The base draws come from
  their own generator seeded from the scenario's seed, independent of the load, the pick
  and the queue policy, so a random and a least-wait replay see the same time for the same
  (query, server): common random numbers, as in the simulator. They are not the
  simulator's per-task draws (which follow its own pick), so live and simulated queries
  compare as distributions, not one by one.

This module only plans; it starts nothing. Pure code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from loadtests.sim.scenario import Scenario, class_priorities
from loadtests.sim.workload import Workload, make_workload, sample_service_ms

__all__ = [
    "LiveQuery",
    "gateway_picks",
    "live_gateway_toml",
    "plan_queries",
    "pool_of_servers",
    "process_counts",
    "server_ids",
]

SERVICE_STREAM = 0x6C697665
"""Mixed into the scenario's seed for the per-(query, server) base draws, so that they are a
stream of their own, not a repeat of the workload's (which starts from the bare seed)."""

POOLED_CDF_WINDOW = 256
"""The gateway's per-server CDF window (results) when the scenario's pools differ in speed
from its service law. Every server starts from the law's own prior (``service_scale`` 1);
with the gateway's default window (4096) a server of a slow pool would still be mostly
prior after a whole replay (a 20,000-query replay of the least-wait scenario gives a server
~360 tasks), and least-wait would rank the pools as nearly equally fast. A server's results
fill 256 slots within such a replay; until then its estimates mix in the prior."""
POOLED_CDF_REFRESH = 16
"""Results between rebuilds of a server's CDF (and its moments) with POOLED_CDF_WINDOW."""


@dataclass(frozen=True, slots=True)
class LiveQuery:
    """One query of the replay."""

    at_s: float
    """When to send it, after the start of the replay (wall seconds, scaled)."""
    cls: str
    fanout: int
    body: dict[str, Any]
    """The POST /v1/queries body."""


def process_counts(n: int, per_process: int) -> list[int]:
    """How many of n emulated servers each process hosts (at most per_process each)."""
    if n < 1 or per_process < 1:
        raise ValueError(f"servers: need n >= 1 and per_process >= 1, got {n}, {per_process}")
    k = -(-n // per_process)
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def server_ids(scn: Scenario, prefix: str, per_process: int = 25) -> list[str]:
    """The ids of the scenario's N servers as the replay's processes name them: process p
    runs ``tailgate taskserver --id PREFIX-p --count n_p``, whose servers are
    ``PREFIX-p-1`` … (``PREFIX-p`` alone when n_p is 1)."""
    ids: list[str] = []
    for p, n in enumerate(process_counts(scn.servers.count, per_process), start=1):
        ids += [f"{prefix}-{p}"] if n == 1 else [f"{prefix}-{p}-{i + 1}" for i in range(n)]
    return ids


def pool_of_servers(scn: Scenario, prefix: str, per_process: int = 25) -> dict[str, str]:
    """Each server id's scenario pool (``default`` for a scenario without pools); servers
    are numbered pool by pool, in the scenario's order, as the simulator numbers them."""
    ids = server_ids(scn, prefix, per_process)
    names = [p.name for p in scn.servers.pools for _ in range(p.count)] or ["default"] * len(ids)
    return dict(zip(ids, names, strict=True))


def gateway_picks(scn: Scenario) -> bool:
    """Whether the gateway, not the plan, picks each query's servers: a scenario with pools
    of servers (whose speeds may differ) or with ``pick = "least-wait"``."""
    return bool(scn.servers.pools) or scn.run.pick == "least-wait"


def plan_queries(
    scn: Scenario, load: float, scale: float, prefix: str = "em", per_process: int = 25
) -> list[LiveQuery]:
    """The scenario's queries at this load, as the live replay sends them: to the servers
    the simulator drew, or to the gateway's pick with a service time for every server
    (`gateway_picks`)."""
    if not scale > 0:
        raise ValueError(f"scale: must be > 0, got {scale}")
    w = make_workload(scn, load)
    names = [c.name for c in scn.classes]
    if gateway_picks(scn):
        return _gateway_picked(scn, w, names, scale, prefix, per_process)
    ids = np.asarray(server_ids(scn, prefix, per_process))
    out: list[LiveQuery] = []
    for q in range(w.queries):
        lo, hi = int(w.offsets[q]), int(w.offsets[q + 1])
        servers = ids[w.task_server[lo:hi]].tolist()
        service = (w.task_service_ms[lo:hi] * scale).round(6).tolist()
        cls = names[int(w.cls[q])]
        body = {
            "class": cls,
            "targets": {"servers": servers},
            "task": {"service_ms_on": dict(zip(servers, service, strict=True))},
        }
        out.append(LiveQuery(float(w.arrival_ms[q]) * scale / 1000.0, cls, hi - lo, body))
    return out


def _gateway_picked(
    scn: Scenario, w: Workload, names: list[str], scale: float, prefix: str, per_process: int
) -> list[LiveQuery]:
    """Queries that target the pool with their fanout; each payload times every server."""
    ids = server_ids(scn, prefix, per_process)
    # One row of base draws per query, from a stream that knows nothing of load or pick;
    # row q is the same whatever the number of queries (the generator fills row by row).
    rng = np.random.default_rng([scn.run.seed, SERVICE_STREAM])
    base = sample_service_ms(scn.service, rng.random(w.queries * len(ids)))
    times = base.reshape(w.queries, len(ids)) * np.asarray(scn.servers.scales()) * scale
    times = times.round(3)  # µs of scaled time: the executor's own resolution
    out: list[LiveQuery] = []
    for q in range(w.queries):
        k = int(w.fanout[q])
        cls = names[int(w.cls[q])]
        body = {
            "class": cls,
            "targets": {"pool": "default", "fanout": k},
            "task": {"service_ms_on": dict(zip(ids, times[q].tolist(), strict=True))},
        }
        out.append(LiveQuery(float(w.arrival_ms[q]) * scale / 1000.0, cls, k, body))
    return out


def live_gateway_toml(
    scn: Scenario, scale: float, service_path: str, wait_estimates: bool = False
) -> str:
    """The gateway config of a replay: the scenario's classes (SLOs scaled), its admission
    control (durations scaled; a scenario without admission turns the gateway's off), one
    pool "default" of all N servers in its queueing mode, policy and pick, with the scaled
    service law (from `service_path`) as every server's prior and a CDF per server;
    `wait_estimates`: every task's queue wait estimated. Pools of servers whose speeds
    differ from the law's get a short CDF window (POOLED_CDF_WINDOW), so that the gateway
    learns each server's own law within the replay."""
    prio = class_priorities(scn)
    learn = bool(scn.servers.pools) and any(s != 1.0 for s in scn.servers.scales())
    lines = [
        "[gateway]",
        'storage_url = ""',
        *(["wait_estimates = true"] if wait_estimates else []),
        *(
            [f"cdf_window = {POOLED_CDF_WINDOW}", f"cdf_refresh_every = {POOLED_CDF_REFRESH}"]
            if learn
            else []
        ),
        "",
    ]
    for i, c in enumerate(scn.classes):
        lines += [
            "[[classes]]",
            f'name = "{c.name}"',
            f"latency_ms = {c.slo_ms * scale!r}",
            f"percentile = {c.percentile!r}",
            f"priority = {int(prio[i])}",
            "",
        ]
    lines += [
        "[[pools]]",
        'name = "default"',
        f'queueing = "{scn.run.queueing}"',
        f'policy = "{scn.run.policy}"',
        f'pick = "{scn.run.pick}"',
        'cdf = "per-server"',
        "",
        "[pools.prior]",
        'kind = "quantiles"',
        f"path = {service_path!r}",
        f"scale = {scn.service.scale * scale!r}",
        "",
    ]
    a = scn.admission
    lines += [
        "[admission]",
        f'policy = "{a.policy}"',
        f'rule = "{a.rule}"',
        f"threshold = {a.threshold!r}",
        *([f"release_threshold = {a.release_threshold!r}"] if a.release_threshold else []),
        f"window_tasks = {a.window_tasks}",
        f"window_s = {a.window_s * scale!r}",
        f"window_max_age_s = {a.window_max_age_s * scale!r}",
        f"max_defer_ms = {a.max_defer_ms * scale!r}",
        f"throttle_interval_s = {a.throttle_interval_s * scale!r}",
        f"throttle_gain = {a.throttle_gain!r}",
        f"throttle_min_fraction = {a.throttle_min_fraction!r}",
        f'ladder_shedding = "{a.ladder_shedding}"',
        *([f"predictive_level = {a.predictive_level!r}"] if a.predictive_level else []),
        f'predictive_backstop = "{a.predictive_backstop}"',
        "",
    ]
    # The prior's wire overhead is the simulator's model of it, scaled like every duration;
    # the live wire adds its real (unscaled) time on top, which the online CDFs then learn.
    overhead_ms = (scn.overhead.dispatch_ms + scn.overhead.return_ms) * scale
    lines.insert(lines.index("[pools.prior]"), f"prior_overhead_ms = {overhead_ms!r}")
    return "\n".join(lines)
