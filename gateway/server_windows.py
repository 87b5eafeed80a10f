"""Windowed task deadline-miss ratio per server and per pool (dashboard, metrics, history).

The query path bumps two integers per result frame (`ServerMissRatios.tasks`); `update(now)`
(a scrape, a history sample, a dashboard poll) turns what changed since the last update into
one *column*: the rows (servers) whose counts moved and by how much, stamped `now`. Every
server's window is then the columns of the last `window_s` seconds, kept as running sums per
row (numpy), so an update costs one vectorised pass over the counts however many servers
there are, not a window object fed per server: at 10,000 busy servers the per-server windows
(one `MissRatioWindow` each) took 76-219 ms of the event loop per update, stalling every
query in flight.

The windows are those of `admission.MissRatioWindow` with ``window_s`` (TailGuard §III.D's
miss ratio, over time): a column recorded at t counts while now < t + window_s. One
difference, beyond the paper and not observable with a monotonic clock: all rows share one
latest time, where separate windows each kept their own.
"""

from __future__ import annotations

import itertools
import math
from collections import deque

import numpy as np

from admission import MissRatioWindow

__all__ = ["SERVER_WINDOW_S", "ServerMissRatios"]

SERVER_WINDOW_S = 60.0
"""Time window of the per-server and per-pool miss ratios: each update (scrape, history
sample, dashboard poll) adds one column, so a server's memory is bounded by the updates of
the last minute that brought it a task."""

Key = tuple[str, str]
"""(server, pool)."""


class _Column:
    """What one update added: the rows that moved, their [tasks, misses], its sequence."""

    __slots__ = ("deltas", "rows", "seq", "t")

    def __init__(self, t: float, seq: int, rows: np.ndarray, deltas: np.ndarray) -> None:
        self.t = t
        self.seq = seq
        self.rows = rows
        self.deltas = deltas


class ServerMissRatios:
    """Windowed task miss ratio per server and per pool, fed from cumulative counts.

    The query path only bumps `counts`; `update(now)` feeds what changed since the last
    update into the windows of the last `window_s` seconds, one per server and per pool.
    A window that got no task for `max_age_s` is cleared, as the admission window is
    (gateway.overload).
    """

    def __init__(self, window_s: float = SERVER_WINDOW_S, max_age_s: float | None = None) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s: must be > 0, got {window_s!r}")
        self.counts: dict[Key, list[int]] = {}
        """(server, pool) -> [tasks, misses] since start (tasks that ran: status ok)."""
        self.window_s = float(window_s)
        self._max_age_s = max_age_s
        self._latest = -math.inf
        # Rows: one per (server, pool) that ever reached an update and was not forgotten.
        self._row_of: dict[Key, int] = {}
        self._keys_of_server: dict[str, list[Key]] = {}
        self._free: list[int] = []
        self._rows_used = 0
        self._pool_index: dict[str, int] = {}
        self._pool_rows: list[int] = []  # pool index -> rows of that pool now
        self._seen = np.zeros((0, 2), np.int64)  # counts at the last update, by row
        self._sums = np.zeros((0, 2), np.int64)  # [tasks, misses] in the window, by row
        self._last = np.zeros(0)  # the last update that brought the row a task
        self._cleared = np.zeros(0, np.int64)  # columns below this seq left the row's sums
        self._pool_of = np.zeros(0, np.int64)
        # The rows of `counts` in its iteration order (None: rebuild it at the next update).
        self._order: np.ndarray | None = np.zeros(0, np.int64)
        self._columns: deque[_Column] = deque()
        self._seq = 0
        self._pools: dict[str, MissRatioWindow] = {}
        self._pool_last: dict[str, float] = {}

    # -- the query path ------------------------------------------------------------------

    def task(self, server: str, pool: str, missed: bool) -> None:
        """Count one task that ran on a server (the hot path: two integer increments)."""
        c = self.counts.get((server, pool))
        if c is None:
            c = self.counts[(server, pool)] = [0, 0]
        c[0] += 1
        if missed:
            c[1] += 1

    def tasks(self, server: str, pool: str, n: int, misses: int) -> None:
        """Count `n` tasks that ran on a server, `misses` of them late (a frame of results)."""
        c = self.counts.get((server, pool))
        if c is None:
            c = self.counts[(server, pool)] = [0, 0]
        c[0] += n
        c[1] += misses

    # -- updates and reads ---------------------------------------------------------------

    def update(self, now: float) -> None:
        """Feed the counts that arrived since the last update into the windows."""
        now = self._advance(now)
        order = self._rows_in_order()
        n = len(order)
        if n:
            current = np.fromiter(
                itertools.chain.from_iterable(self.counts.values()), np.int64, 2 * n
            ).reshape(n, 2)
            moved = current - self._seen[order]
            changed = np.flatnonzero(moved[:, 0])
            if changed.size:
                rows = order[changed]
                deltas = moved[changed]
                self._seen[rows] = current[changed]
                self._sums[rows] += deltas
                self._last[rows] = now
                self._columns.append(_Column(now, self._seq, rows, deltas))
                self._seq += 1
                self._feed_pools(rows, deltas, now)
        self._evict(now)

    def server_ratio(self, server: str, pool: str, now: float) -> float:
        """The server's windowed miss ratio (0.0 before its first task)."""
        row = self._row_of.get((server, pool))
        if row is None:
            return 0.0
        now = self._advance(now)
        self._evict(now)
        if self._max_age_s is not None and now - self._last[row] > self._max_age_s:
            # Nothing ran here for a while: old misses would otherwise show forever.
            self._clear(row)
            return 0.0
        tasks, misses = self._sums[row].tolist()
        return misses / tasks if tasks else 0.0

    def pool_ratio(self, pool: str, now: float) -> float:
        """The pool's windowed miss ratio (0.0 before its first task)."""
        window = self._pools.get(pool)
        if window is None:
            return 0.0
        if self._max_age_s is not None and now - self._pool_last[pool] > self._max_age_s:
            self._pools[pool] = window = MissRatioWindow(window_tasks=None, window_s=self.window_s)
        return window.ratio(now)

    def pools(self) -> list[str]:
        """Pools that have run tasks (also on servers since removed)."""
        self._rows_in_order()
        held = {pool for pool, i in self._pool_index.items() if self._pool_rows[i]}
        return sorted(held | set(self._pools))

    def forget(self, server: str, now: float) -> None:
        """Drop a removed server's counts and windows (its pool keeps the tasks it ran)."""
        self.update(now)
        for key in self._keys_of_server.pop(server, ()):
            del self.counts[key]
            row = self._row_of.pop(key)
            self._clear(row)
            self._seen[row] = 0
            self._pool_rows[int(self._pool_of[row])] -= 1
            self._free.append(row)
        self._order = None

    # -- inside --------------------------------------------------------------------------

    def _advance(self, now: float) -> float:
        # Reads and updates come in time order: an earlier `now` (another shell's clock read
        # a hair late) counts as the latest time seen, so columns stay sorted by time.
        if now > self._latest:
            self._latest = now
        return self._latest

    def _rows_in_order(self) -> np.ndarray:
        """The row of every key of `counts`, in its order; new keys get rows."""
        order = self._order
        counts = self.counts
        if order is not None and len(order) == len(counts):
            return order
        if order is None:
            known: list[int] = []
            fresh: list[Key] = []
            for key in counts:
                row = self._row_of.get(key)
                if row is None:
                    fresh.append(key)
                    row = -1
                known.append(row)
        else:
            # Keys only join at the end of the dict (forget() rebuilds): the new ones.
            known = order.tolist()
            fresh = list(itertools.islice(counts, len(order), None))
            known.extend([-1] * len(fresh))
        new_rows = [self._add_row(key) for key in fresh]
        result = np.array(known, np.int64)
        if fresh:
            result[result == -1] = new_rows
        self._order = result
        return result

    def _add_row(self, key: Key) -> int:
        server, pool = key
        pool_id = self._pool_index.get(pool)
        if pool_id is None:
            pool_id = self._pool_index[pool] = len(self._pool_rows)
            self._pool_rows.append(0)
        self._pool_rows[pool_id] += 1
        if self._free:
            row = self._free.pop()
        else:
            row = self._rows_used
            self._rows_used += 1
            if row >= len(self._sums):
                self._grow(max(64, 2 * row))
        self._row_of[key] = row
        self._keys_of_server.setdefault(server, []).append(key)
        self._pool_of[row] = pool_id
        self._last[row] = -math.inf
        self._cleared[row] = self._seq
        return row

    def _grow(self, size: int) -> None:
        extra = size - len(self._sums)
        self._seen = np.concatenate([self._seen, np.zeros((extra, 2), np.int64)])
        self._sums = np.concatenate([self._sums, np.zeros((extra, 2), np.int64)])
        self._last = np.concatenate([self._last, np.full(extra, -math.inf)])
        self._cleared = np.concatenate([self._cleared, np.zeros(extra, np.int64)])
        self._pool_of = np.concatenate([self._pool_of, np.zeros(extra, np.int64)])

    def _clear(self, row: int) -> None:
        """Empty a row's window: the columns so far leave its sums now, not at eviction."""
        self._sums[row] = 0
        self._cleared[row] = self._seq

    def _evict(self, now: float) -> None:
        # A column recorded at t counts while now < t + window_s: the window is (now - w, now].
        cutoff = now - self.window_s
        columns = self._columns
        while columns and columns[0].t <= cutoff:
            c = columns.popleft()
            keep = self._cleared[c.rows] <= c.seq
            self._sums[c.rows[keep]] -= c.deltas[keep]

    def _feed_pools(self, rows: np.ndarray, deltas: np.ndarray, now: float) -> None:
        pool_ids = self._pool_of[rows]
        size = len(self._pool_rows)
        tasks = np.bincount(pool_ids, weights=deltas[:, 0], minlength=size)
        misses = np.bincount(pool_ids, weights=deltas[:, 1], minlength=size)
        for pool, i in self._pool_index.items():
            n = int(tasks[i])
            if not n:
                continue
            window = self._pools.get(pool)
            if window is None:
                window = self._pools[pool] = MissRatioWindow(
                    window_tasks=None, window_s=self.window_s
                )
            self._pool_last[pool] = now
            window.record_many(int(misses[i]), n, now)
