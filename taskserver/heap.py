"""The garbage collector of a long-running service process, kept off its hot path.

Every task leaves a few small container objects alive while it is in flight (the gateway's
pending entry and outcome, a task server's queue entry and result), so a busy process holds
a working set of a few thousand young objects. CPython's default young-generation threshold
(700 net allocations) sits below that: the young generation is collected over and over, its
survivors are promoted, and each full collection then walks every object the process ever
imported (numpy, thriftpy2, aiohttp, the metrics registry). Measured on the gateway's query
path at fanout 10 with 64 queries in flight, that was about a tenth of its CPU per task.

So once a process is set up (listening), `settle_heap` moves what is alive then out of the
collector's sight (``gc.freeze``: modules, configuration, the registry are never garbage)
and raises the young threshold above the in-flight working set. Cyclic garbage is still
collected, every YOUNG_THRESHOLD net allocations instead of every 700.

What the collector still costs is measured, not assumed: `GcPauses` times every pass
(``gc.callbacks``), by generation, and every Tailgate process exports it as the histogram
`tailgate_gc_pause_seconds{generation}` (a full pass is generation 2).
"""

from __future__ import annotations

import gc
import math
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

__all__ = [
    "GC_PAUSE_BUCKETS_S",
    "YOUNG_THRESHOLD",
    "GcPauses",
    "Refreeze",
    "gc_pauses",
    "refreeze",
    "settle_heap",
]

YOUNG_THRESHOLD = 10_000
"""Net allocations of container objects between two young collections (CPython: 700)."""


_settled = False
"""Whether settle_heap ran in this process. Kept here, not read off gc.get_freeze_count(),
which counts the frozen objects one by one: ~12 ms at a million, once per server announced
when one process hosts thousands (--count), 19 ms a server in all at 2,500 servers."""


def settle_heap() -> None:
    """Freeze what is alive now and raise the young threshold; call when the process is set
    up. Calling it again (more services started in one process) freezes what they added."""
    global _settled
    if not _settled:
        gc.collect()  # the start-up's garbage goes now, not into the frozen generation
        _settled = True
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, young), middle, old)


GC_PAUSE_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
"""Upper bounds of the pause histogram (seconds): a young pass takes tens of µs, a full
pass over a large heap tens of ms."""


class GcPauses:
    """How long the collector's passes took, by generation: a `gc.callbacks` entry."""

    GENERATIONS = 3

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._started: float | None = None
        self.buckets = [[0] * (len(GC_PAUSE_BUCKETS_S) + 1) for _ in range(self.GENERATIONS)]
        """Per generation, passes per bucket (the last: above every bound); not cumulative."""
        self.total_s = [0.0] * self.GENERATIONS
        self.longest_s = [0.0] * self.GENERATIONS
        self.untimed = 0
        """Passes that could not be timed (started at the recursion limit)."""

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        """gc.callbacks' protocol: called with "start" and "stop" around each pass.

        A pass may start anywhere, also at the bottom of a stack run to the recursion limit
        (a peer's 100,000 ``[`` once ran Python's JSON parser there, before
        taskserver.jsonbody read the brackets first). There even a comparison raises
        RecursionError, which the collector would print as an ignored exception with its
        traceback. Such a pass goes untimed:
        counted in `untimed` (once, at its stop), and a "stop" whose "start" was not timed
        is not taken as a pause."""
        stopping = False
        try:
            if phase == "start":
                self._started = None  # a clock that raises leaves no older start behind
                self._started = self._clock()
                return
            stopping = True
            started, self._started = self._started, None
            if started is None:
                self.untimed += 1
                return
            pause = self._clock() - started
            g = min(int(info.get("generation", 0)), self.GENERATIONS - 1)
            self.buckets[g][bisect_left(GC_PAUSE_BUCKETS_S, pause)] += 1
            self.total_s[g] += pause
            if pause > self.longest_s[g]:
                self.longest_s[g] = pause
        except RecursionError:
            # No comparison here: at the limit it would raise again. A start that failed is
            # counted at its stop; a pass whose phase could not even be read goes uncounted.
            self._started = None
            if stopping:
                self.untimed += 1

    def passes(self, generation: int) -> int:
        """Passes of this generation timed so far."""
        return sum(self.buckets[generation])


_PAUSES: GcPauses | None = None


def gc_pauses() -> GcPauses:
    """This process's pause recorder, hooked into the collector on first use."""
    global _PAUSES
    if _PAUSES is None:
        _PAUSES = GcPauses()
        gc.callbacks.append(_PAUSES)
    return _PAUSES


class Refreeze:
    """When to freeze again the long-lived objects a running process gained since it was
    set up: the links and rows of servers that registered after the gateway listened.

    `settle_heap` froze what was alive at start-up; a gateway that then takes thousands of
    registrations holds hundreds of thousands of new long-lived objects, which every full
    collection walks (measured: one 520 ms pause among 1,500 queries at 10,000 servers).
    Once `min_new` servers have joined and none for `quiet_s` (a registration burst is
    over), `due` says so; the shell then freezes them (`refreeze`). Pure: the clock is
    passed in.
    """

    def __init__(self, quiet_s: float = 2.0, min_new: int = 64) -> None:
        if quiet_s < 0 or min_new < 1:
            raise ValueError(f"quiet_s must be >= 0 and min_new >= 1, got {quiet_s}, {min_new}")
        self.quiet_s = quiet_s
        self.min_new = min_new
        self.new = 0
        """Servers that joined since the last freeze."""
        self.last_join_s = -math.inf
        self.freezes = 0

    def joined(self, now: float) -> float | None:
        """A server joined at `now`: seconds until `due` may say yes (None: not yet)."""
        self.new += 1
        self.last_join_s = now
        return self.quiet_s if self.new >= self.min_new else None

    def due(self, now: float) -> bool:
        """Whether to freeze now: enough joined, and the burst has been quiet for quiet_s."""
        return self.new >= self.min_new and now - self.last_join_s >= self.quiet_s

    def frozen(self) -> None:
        """The shell froze the heap."""
        self.new = 0
        self.freezes += 1


def refreeze() -> bool:
    """Freeze what is alive now, in a process whose heap `settle_heap` settled (elsewhere,
    e.g. a test process hosting services, nothing is done: False). The young and middle
    generations are collected first, so what is frozen is what lives; only garbage already
    in the old generation would be kept (objects freed by reference counting, as links
    closed on deregistration are, are freed whether frozen or not)."""
    if not _settled:
        return False
    gc.collect(1)
    gc.freeze()
    return True
