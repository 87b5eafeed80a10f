"""Admission control in the query path: the asyncio shell around `admission.AdmissionGate`.

Everything that decides admit / reject / defer lives in the gate (TailGuard §III.D); here a
DEFER becomes a sleep and a REJECT becomes `Unavailable` (503 with Retry-After, added by
gateway.app): naming the miss ratio and threshold with the time the window's misses age
out (`AdmissionGate.release_after_s`), or, for the predictive rule (QLM §6), the predicted
probability, the level and the estimated queue wait, with a retry time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from admission import Action, AdmissionGate, Decision, QueryInfo
from gateway.errors import Unavailable

__all__ = ["PREDICTED_MISS", "admit", "log_overload_change"]

log = logging.getLogger(__name__)

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
        controller = gate.controller
        was, since = controller.overloaded, controller.overloaded_since
        d = gate.decide(q, queue_pressure)
        if controller.overloaded != was:  # the rule's state changes only in decide()
            log_overload_change(gate, q, since)
        if d.action is Action.ADMIT:
            return d.reason, q.waited_s
        if d.action is Action.REJECT:
            if d.reason == PREDICTED_MISS:
                raise _predicted_miss(gate, q, d)
            p = gate.pressure()
            threshold = gate.controller.threshold
            extra: dict[str, object] = {
                "reason": d.reason,
                "miss_ratio": p.miss_ratio,
                "threshold": threshold,
                "class": q.cls,
            }
            release_s = gate.release_after_s()
            if release_s is not None:
                # Retry-After from the window: when its misses age out (gateway.app).
                extra["retry_after_s"] = round(release_s, 3)
            raise Unavailable(
                f"admission control rejected the query ({d.reason}): task deadline-miss "
                f"ratio {p.miss_ratio:.2%} over the last window, threshold {threshold:.2%}",
                code="admission_rejected",
                extra=extra,
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


_WHAT_IT_DOES = {
    "cost-ladder": "deferring and rejecting queries by cost",
    "throttle": "throttling admissions",
    "predictive": "rejecting queries predicted to miss their SLO",
}


def log_overload_change(gate: AdmissionGate, q: QueryInfo, since: float | None) -> None:
    """Log, once per transition, that the gate's rule began or stopped turning queries away;
    `since` is when the overload that ends began (overloaded_since before the decision)."""
    c = gate.controller
    rule = str(c.rule)
    ratio = gate.pressure().miss_ratio
    extra = {"class": q.cls, "rule": rule, "miss_ratio": ratio}
    if c.overloaded:
        what = _WHAT_IT_DOES.get(rule, "rejecting or deferring queries")
        log.warning(
            "admission: overload began (rule %s, %s): task deadline-miss ratio %.2f%%, "
            "threshold %.2f%% (at a query of class %s)",
            rule,
            what,
            100 * ratio,
            100 * c.threshold,
            q.cls,
            extra={**extra, "outcome": "overload"},
        )
        return
    lasted = "" if since is None else f" after {gate.clock() - since:.1f} s"
    log.info(
        "admission: overload ended%s (rule %s): task deadline-miss ratio %.2f%%, release "
        "threshold %.2f%%; admitting queries again",
        lasted,
        rule,
        100 * ratio,
        100 * c.release_threshold,
        extra={**extra, "outcome": "admitting"},
    )
