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
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle_heap"]

YOUNG_THRESHOLD = 10_000
"""Net allocations of container objects between two young collections (CPython: 700)."""


def settle_heap() -> None:
    """Freeze what is alive now and raise the young threshold; call when the process is set
    up. Calling it again (more services started in one process) freezes what they added."""
    if not gc.get_freeze_count():
        gc.collect()  # the start-up's garbage goes now, not into the frozen generation
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, young), middle, old)
