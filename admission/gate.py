"""The admission gate: everything that decides admit / reject / defer, for the gateway and the
simulator alike (TailGuard §III.D).

The gate holds the task deadline-miss window, the outcomes learned since it was last read,
the window-age reset, the recent tails and the `AdmissionController` with its rule. A shell
feeds it outcomes (`note_task` / `record_tasks`, `record_query`) and asks `decide` for each
new query, passing a callable for the queue pressure, which is read only when the rule
declares it needs it. The gateway (`gateway.overload`) turns a DEFER into a sleep and a
REJECT into a 503; the simulator (`loadtests.sim.events`) into a later event and a count.
Both call this object the same way, so a simulator result is a result about this code.

Outcomes are counted per class as they come and reach the window at its next read, in one
step stamped with that moment: a decision sees every outcome known by then.

Pure code: time comes from the injected clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from admission.config import AdmissionConfig
from admission.controller import AdmissionController
from admission.decisions import Decision, Pressure, QueryInfo, Signal
from admission.rules import CostLadder
from admission.tails import TailTracker
from admission.window import MissRatioWindow

__all__ = ["AdmissionClass", "AdmissionGate", "make_window"]


class AdmissionClass(Protocol):
    """A query class as the gate needs it (the gateway's ClassConfig is one)."""

    @property
    def name(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def percentile(self) -> float: ...


def make_window(a: AdmissionConfig) -> MissRatioWindow:
    """The miss-ratio window an [admission] table asks for (by task count or by time)."""
    if a.window_tasks > 0:
        return MissRatioWindow(window_tasks=a.window_tasks)
    return MissRatioWindow(window_tasks=None, window_s=a.window_s)


def _no_queue_pressure() -> float:
    return 0.0


class AdmissionGate:
    """Windowed task miss ratio, recent tails, and admit / defer / reject per query."""

    def __init__(
        self,
        config: AdmissionConfig,
        classes: Sequence[AdmissionClass],
        clock: Callable[[], float],
        seed: int | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.enabled = config.enabled
        self._window = make_window(config)
        self._pending: dict[str, list[int]] = {}
        """Per class: [misses, tasks] learned since the window was last read."""
        self._last_record = -math.inf
        self._release_at: tuple[float, float | None] | None = None
        """(the last record's time, when the time window releases) (release_after_s)."""
        ordered = sorted(classes, key=lambda c: (c.priority, c.name))
        self.controller = AdmissionController(
            rule=config.effective_rule,
            threshold=config.threshold,
            release_threshold=config.release_threshold,
            classes=[c.name for c in ordered],
            max_defer_s=config.max_defer_ms / 1000.0,
            throttle_interval_s=config.throttle_interval_s,
            throttle_gain=config.throttle_gain,
            throttle_min_fraction=config.throttle_min_fraction,
            ladder=CostLadder(shedding=config.ladder_shedding),
            predictive_level=config.predictive_level,
            predictive_backstop=config.predictive_backstop,
            seed=seed,
        )
        self.tails = TailTracker({c.name: c.percentile for c in classes})
        self._needs_queue = Signal.QUEUE_PRESSURE in self.controller.needs
        self.needs_wait = self.enabled and Signal.WAIT in self.controller.needs
        """The rule reads QueryInfo.meet_prob / wait_ms: the shell estimates its targets'
        queue waits (admission.waiting) before asking."""

    # -- outcomes ------------------------------------------------------------------------

    def note_task(self, missed: bool, cls: str) -> None:
        """One task's deadline outcome, as the shell learns it (cheap: a count per class)."""
        counts = self._pending.get(cls)
        if counts is None:
            counts = self._pending[cls] = [0, 0]
        counts[0] += missed
        counts[1] += 1

    def note_tasks(self, misses: int, total: int, cls: str) -> None:
        """Several tasks' deadline outcomes of one class (a frame of results), as `note_task`."""
        counts = self._pending.get(cls)
        if counts is None:
            counts = self._pending[cls] = [0, 0]
        counts[0] += misses
        counts[1] += total

    def record_tasks(self, misses: int, total: int, cls: str) -> None:
        """Several tasks' outcomes of one class at once, at the current time."""
        now = self.clock()
        self._last_record = now
        self._window.record_many(misses, total, now, cls)

    def record_query(self, cls: str, latency_ms: float, slo_ms: float) -> None:
        """One answered query's latency against its SLO (the tail ratio's input)."""
        self.tails.record(cls, latency_ms, slo_ms)

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

    # -- decisions -----------------------------------------------------------------------

    def _aged_window(self, now: float) -> MissRatioWindow:
        """The window, cleared first when a count window got no task for the max age."""
        window = self.window
        a = self.config
        if a.window_tasks > 0 and now - self._last_record > a.window_max_age_s:
            # Beyond TailGuard: rejecting stops the tasks that would refresh a count
            # window, so misses older than the max age are forgotten.
            if window.count(now):
                window = self._window = make_window(a)
        return window

    def miss_ratio(self, cls: str | None = None) -> float:
        """The windowed miss ratio now (of one class, or overall), as admission reads it:
        a count window that got no task for window_max_age_s reads 0, so the exported
        gauge falls when traffic stops instead of keeping its last value."""
        now = self.clock()
        return self._aged_window(now).ratio(now, cls)

    def release_after_s(self) -> float | None:
        """Seconds until the miss ratio, as admission reads it, falls below the release
        threshold if no task outcome comes meanwhile (a Retry-After estimate for a query the
        miss-ratio rules reject): a time window's misses age out (`release_after_s` of the
        window); a count window that gets no task for window_max_age_s is cleared. 0.0 when
        it is below already; None when the throttle decides (it admits a share at any time).
        """
        if self.controller.throttle is not None:
            return None
        now = self.clock()
        window = self._aged_window(now)
        level = self.controller.release_threshold
        if window.window_tasks is None:
            # The moment depends on the window's records only: worked out again only when
            # a record came (rejections come in bursts, and the walk is over its chunks).
            cached = self._release_at
            if cached is None or cached[0] != self._last_record:
                after = window.release_after_s(level, now)
                at = None if after is None else now + after
                cached = self._release_at = (self._last_record, at)
            return None if cached[1] is None else max(cached[1] - now, 0.0)
        if window.ratio(now) < level:
            return 0.0
        return max(self._last_record + self.config.window_max_age_s - now, 0.0)

    def pressure(self, queue_pressure: Callable[[], float] = _no_queue_pressure) -> Pressure:
        """The load as admission sees it now; the queue pressure is read only if the rule
        needs it."""
        now = self.clock()
        window = self._aged_window(now)
        return Pressure(
            miss_ratio=window.ratio(now),
            queue_pressure=queue_pressure() if self._needs_queue else 0.0,
            tail_ratio=self.tails.ratio,
        )

    def clearly_admitted(self) -> bool:
        """True when the rule would admit any query now (the common case, decided cheaply)."""
        if not self.enabled:
            return True
        return self.controller.clearly_admits(self.window.ratio(self.clock()))

    def decide(
        self, q: QueryInfo, queue_pressure: Callable[[], float] = _no_queue_pressure
    ) -> Decision:
        """Admit, reject or defer one query now. A shell asks only when `clearly_admitted()`
        is False (the cheap check, which also builds no QueryInfo); a DEFER asks it to hold
        the query for `defer_s` and put it again with `waited_s` grown (`QueryInfo.after`)."""
        return self.controller.decide(q, self.pressure(queue_pressure), self.clock())

    def snapshot(self) -> dict[str, Any]:
        """GET /v1/admission."""
        now = self.clock()
        a = self.config
        return {
            "policy": str(a.policy),
            "rule": str(a.effective_rule),
            "threshold": a.threshold,
            "release_threshold": a.release_threshold or a.threshold,
            "window": {"tasks": a.window_tasks, "seconds": a.window_s, **self.window.snapshot(now)},
            "tail_ratio": self.tails.ratio,
            "controller": self.controller.snapshot(now),
        }
