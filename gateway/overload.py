"""Admission control in the query path: the miss-ratio window and the controller's shell.

Each task's deadline outcome feeds the window when the gateway learns it (TailGuard
§III.D): with its result from a task server (server queueing), at the dequeue from the
gateway's own queue (central queueing). Outcomes are counted per class as they come and
reach the window at its next read, in one step: the same as the simulator, which hands a
decision every outcome known by the query's arrival. Each new query is put to the
AdmissionController with the current pressure.
A DEFER holds the query here and asks again; a REJECT becomes a 503.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from admission import Action, AdmissionController, MissRatioWindow, Pressure, QueryInfo
from gateway.config import AdmissionConfig, GatewayConfig
from gateway.errors import Unavailable


def admission_window(a: AdmissionConfig) -> MissRatioWindow:
    """The miss-ratio window an [admission] table asks for (by task count or by time)."""
    if a.window_tasks > 0:
        return MissRatioWindow(window_tasks=a.window_tasks)
    return MissRatioWindow(window_tasks=None, window_s=a.window_s)


def admission_controller(
    a: AdmissionConfig, classes: list[str], seed: int | None = None
) -> AdmissionController:
    """The controller an [admission] table asks for; classes most protected first."""
    return AdmissionController(
        rule=a.rule if a.policy != "none" else "none",
        threshold=a.threshold,
        release_threshold=a.release_threshold,
        classes=classes,
        max_defer_s=a.max_defer_ms / 1000.0,
        throttle_interval_s=a.throttle_interval_s,
        throttle_gain=a.throttle_gain,
        throttle_min_fraction=a.throttle_min_fraction,
        seed=seed,
    )


class OverloadGuard:
    """Windowed task miss ratio, recent tails, and admit / defer / reject per query."""

    def __init__(self, config: GatewayConfig, clock: Callable[[], float]) -> None:
        a = config.admission
        self.config = config
        self.clock = clock
        self.enabled = a.policy != "none"
        self._window = admission_window(a)
        self._pending: dict[str, list[int]] = {}
        """Per class: [misses, tasks] learned since the window was last read."""
        self._last_record = -math.inf
        classes = sorted(config.classes, key=lambda c: (c.priority, c.name))
        self.controller = admission_controller(a, [c.name for c in classes])
        self.retry_after_s = config.retry_after_s
        # Recent latency/SLO per class, for the cost ladder's tail ratio.
        self._tails: dict[str, deque[float]] = {}
        self._percentile = {c.name: c.percentile for c in config.classes}
        self._tail_ratio = 0.0
        self._since_tail = 0

    def note_task(self, missed: bool, cls: str) -> None:
        """One task's deadline outcome, as the gateway learns it (cheap: a count per class)."""
        counts = self._pending.get(cls)
        if counts is None:
            counts = self._pending[cls] = [0, 0]
        counts[0] += missed
        counts[1] += 1

    def record_tasks(self, misses: int, total: int, cls: str) -> None:
        """Several tasks' outcomes of one class at once, at the current time."""
        now = self.clock()
        self._last_record = now
        self._window.record_many(misses, total, now, cls)

    @property
    def window(self) -> MissRatioWindow:
        """The miss-ratio window, with every outcome learned so far."""
        if self._pending:
            now = self.clock()
            for cls, (misses, total) in self._pending.items():
                self._window.record_many(misses, total, now, cls)
            self._pending.clear()
            self._last_record = now
        return self._window

    def record_query(self, cls: str, latency_ms: float, slo_ms: float) -> None:
        """One answered query's latency against its SLO."""
        ring = self._tails.get(cls)
        if ring is None:
            ring = self._tails[cls] = deque(maxlen=1000)
        ring.append(latency_ms / slo_ms)
        self._since_tail += 1
        if self._since_tail >= 100:  # a percentile per 100 queries, not per query
            self._since_tail = 0
            self._tail_ratio = max(
                (
                    nearest_rank(sorted(r), self._percentile.get(c, 99.0))
                    for c, r in self._tails.items()
                ),
                default=0.0,
            )

    def pressure(self, queue_pressure: float) -> Pressure:
        """The load as admission sees it now."""
        window = self.window
        now = self.clock()
        a = self.config.admission
        if a.window_tasks > 0 and now - self._last_record > a.window_max_age_s:
            # Beyond TailGuard: rejecting stops the tasks that would refresh a count
            # window, so misses older than the max age are forgotten.
            if window.count(now):
                window = self._window = admission_window(a)
        return Pressure(
            miss_ratio=window.ratio(now),
            queue_pressure=queue_pressure,
            tail_ratio=self._tail_ratio,
        )

    def clearly_admitted(self) -> bool:
        """True when no rule could turn a query away now (the common case, decided cheaply).

        reject-all and lowest-class-first admit everything while the miss ratio is at or
        below the release threshold and the controller is not in overload. The cost
        ladder also weighs queue pressure and tails, and largest-fanout-first learns the
        fanouts it sees, so those two are always asked.
        """
        c = self.controller
        if c.rule in ("cost-ladder", "largest-fanout-first") or c.overloaded:
            return False
        return self.window.ratio(self.clock()) <= c.release_threshold

    async def admit(self, q: QueryInfo, queue_pressure: Callable[[], float]) -> tuple[str, float]:
        """Wait out deferrals; return (reason, waited_s) when admitted, raise 503 when not."""
        waited = 0.0
        while True:
            d = self.controller.decide(q, self.pressure(queue_pressure()), self.clock())
            if d.action is Action.ADMIT:
                return d.reason, waited
            if d.action is Action.REJECT:
                p = self.pressure(queue_pressure())
                raise Unavailable(
                    f"admission control rejected the query ({d.reason}): task deadline-miss "
                    f"ratio {p.miss_ratio:.2%} over the last window, threshold "
                    f"{self.controller.threshold:.2%}",
                    code="admission_rejected",
                    headers={"Retry-After": str(self.retry_after_s)},
                    extra={
                        "reason": d.reason,
                        "miss_ratio": p.miss_ratio,
                        "threshold": self.controller.threshold,
                        "class": q.cls,
                    },
                )
            await asyncio.sleep(d.defer_s)
            waited += d.defer_s
            q = QueryInfo(q.cls, q.priority, q.fanout, q.slo_ms, q.unloaded_ms, waited)

    def snapshot(self) -> dict[str, Any]:
        """GET /v1/admission."""
        now = self.clock()
        a = self.config.admission
        return {
            "policy": a.policy,
            "rule": a.rule if self.enabled else "none",
            "threshold": a.threshold,
            "release_threshold": a.release_threshold or a.threshold,
            "window": {"tasks": a.window_tasks, "seconds": a.window_s, **self.window.snapshot(now)},
            "tail_ratio": self._tail_ratio,
            "controller": self.controller.snapshot(now),
        }


def nearest_rank(xs: Sequence[float], p: float) -> float:
    """Nearest-rank p-th percentile (p in (0, 100]) of an already sorted sequence; 0.0 if empty."""
    if not xs:
        return 0.0
    return xs[min(len(xs) - 1, max(0, math.ceil(p / 100.0 * len(xs)) - 1))]
