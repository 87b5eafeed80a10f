"""Salvage the readable readings of a damaged store into a new one.

A store that fails its integrity check is moved aside and salvaged (`recovery_hint` says
how). SQLite's own tool for that, ``sqlite3 DB .recover``, needs the ``sqlite_dbpage``
table, which some distributions leave out of their build (Debian's and so Raspberry Pi
OS's among them), and ``.dump`` gives up on a damaged table. This reads what it can through
the readings' primary key instead: each sensor's readings in time order, then in reverse,
and where a read hits a damaged page, it looks for the nearest time past the damage that
reads again (doubling the step, then halving it back), so about only the readings on
damaged pages are lost.

Errors: StoreError (edge_agent.store) when the damaged file cannot be opened at all or
holds no readings table; the new store's own errors as `SensorStore` raises them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.store import SensorStore, StoreError

__all__ = ["SalvageResult", "salvage_store"]

MAX_TS = 1 << 40
"""Past any reading's unix second: where the search for readable readings stops."""


@dataclass(slots=True)
class SalvageResult:
    """What a salvage read and wrote."""

    readings: int = 0
    """Readings the new store holds after it."""
    sensors: list[str] = field(default_factory=list)
    """Sensors with at least one reading salvaged."""
    skipped: list[tuple[str, int, int]] = field(default_factory=list)
    """(sensor, from ts, to ts): stretches that could not be read (damaged pages)."""


def salvage_store(source: str | Path, target: str, *, init: bool = False) -> SalvageResult:
    """Copy every readable reading of the damaged store at `source` into the store at
    `target` (created if missing; existing readings there win). `source` is only read."""
    src = Path(source)
    if not src.is_file():
        raise StoreError(f"salvage: no store file at {src}")
    try:
        con = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error as exc:
        raise StoreError(f"salvage: cannot open {src}: {exc}") from exc
    try:
        names = _sensor_names(con)
        store = SensorStore(target, init=init)
        try:
            result = SalvageResult()
            for sid, name in names.items():
                # Forward, then backward: a pass that starts on a damaged page must search
                # far for readable keys; the other pass starts on the readings' other end.
                lost = None
                for direction in (1, -1):
                    skipped: list[tuple[int, int]] = []
                    rows = ((name, ts, v) for ts, v in _readable(con, sid, direction, skipped))
                    store.insert_many(rows)
                    lost = skipped if lost is None else _overlap(lost, skipped)
                result.skipped += [(name, lo, hi) for lo, hi in lost or []]
                if name in store.sensor_names():
                    result.sensors.append(name)
            result.readings = store.count()
            return result
        finally:
            store.close()
    finally:
        con.close()


def _sensor_names(con: sqlite3.Connection) -> dict[int, str]:
    """Sensor id -> name; the ids in the readings where the sensors table is unreadable."""
    try:
        return dict(con.execute("SELECT id, name FROM sensors ORDER BY id").fetchall())
    except sqlite3.DatabaseError:
        pass
    ids: dict[int, str] = {}
    sid = -1
    while True:  # one key lookup per sensor
        try:
            row = con.execute(
                "SELECT min(sensor_id) FROM readings WHERE sensor_id > ?", (sid,)
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            if not ids:
                raise StoreError(f"salvage: neither sensors nor readings readable: {exc}") from exc
            return ids
        if row is None or row[0] is None:
            return ids
        sid = int(row[0])
        ids[sid] = f"sensor-{sid}"


_SCAN = {
    1: "SELECT ts, value FROM readings WHERE sensor_id = ? AND ts >= ? ORDER BY ts",
    -1: "SELECT ts, value FROM readings WHERE sensor_id = ? AND ts <= ? ORDER BY ts DESC",
}


def _readable(
    con: sqlite3.Connection, sid: int, direction: int, skipped: list[tuple[int, int]]
) -> Iterator[tuple[int, float]]:
    """The sensor's readable readings, oldest first (`direction` 1) or newest first (-1);
    the stretches it could not read are appended to `skipped` as (from ts, to ts)."""
    pos = -MAX_TS if direction == 1 else MAX_TS
    while -MAX_TS <= pos <= MAX_TS:
        try:
            for ts, value in con.execute(_SCAN[direction], (sid, pos)):  # row by row: an
                pos = int(ts) + direction  # error keeps every row read before it
                yield int(ts), float(value)
            return
        except sqlite3.DatabaseError:
            after = _next_readable(con, sid, pos, direction)
            end = direction * MAX_TS if after is None else after - direction
            skipped.append((min(pos, end), max(pos, end)))
            if after is None:
                return
            pos = after


def _readable_from(con: sqlite3.Connection, sid: int, pos: int, direction: int) -> bool:
    """Whether the first reading from `pos` on (in `direction`) reads, or there is none."""
    try:
        con.execute(_SCAN[direction] + " LIMIT 1", (sid, pos)).fetchall()
    except sqlite3.DatabaseError:
        return False
    return True


def _next_readable(con: sqlite3.Connection, sid: int, bad: int, direction: int) -> int | None:
    """The nearest position past `bad` (in `direction`) from which the readings read
    again, None if none does: the step doubles until one reads, then halves back to the
    edge of the damage."""
    step = 1
    while not _readable_from(con, sid, bad + direction * step, direction):
        if abs(bad + direction * step) >= MAX_TS:
            return None
        step *= 2
    good = bad + direction * step
    worse = bad + direction * (step // 2) if step > 1 else bad
    while abs(good - worse) > 1:
        mid = (good + worse) // 2
        if _readable_from(con, sid, mid, direction):
            good = mid
        else:
            worse = mid
    return good


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The stretches in both lists of closed (from, to) stretches."""
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo <= hi:
                out.append((lo, hi))
    return sorted(out)
