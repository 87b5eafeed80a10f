"""Backfill: fill a store with months of simulated readings, fast (bulk inserts).

The simulated reader is a pure function of (seed, timestamp), so a backfilled store and
an agent that samples live with the same seed agree on every shared second. Readings are
stamped on multiples of the interval, so each series is regular (see sensing's encoding).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from edge_agent.readers import SIMULATED_SENSORS, SimulatedReader
from edge_agent.store import SensorStore

__all__ = ["MONTH_S", "BackfillResult", "backfill", "seed_store", "simulated_readings"]

MONTH_S = 365.25 / 12 * 86_400
"""An average month (18 months = 547.9 days)."""


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What a backfill wrote and how fast."""

    rows: int
    seconds: float
    start_s: int
    end_s: int
    interval_s: int

    @property
    def rows_per_s(self) -> float:
        """Rows written per second of wall time."""
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


def simulated_readings(
    reader: SimulatedReader, start_s: int, end_s: int, interval_s: int
) -> Iterator[tuple[str, int, float]]:
    """(sensor, ts, value) at every multiple of interval_s in [start_s, end_s), per sensor."""
    first = math.ceil(start_s / interval_s) * interval_s
    block = 4096 * interval_s
    for sensor in reader.sensors:
        for lo in range(first, end_s, block):
            stamps = range(lo, min(lo + block, end_s), interval_s)
            for ts, value in zip(stamps, reader.values(sensor, stamps), strict=True):
                yield sensor, ts, value


def backfill(
    store: SensorStore,
    reader: SimulatedReader,
    *,
    start_s: int,
    end_s: int,
    interval_s: int,
    clock: Callable[[], float] = time.perf_counter,
) -> BackfillResult:
    """Write the simulated readings of [start_s, end_s) every interval_s (existing rows win)."""
    if interval_s < 1 or int(interval_s) != interval_s:
        raise ValueError(f"interval: must be a whole number of seconds >= 1, got {interval_s}")
    if end_s <= start_s:
        raise ValueError(f"end: must be after start, got {start_s}..{end_s}")
    started = clock()
    rows = store.insert_many(simulated_readings(reader, start_s, end_s, int(interval_s)))
    return BackfillResult(rows, clock() - started, start_s, end_s, int(interval_s))


def seed_store(
    db: str,
    *,
    months: float,
    interval_s: int,
    seed: int = 0,
    sensors: tuple[str, ...] = SIMULATED_SENSORS,
    now_s: float | None = None,
    init: bool = False,
) -> BackfillResult:
    """Backfill the store at `db` with the last `months` of simulated readings.

    `init` allows a new store in an empty (zero-byte) file, as `SensorStore` does. Raises
    ValueError (message naming the option) on bad input, StoreError on the store.
    """
    if not 0 < months <= 240:
        raise ValueError(f"months: must be a number in (0, 240], got {months}")
    reader = SimulatedReader(seed, sensors)
    end_s = int(time.time() if now_s is None else now_s)
    store = SensorStore(db, init=init)
    try:
        return backfill(
            store, reader, start_s=end_s - int(months * MONTH_S), end_s=end_s, interval_s=interval_s
        )
    finally:
        store.close()
