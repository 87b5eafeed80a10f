"""Query mixes and per-class SLO accounting for the Locust users (locust is not imported here).

The mixes are the ones the README describes: emulated tasks over pool ``default`` with
fanout 1, 10 and all; the Sensing-as-a-Service A/B/C mix over pool ``edge``
(``loadtests.saas.make_query``); and single-task queries to an ONNX inference pipeline.

Every answer is sorted into one SLO outcome: ``met`` and ``missed`` (answered, within its
SLO or not: the gateway's ``met_slo``), ``rejected`` (503: admission control, a server or
cluster down, a server's full queue), ``dropped`` (503 ``task_dropped``: a pipeline shed
it), ``timeout`` (504) and ``failed`` (anything else). A class meets its SLO when the
share of its judged queries (met, missed, timeout, failed) that met it reaches the
class's percentile; rejected and dropped queries are reported beside it, not judged. A
class with fewer than 100/(100 - p) judged queries (100 for p99) is left undecided: so
few queries allow no miss at all, and one slow query would decide the verdict.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "JUDGED",
    "OUTCOMES",
    "ClassTally",
    "Outcome",
    "classify",
    "fanout_query",
    "format_summary",
    "pipeline_query",
]

OUTCOMES = ("met", "missed", "rejected", "dropped", "timeout", "failed")
JUDGED = ("met", "missed", "timeout", "failed")
"""Outcomes that count against a class's percentile target."""

FANOUTS = {"fanout 1": ("A", 1), "fanout 10": ("A", 10), "fanout all": ("B", None)}
"""Fanout mix: request name -> (class, fanout; None: every server of the pool)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one query."""

    name: str
    """One of OUTCOMES."""
    ok: bool
    """The gateway answered as designed (200 or 503): not a failure of the load test."""
    latency_ms: float | None
    """The gateway's own latency for an answered query, else None."""
    message: str = ""


def classify(status: int, answer: Any, error: str = "") -> Outcome:
    """Sort one HTTP answer (status 0: no answer, `error` says why) into an SLO outcome."""
    body = answer if isinstance(answer, dict) else {}
    err = body.get("error") if isinstance(body.get("error"), dict) else {}
    code = str(err.get("code") or status)
    if status == 200:
        met = body.get("met_slo") is True
        latency = body.get("latency_ms")
        latency_ms = float(latency) if isinstance(latency, int | float) else None
        return Outcome("met" if met else "missed", True, latency_ms)
    if status == 503:
        reason = body.get("reason") or code
        return Outcome("dropped" if code == "task_dropped" else "rejected", True, None, reason)
    if status == 0:
        return Outcome("failed", False, None, error or "no answer")
    message = f"HTTP {status} {code}: {err.get('message') or ''}".strip()
    return Outcome("timeout" if status == 504 else "failed", False, None, message)


def fanout_query(name: str, pool: str, pool_size: int, service_ms: float | None = None) -> dict:
    """One query of the fanout mix; fanout 10 shrinks to the pool's size when smaller."""
    cls, fanout = FANOUTS[name]
    targets: dict[str, Any] = {"pool": pool}
    if fanout is None:
        targets["all"] = True
    else:
        targets["fanout"] = max(1, min(fanout, pool_size))
    task = {} if service_ms is None else {"service_ms": service_ms}
    return {"class": cls, "targets": targets, "task": task}


def pipeline_query(
    rng: random.Random, pool: str, slo_ms: float, percentile: float = 99.0
) -> dict[str, Any]:
    """One inference request: a synthetic frame for one pipeline server of the pool."""
    return {
        "slo": {"percentile": percentile, "latency_ms": slo_ms},
        "targets": {"pool": pool, "fanout": 1},
        "task": {"image_seed": rng.randrange(1 << 30)},
    }


@dataclass
class ClassTally:
    """One class's outcomes over a run, and its SLO target."""

    name: str
    counts: dict[str, int] = field(default_factory=dict)
    percentile: float | None = None
    """The class's percentile target (None: unknown)."""
    slo_ms: float | None = None
    latency_p_ms: float | None = None
    """The percentile's latency over answered queries, when known."""

    @property
    def judged(self) -> int:
        """Queries that count against the target."""
        return sum(self.counts.get(k, 0) for k in JUDGED)

    @property
    def met_share(self) -> float:
        """Share of judged queries that met the SLO (nan if none)."""
        return self.counts.get("met", 0) / self.judged if self.judged else math.nan

    @property
    def min_judged(self) -> int | None:
        """Judged queries needed before a verdict (None: no target)."""
        if self.percentile is None:
            return None
        # Fewer than 100/(100-p) queries allow no miss at all: one slow query would decide.
        return math.ceil(100.0 / (100.0 - self.percentile) - 1e-9)

    @property
    def meets(self) -> bool | None:
        """Whether the class met its SLO (None: no target, or too few judged to tell)."""
        needed = self.min_judged
        if needed is None or self.judged < needed:
            return None
        return self.met_share >= self.percentile / 100.0 - 1e-12


def format_summary(tallies: Mapping[str, ClassTally]) -> str:
    """The per-class SLO summary printed when a run stops."""
    lines = ["Per-class SLO summary (outcomes of every query, as the gateway answered them)"]
    for name in sorted(tallies):
        t = tallies[name]
        counts = ", ".join(f"{k} {t.counts.get(k, 0)}" for k in OUTCOMES if t.counts.get(k))
        target = (
            f"target p{t.percentile:g} <= {t.slo_ms:g} ms"
            if t.percentile is not None and t.slo_ms is not None
            else "target unknown"
        )
        share = "n/a" if math.isnan(t.met_share) else f"{t.met_share:.2%}"
        verdict = {True: "MEETS its SLO", False: "MISSES its SLO", None: "not judged"}[t.meets]
        if t.meets is None and t.judged and t.min_judged is not None:
            verdict = f"not judged (fewer than {t.min_judged} judged queries)"
        p = (
            f", p{t.percentile:g} {t.latency_p_ms:.1f} ms"
            if t.latency_p_ms is not None and t.percentile is not None
            else ""
        )
        lines.append(
            f"  class {name}: {counts or 'no queries'}; met {share} ({target}{p}): {verdict}"
        )
    return "\n".join(lines)
