"""Per-class and per-fanout-type tail latencies of a run, as text and JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadtests.sim.engine import SimResult


@dataclass(frozen=True, slots=True)
class TailStat:
    """The p-th percentile latency of a group of queries against its SLO."""

    latency_ms: float
    slo_ms: float
    samples: int
    enough: bool
    """At least `min_tail_samples` samples lie beyond the percentile."""

    @property
    def met(self) -> bool:
        """The percentile is within the SLO (whether or not it could be judged)."""
        return self.latency_ms <= self.slo_ms

    @property
    def verdict(self) -> str:
        """ "met", "not met" or "unjudged" (too few samples beyond the percentile)."""
        if not self.enough:
            return "unjudged"
        return "met" if self.met else "not met"

    def needed(self, percentile: float) -> int:
        """Samples this group needs to be judged at `percentile`."""
        return math.ceil(MIN_TAIL_SAMPLES / (1.0 - percentile / 100.0))


MIN_TAIL_SAMPLES = 10
"""A percentile is judged only with this many samples beyond it (10 for p99 = 1,000)."""


def thin_group(cls: str, fanout_type: str, samples: int, percentile: float) -> str:
    """How every warning names a group too thin to judge (fanout type "all": the class)."""
    beyond = int(samples * (1.0 - percentile / 100.0))
    needed = math.ceil(MIN_TAIL_SAMPLES / (1.0 - percentile / 100.0))
    group = f"class {cls}" if fanout_type == "all" else f"class {cls} k={fanout_type}"
    return (
        f"{group} had {beyond:,} < {MIN_TAIL_SAMPLES} queries beyond its p{percentile:g} "
        f"({samples:,} queries, {needed:,} needed)"
    )


def percentile(values: np.ndarray, p: float) -> float:
    """The p-th percentile: the smallest value with at least p% of samples at or below it."""
    if values.size == 0:
        return math.nan
    return float(np.percentile(values, p, method="inverted_cdf"))


def _tail(values: np.ndarray, p: float, slo_ms: float) -> TailStat:
    n = int(values.size)
    enough = n * (1.0 - p / 100.0) >= MIN_TAIL_SAMPLES
    return TailStat(percentile(values, p), slo_ms, n, enough)


def fanout_type_index(res: SimResult) -> np.ndarray:
    """Index of each measured query's fanout type (by the scenario's type edges)."""
    edges = np.asarray(res.scenario.fanout.edges())
    return np.searchsorted(edges, res.fanout, side="right") - 1


@dataclass(frozen=True, slots=True)
class Report:
    """Tail latency per class and per (class, fanout type)."""

    result: SimResult
    classes: dict[str, TailStat]
    fanout_types: dict[str, dict[str, TailStat]]

    def groups(self) -> list[tuple[str, str, TailStat]]:
        """(class, fanout type or "all", stat) of every group the verdict judges."""
        out = [(c, "all", s) for c, s in self.classes.items()]
        out += [(c, k, s) for c, types in self.fanout_types.items() for k, s in types.items()]
        return out

    @property
    def verdict(self) -> str:
        """ "not met" if a judged group misses its SLO, else "unjudged" if a group had too
        few samples beyond its percentile to be judged, else "met". A group never judged
        is never called met."""
        stats = [s for _, _, s in self.groups()]
        if any(s.verdict == "not met" for s in stats):
            return "not met"
        if any(s.verdict == "unjudged" for s in stats):
            return "unjudged"
        return "met"

    @property
    def met(self) -> bool:
        """Every class and every fanout type within a class was judged and meets its SLO."""
        return self.verdict == "met"

    def unjudged(self) -> list[tuple[str, str, int, int]]:
        """(class, fanout type, samples, samples needed) of each group too thin to judge."""
        pct = {c.name: c.percentile for c in self.result.scenario.classes}
        return [(c, k, s.samples, s.needed(pct[c])) for c, k, s in self.groups() if not s.enough]

    def warning(self) -> str:
        """A line saying which groups went unjudged, or "" when all were judged."""
        thin = self.unjudged()
        if not thin:
            return ""
        pct = {c.name: c.percentile for c in self.result.scenario.classes}
        worst = max(need / max(n, 1) for _, _, n, need in thin)
        groups = "; ".join(thin_group(c, k, n, pct[c]) for c, k, n, _ in thin)
        return f"UNJUDGED: {groups}; not called met: run about {worst:.1f}x the queries"

    def to_json(self) -> dict[str, Any]:
        """The `sim run --json` document."""
        r = self.result
        return {
            "scenario": r.scenario.name,
            "policy": r.policy,
            "offered_load": r.load,
            "accepted_load": r.accepted_load,
            "miss_ratio": r.miss_ratio,
            "utilisation": r.utilisation,
            "tasks": r.tasks,
            "queries": int(r.latency_ms.size),
            "rejected_queries": r.rejected_queries,
            "admission_rejected": r.admission_rejected,
            "scaling": r.scaling,
            "met": self.met,
            "verdict": self.verdict,
            "unjudged": [
                {"class": c, "fanout_type": k, "samples": n, "needed": need}
                for c, k, n, need in self.unjudged()
            ],
            "classes": {
                name: {
                    "percentile": _class(r, name).percentile,
                    "latency_ms": s.latency_ms,
                    "slo_ms": s.slo_ms,
                    "met": s.met,
                    "judged": s.enough,
                    "samples": s.samples,
                }
                for name, s in self.classes.items()
            },
            "fanout_types": {
                name: {
                    k: {
                        "latency_ms": s.latency_ms,
                        "met": s.met,
                        "samples": s.samples,
                        "judged": s.enough,
                    }
                    for k, s in types.items()
                }
                for name, types in self.fanout_types.items()
            },
        }

    def to_text(self) -> str:
        """A human-readable table."""
        r = self.result
        lines = [
            f"{r.scenario.name}: policy {r.policy}, offered load {r.load:.3f}, accepted "
            f"{r.accepted_load:.3f}, utilisation {r.utilisation:.3f}, task miss ratio "
            f"{r.miss_ratio:.4%} ({r.tasks:,} tasks, {r.latency_ms.size:,} queries"
            + (f", {r.admission_rejected:,} rejected by admission" if r.admission_rejected else "")
            + ")",
            f"{'class':<8} {'type':>10} {'pctl':>6} {'latency ms':>11} {'SLO ms':>8} "
            f"{'met':>4} {'samples':>9}",
        ]
        for name, s in self.classes.items():
            p = _class(r, name).percentile
            lines.append(
                f"{name:<8} {'all':>10} {p:>6g} {s.latency_ms:>11.4f} {s.slo_ms:>8g} "
                f"{ ({'met': 'yes', 'not met': 'NO'}.get(s.verdict, 'n/a')):>4} {s.samples:>9,}"
            )
            for k, t in self.fanout_types[name].items():
                flag = ("yes" if t.met else "NO") if t.enough else "n/a"
                lines.append(
                    f"{'':<8} {'k=' + k:>10} {p:>6g} {t.latency_ms:>11.4f} {t.slo_ms:>8g} "
                    f"{flag:>4} {t.samples:>9,}"
                )
        verdict = self.verdict
        if verdict == "met":
            lines.append("all classes and fanout types meet their SLOs")
        elif verdict == "not met":
            lines.append("SLO NOT met")
        else:
            lines.append("no verdict: " + self.warning())
        return "\n".join(lines)


def _class(res: SimResult, name: str) -> Any:
    return next(c for c in res.scenario.classes if c.name == name)


def report(res: SimResult) -> Report:
    """Compute the tail statistics of a run."""
    scn = res.scenario
    types = fanout_type_index(res)
    names = scn.fanout.type_names()
    classes: dict[str, TailStat] = {}
    by_type: dict[str, dict[str, TailStat]] = {}
    for ci, c in enumerate(scn.classes):
        mine = res.cls == ci
        classes[c.name] = _tail(res.latency_ms[mine], c.percentile, c.slo_ms)
        by_type[c.name] = {}
        for ti, tname in enumerate(names):
            sel = mine & (types == ti)
            if np.any(sel):
                by_type[c.name][tname] = _tail(res.latency_ms[sel], c.percentile, c.slo_ms)
    return Report(res, classes, by_type)
