"""A chaos soak's report: the arithmetic over what the driver saw, the verdict, markdown.

Pure: records in, figures out (`loadtests.soak` collects the records from real processes).

What counts for a query is what its user saw at the end, after the client's own failover
(another replica on a refused or dropped connection, on 503 ``draining``, or, for the edge
pool, on 503 ``pool_owned_elsewhere``): its status and error code, or ``hung`` when a try
got no answer within the client timeout (SLO + grace + 10 s), or ``no_answer`` when every
replica it tried refused or dropped the connection.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ALLOWED_5XX",
    "EdgeCheck",
    "QueryRecord",
    "fault_windows",
    "lost_readings",
    "problems",
    "tally",
    "timeline",
    "to_markdown",
]

ALLOWED_5XX = frozenset(
    {
        # A task's server died or its link dropped with the task on it (kill, a stop or a
        # partition past the heartbeat timeout): the task fails at once.
        "502 task_failed",
        # Not complete at SLO + grace: a server stalled (stop, partition) before its
        # heartbeat timeout noticed, or a gateway that was itself stopped.
        "504 query_timeout",
        # Too few servers take queries now, or the query named one that is down.
        "503 servers_unavailable",
        "503 servers_down",
        "503 no_servers",
        "503 cluster_unavailable",
        # A replica just restarted: its servers are still registering again.
        "503 servers_registering",
        # A server refused the task: it is draining (a restart by SIGTERM).
        "503 task_rejected",
        # Admission control shed load while the miss ratio was above its threshold.
        "503 admission_rejected",
        # The client asked the replica that does not own the edge pool, and the other one
        # said the same: ownership was changing hands (an owner killed or stopped).
        "503 pool_owned_elsewhere",
        # The replica drained (restart) and the other one drained too, or could not be had.
        "503 draining",
    }
)
"""The 5xx answers the documented failure modes allow during faults (README: Faults and
hostile input, Stopping and draining, Several gateways), as "status code". A 500 is a bug;
any other code is one the documentation does not promise."""

FAULT_TAIL_S = 15.0
"""How long after a fault's hold (and the target's recovery) its errors may still show:
queries already in flight, the heartbeat timeout (3 s), reconnection back-off, and the
admission window (10 s) forgetting the misses of the fault."""


@dataclass(slots=True)
class QueryRecord:
    """One query as its user saw it, after the client's failover."""

    sent_s: float
    pool: str
    status: int = 0
    """Final HTTP status; 0 when no answer came."""
    code: str = ""
    """error.code of a 4xx/5xx answer; "" for a 2xx."""
    hung: bool = False
    """A try got no answer within the client timeout."""
    failovers: list[str] = field(default_factory=list)
    """Why the client tried the other replica, once per hop: refused, disconnected,
    draining, owner."""
    latency_s: float | None = None
    """Client-side time from the first try to the final answer."""
    met_slo: bool | None = None
    message: str = ""
    """error.message of a 4xx/5xx answer."""
    late_s: float = 0.0
    """Driver lateness: actual minus planned send time."""

    @property
    def label(self) -> str:
        """The answer as one label: 200, "503 servers_unavailable", hung, no_answer."""
        if self.hung:
            return "hung"
        if self.status == 0:
            return "no_answer"
        return str(self.status) if self.status < 400 else f"{self.status} {self.code}"


@dataclass(slots=True)
class EdgeCheck:
    """An edge agent's committed readings around a kill or restart of its process."""

    t_s: float
    agent: str
    kind: str
    committed_before: int
    """Readings readable from the store just before the signal."""
    committed_after_restart: int
    """Readings readable once the agent had started again."""
    lost: int
    """Readings committed before the signal and missing after the restart."""
    integrity_check: str
    """PRAGMA integrity_check of the store as the dead process left it ("ok")."""
    new_after_restart: int = 0
    """Readings the agent stored after it started again (0: its sampling did not resume)."""

    def to_json(self) -> dict[str, Any]:
        """The check as a JSON-ready dict."""
        return {
            "t_s": round(self.t_s, 3),
            "agent": self.agent,
            "kind": self.kind,
            "committed_before": self.committed_before,
            "committed_after_restart": self.committed_after_restart,
            "lost": self.lost,
            "integrity_check": self.integrity_check,
            "new_after_restart": self.new_after_restart,
        }


def lost_readings(before: Iterable[tuple[int, int]], after: Iterable[tuple[int, int]]) -> int:
    """Readings (sensor id, unix second) present before and missing after."""
    return len(set(before) - set(after))


def fault_windows(events: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    """Per executed fault, the time span its errors may fall in: from its start to its
    end (the hold and the target's recovery) plus `FAULT_TAIL_S`."""
    out = []
    for e in events:
        end = e.get("recovered_s")
        if end is None:
            end = e["ended_s"] + 30.0
        out.append((e["started_s"] - 0.5, end + FAULT_TAIL_S))
    return out


def _within(t: float, windows: Sequence[tuple[float, float]]) -> bool:
    return any(lo <= t <= hi for lo, hi in windows)


def tally(
    records: Sequence[QueryRecord], windows: Sequence[tuple[float, float]] = ()
) -> dict[str, Any]:
    """Queries sent, answered, by class of answer and reason, hung, failovers; and the
    non-2xx answers of queries sent outside every fault window (`fault_windows`)."""
    labels = Counter(r.label for r in records)
    c4 = {k: v for k, v in sorted(labels.items()) if k[:1] == "4"}
    c5 = {k: v for k, v in sorted(labels.items()) if k[:1] == "5"}
    ok = sum(v for k, v in labels.items() if k[:1] == "2")
    failovers = Counter(c for r in records for c in r.failovers)
    outside = Counter(
        r.label
        for r in records
        if r.label[:1] != "2" and r.label[:1] != "4" and not _within(r.sent_s, windows)
    )
    lat = sorted(r.latency_s for r in records if r.latency_s is not None and r.status == 200)
    return {
        "sent": len(records),
        "answered": sum(1 for r in records if r.status > 0),
        "2xx": ok,
        "met_slo": sum(1 for r in records if r.met_slo),
        "4xx": c4,
        "5xx": c5,
        "5xx_total": sum(c5.values()),
        "5xx_undocumented": {k: v for k, v in c5.items() if k not in ALLOWED_5XX},
        "hung": labels.get("hung", 0),
        "no_answer": labels.get("no_answer", 0),
        "failovers": dict(sorted(failovers.items())),
        "queries_with_failover": sum(1 for r in records if r.failovers),
        "errors_outside_faults": dict(sorted(outside.items())),
        "client_latency_ms_200": _quantiles_ms(lat),
        "driver_lateness_ms": _quantiles_ms(sorted(r.late_s for r in records)),
        "examples": _examples(records),
        "by_pool": {
            pool: dict(sorted(Counter(r.label for r in records if r.pool == pool).items()))
            for pool in sorted({r.pool for r in records})
        },
    }


def _examples(records: Sequence[QueryRecord]) -> dict[str, str]:
    """The first error message seen for each 4xx/5xx label."""
    out: dict[str, str] = {}
    for r in records:
        if r.status >= 400 and r.label not in out:
            out[r.label] = r.message
    return dict(sorted(out.items()))


def timeline(records: Sequence[QueryRecord], bin_s: float) -> list[dict[str, Any]]:
    """Queries by `bin_s` bin of their send time: sent, and each answer label."""
    bins: dict[int, Counter[str]] = {}
    for r in records:
        bins.setdefault(int(r.sent_s // bin_s), Counter())[r.label] += 1
    return [
        {"t_s": round(i * bin_s, 1), "sent": sum(c.values()), "labels": dict(sorted(c.items()))}
        for i, c in sorted(bins.items())
    ]


def _quantiles_ms(xs: Sequence[float]) -> dict[str, float]:
    if not xs:
        return {}
    n = len(xs)

    def at(p: float) -> float:
        return round(xs[min(n - 1, max(0, int(-(-p * n // 100)) - 1))] * 1000.0, 2)

    return {"n": n, "p50": at(50), "p99": at(99), "max": round(xs[-1] * 1000.0, 2)}


def problems(report: dict[str, Any]) -> list[str]:
    """What makes the run fail: hung queries, queries no replica answered, 5xx outside the
    documented failure modes, a process that did not start again, lost readings, an agent
    that stored nothing after its restart, a failed integrity check."""
    out: list[str] = []
    q = report["queries"]
    if q["hung"]:
        out.append(f"{q['hung']} queries hung (no answer within the client timeout)")
    if q["no_answer"]:
        out.append(f"{q['no_answer']} queries got no answer from either replica")
    if q["5xx_undocumented"]:
        out.append(f"5xx outside the documented failure modes: {q['5xx_undocumented']}")
    for e in report["events"]:
        if e.get("start_failed"):
            out.append(f"{e['target']} after {e['kind']} at {e['started_s']:.1f} s: {e['note']}")
    for c in report["edge_checks"]:
        if c["lost"]:
            out.append(f"{c['agent']}: {c['lost']} committed readings lost at {c['kind']}")
        if c["integrity_check"] != "ok":
            out.append(f"{c['agent']}: integrity_check after {c['kind']}: {c['integrity_check']}")
        if not c["new_after_restart"]:
            out.append(f"{c['agent']}: stored no new reading after its {c['kind']}")
    for name, chk in report.get("stores", {}).items():
        if chk.get("integrity_check") != "ok":
            out.append(f"{name}: integrity_check at the end: {chk.get('integrity_check')}")
    return out


def _rss_row(name: str, r: dict[str, Any]) -> str:
    growth = r["end_mib"] - r["start_mib"] if r.get("end_mib") is not None else None
    g = f"{growth:+.1f}" if growth is not None else "n/a"
    return (
        f"| {name} | {r['start_mib']:.1f} | {r.get('end_mib') or float('nan'):.1f} | {g} | "
        f"{r.get('max_mib') or float('nan'):.1f} | {r['restarts']} |"
    )


def to_markdown(report: dict[str, Any]) -> str:
    """The report as a markdown page."""
    c = report["config"]
    q = report["queries"]
    lines = [
        "# Chaos soak",
        "",
        f"`{c['command']}`: {c['minutes']:g} min, seed {c['seed']}, {c['rate_per_s']:g} "
        f"queries/s open-loop, {c['servers']} task servers, {c['agents']} edge agents, 2 "
        f"gateway replicas sharing `{c['history_store']}`; client timeout SLO + grace + "
        f"{c['hang_margin_s']:g} s. Verdict: **{'PASS' if report['ok'] else 'FAIL'}**.",
        "",
        "## Queries",
        "",
        "| sent | answered | 2xx | met SLO | 4xx | 5xx | hung | no answer |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {q['sent']} | {q['answered']} | {q['2xx']} | {q['met_slo']} | "
        f"{sum(q['4xx'].values())} | {q['5xx_total']} | {q['hung']} | {q['no_answer']} |",
        "",
        "5xx by reason: "
        + (", ".join(f"`{k}` {v}" for k, v in q["5xx"].items()) or "none")
        + "; 4xx by reason: "
        + (", ".join(f"`{k}` {v}" for k, v in q["4xx"].items()) or "none")
        + ".",
        "",
        "Client failovers to the other replica: "
        + (", ".join(f"{k} {v}" for k, v in q["failovers"].items()) or "none")
        + f" ({q['queries_with_failover']} queries). Errors of queries sent outside every "
        "fault window: "
        + (", ".join(f"`{k}` {v}" for k, v in q["errors_outside_faults"].items()) or "none")
        + ".",
        "",
        "Per pool: "
        + "; ".join(
            f"{pool}: " + ", ".join(f"`{k}` {v}" for k, v in labels.items())
            for pool, labels in q["by_pool"].items()
        ),
        "",
        "A message of each error answer:",
        "",
        *(f"- `{k}`: {v}" for k, v in q["examples"].items()),
        "",
    ]
    if q["client_latency_ms_200"]:
        lat = q["client_latency_ms_200"]
        late = q["driver_lateness_ms"]
        lines += [
            f"Client latency of the 200s (n = {lat['n']}): p50 {lat['p50']} ms, p99 "
            f"{lat['p99']} ms, max {lat['max']} ms. Driver lateness (actual - planned send): "
            f"p50 {late['p50']} ms, p99 {late['p99']} ms, max {late['max']} ms.",
            "",
        ]
    lines += [
        "## Gateway RSS (MiB)",
        "",
        "| replica | start | end | growth | max | restarts |",
        "|---|---:|---:|---:|---:|---:|",
        *(_rss_row(name, r) for name, r in report["gateway_rss"].items()),
        "",
        "A replica that was restarted reports its last process at the end.",
        "",
        "## Edge agents: committed readings around each kill and restart",
        "",
        "| t (s) | agent | fault | before | after restart | of them new | lost | integrity_check |",
        "|---:|---|---|---:|---:|---:|---:|---|",
        *(
            f"| {e['t_s']:.1f} | {e['agent']} | {e['kind']} | {e['committed_before']} | "
            f"{e['committed_after_restart']} | {e['new_after_restart']} | {e['lost']} | "
            f"{e['integrity_check']} |"
            for e in report["edge_checks"]
        ),
        "",
        "Before: readings readable just before the signal; after restart: once the agent "
        "stored its first new reading; lost: readings of the first set missing from the "
        "second, by (sensor, second); integrity_check: the store as the dead process left it.",
        "",
        "## Stores at the end",
        "",
        *(
            f"- {name}: integrity_check {s.get('integrity_check')}, "
            + ", ".join(f"{k} {v}" for k, v in s.items() if k != "integrity_check")
            for name, s in report["stores"].items()
        ),
        "",
        "## Faults",
        "",
        "| scheduled (s) | started (s) | kind | target | hold (s) | recovered after (s) | "
        "errors in its window | note |",
        "|---:|---:|---|---|---:|---:|---:|---|",
        *(
            f"| {e['at_s']:.1f} | {e['started_s']:.1f} | {e['kind']} | {e['target']} | "
            f"{e['hold_s']:.1f} | "
            + (
                f"{e['recovered_s'] - e['ended_s']:.1f}"
                if e.get("recovered_s") is not None
                else "not seen"
            )
            + f" | {e.get('errors', 0)} | {e.get('note', '')} |"
            for e in report["events"]
        ),
        "",
    ]
    lines += [
        "Recovered after: from the end of the hold (or the restart) until the stable "
        "replica showed the target up again (a replica: its own /readyz). Errors in its "
        f"window: 5xx, hung and unanswered queries sent from its start to {FAULT_TAIL_S:g} s "
        "after its recovery (windows of overlapping faults overlap).",
        "",
        "## Timeline",
        "",
        "| t (s) | sent | answers |",
        "|---:|---:|---|",
        *(
            f"| {b['t_s']:g} | {b['sent']} | "
            + ", ".join(f"{k} {v}" for k, v in b["labels"].items())
            + " |"
            for b in report["timeline"]
        ),
        "",
    ]
    probs = report["problems"]
    lines += ["## Problems", "", *([f"- {p}" for p in probs] or ["none"]), ""]
    return "\n".join(lines)
