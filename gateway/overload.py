"""Admission control in the query path: the asyncio shell around `admission.AdmissionGate`.

Everything that decides admit / reject / defer lives in the gate (TailGuard §III.D); here a
DEFER becomes a sleep and a REJECT becomes `Unavailable` (503 with Retry-After, added by
gateway.app): naming the miss ratio and threshold, or, for the predictive rule (QLM §6),
the predicted probability, the level and the estimated queue wait, with a retry time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from admission import Action, AdmissionGate, Decision, QueryInfo
from gateway.errors import Unavailable

__all__ = ["PREDICTED_MISS", "admit"]

PREDICTED_MISS = "predicted_miss"
"""The predictive rule's reject reason (admission.rules.Predictive)."""


async def admit(
    gate: AdmissionGate,
    q: QueryInfo,
    queue_pressure: Callable[[], float],
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    rewait: Callable[[QueryInfo], QueryInfo] | None = None,
) -> tuple[str, float]:
    """Wait out deferrals; return (reason, waited_s) when admitted, raise 503 when not.

    `rewait` refreshes the query's wait prediction after each deferral (predictive rule).
    """
    while True:
        d = gate.decide(q, queue_pressure)
        if d.action is Action.ADMIT:
            return d.reason, q.waited_s
        if d.action is Action.REJECT:
            if d.reason == PREDICTED_MISS:
                raise _predicted_miss(gate, q, d)
            p = gate.pressure()
            threshold = gate.controller.threshold
            raise Unavailable(
                f"admission control rejected the query ({d.reason}): task deadline-miss "
                f"ratio {p.miss_ratio:.2%} over the last window, threshold {threshold:.2%}",
                code="admission_rejected",
                extra={
                    "reason": d.reason,
                    "miss_ratio": p.miss_ratio,
                    "threshold": threshold,
                    "class": q.cls,
                },
            )
        await sleep(d.defer_s)
        q = q.after(d.defer_s)
        if rewait is not None:
            q = rewait(q)


def _predicted_miss(gate: AdmissionGate, q: QueryInfo, d: Decision) -> Unavailable:
    """The 503 of a query predicted to miss its SLO, with its estimated wait."""
    level = gate.config.predictive_level
    if level is None:
        level = q.percentile / 100.0
    return Unavailable(
        f"admission control predicts the query misses its SLO: P(latency <= {q.slo_ms:g} ms) "
        f"= {q.meet_prob:.4g} < {level:.4g}; estimated queue wait {d.wait_ms:.2f} ms at the "
        "busiest target",
        code="admission_rejected",
        extra={
            "reason": d.reason,
            "estimated_wait_ms": round(d.wait_ms, 4),
            "retry_after_s": round(d.retry_after_s, 3),
            "meet_probability": q.meet_prob,
            "level": level,
            "class": q.cls,
        },
    )
