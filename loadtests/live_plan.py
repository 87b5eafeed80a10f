"""A simulator scenario as a live replay: the same queries, time-scaled, as HTTP requests.

The simulator draws each scenario's workload once per seed (`loadtests.sim.workload`):
arrival times, classes, fanouts, the server of every task and its service time. A live
replay sends exactly those queries to a real gateway and real emulated task servers, with
every duration multiplied by a time scale (so a Masstree task of 0.18 ms takes 18 ms at
scale 100, where the event loop's timers are precise enough):

- query q is sent at ``arrival_ms[q] * scale`` after the start, to its class;
- it targets its tasks' servers by id (``targets.servers``), the ids the emulated servers
  register under (``PREFIX-1`` … ``PREFIX-N``, from ``tailgate taskserver --count N``);
- its payload gives each of those servers its task's service time, scaled
  (``service_ms_on``, read by the emulated executor);
- class SLOs are the scenario's, scaled; the gateway's CDF prior is the scenario's service
  law, scaled (`live_gateway_toml`).

This module only plans; it starts nothing. Pure code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from loadtests.sim.scenario import Scenario, class_priorities
from loadtests.sim.workload import make_workload

__all__ = ["LiveQuery", "live_gateway_toml", "plan_queries", "process_counts", "server_ids"]


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


def plan_queries(
    scn: Scenario, load: float, scale: float, prefix: str = "em", per_process: int = 25
) -> list[LiveQuery]:
    """The scenario's queries at this load, as the live replay sends them."""
    if not scale > 0:
        raise ValueError(f"scale: must be > 0, got {scale}")
    w = make_workload(scn, load)
    ids = np.asarray(server_ids(scn, prefix, per_process))
    names = [c.name for c in scn.classes]
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


def live_gateway_toml(
    scn: Scenario, scale: float, service_path: str, wait_estimates: bool = False
) -> str:
    """The gateway config of a replay: the scenario's classes (SLOs scaled), its admission
    control (durations scaled; a scenario without admission turns the gateway's off), one
    pool in its queueing mode and policy, with the scaled service law (from
    `service_path`) as prior; `wait_estimates`: every task's queue wait estimated."""
    if scn.servers.pools:
        raise ValueError("servers.pools: a live replay runs one pool of equal servers so far")
    prio = class_priorities(scn)
    lines = [
        "[gateway]",
        'storage_url = ""',
        *(["wait_estimates = true"] if wait_estimates else []),
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
