"""Admission control in the query path: the asyncio shell around `admission.AdmissionGate`.

Everything that decides admit / reject / defer lives in the gate (TailGuard §III.D); here a
DEFER becomes a sleep and a REJECT becomes `Unavailable` (503 with Retry-After, added by
gateway.app) naming the miss ratio and threshold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from admission import Action, AdmissionGate, QueryInfo
from gateway.errors import Unavailable

__all__ = ["admit"]


async def admit(
    gate: AdmissionGate,
    q: QueryInfo,
    queue_pressure: Callable[[], float],
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> tuple[str, float]:
    """Wait out deferrals; return (reason, waited_s) when admitted, raise 503 when not."""
    while True:
        d = gate.decide(q, queue_pressure)
        if d.action is Action.ADMIT:
            return d.reason, q.waited_s
        if d.action is Action.REJECT:
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
