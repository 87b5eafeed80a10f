"""Windowed task deadline-miss ratio per server and per pool (dashboard, metrics, history)."""

from __future__ import annotations

from collections.abc import Callable

from admission import MissRatioWindow

__all__ = ["SERVER_WINDOW_S", "ServerMissRatios", "server_window"]

SERVER_WINDOW_S = 60.0
"""Time window of the per-server and per-pool miss ratios: each update (scrape, history
sample, dashboard poll) adds one chunk, so a time window keeps a server's memory to the
updates of the last minute, where a count window as long as admission's would keep ~100,000."""


def server_window() -> MissRatioWindow:
    """The miss-ratio window of one server or pool (the last SERVER_WINDOW_S seconds)."""
    return MissRatioWindow(window_tasks=None, window_s=SERVER_WINDOW_S)


class ServerMissRatios:
    """Windowed task miss ratio per server and per pool, fed from cumulative counts.

    The query path only bumps `counts`; `update(now)` (at scrape or sample time) feeds
    what changed since the last update into one MissRatioWindow per server and per pool
    (`server_window` in the gateway). A count window that got no task for `max_age_s`
    is cleared, as the admission window is (gateway.overload).
    """

    def __init__(
        self,
        make_window: Callable[[], MissRatioWindow] = server_window,
        max_age_s: float | None = None,
    ) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}
        """(server, pool) -> [tasks, misses] since start (tasks that ran: status ok)."""
        self._make_window = make_window
        self._max_age_s = max_age_s
        self._seen: dict[tuple[str, str], tuple[int, int]] = {}
        # ("server", server, pool) or ("pool", pool) -> its window and its last task's time
        self._windows: dict[tuple[str, ...], MissRatioWindow] = {}
        self._last_task: dict[tuple[str, ...], float] = {}

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

    def update(self, now: float) -> None:
        """Feed the counts that arrived since the last update into the windows."""
        by_pool: dict[str, list[int]] = {}
        for key, (tasks, misses) in self.counts.items():
            seen_tasks, seen_misses = self._seen.get(key, (0, 0))
            if tasks == seen_tasks:
                continue
            self._seen[key] = (tasks, misses)
            self._feed(("server", *key), misses - seen_misses, tasks - seen_tasks, now)
            d = by_pool.setdefault(key[1], [0, 0])
            d[0] += tasks - seen_tasks
            d[1] += misses - seen_misses
        for pool, (tasks, misses) in by_pool.items():
            self._feed(("pool", pool), misses, tasks, now)

    def forget(self, server: str, now: float) -> None:
        """Drop a removed server's counts and windows (its pool keeps the tasks it ran)."""
        self.update(now)
        for key in [k for k in self.counts if k[0] == server]:
            del self.counts[key]
            self._seen.pop(key, None)
            self._windows.pop(("server", *key), None)
            self._last_task.pop(("server", *key), None)

    def server_ratio(self, server: str, pool: str, now: float) -> float:
        """The server's windowed miss ratio (0.0 before its first task)."""
        return self._ratio(("server", server, pool), now)

    def pool_ratio(self, pool: str, now: float) -> float:
        """The pool's windowed miss ratio (0.0 before its first task)."""
        return self._ratio(("pool", pool), now)

    def pools(self) -> list[str]:
        """Pools that have run tasks (also on servers since removed)."""
        return sorted(
            {pool for _, pool in self.counts} | {k[1] for k in self._windows if k[0] == "pool"}
        )

    def _feed(self, key: tuple[str, ...], misses: int, tasks: int, now: float) -> None:
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = self._make_window()
        self._last_task[key] = now
        window.record_many(misses, tasks, now)

    def _ratio(self, key: tuple[str, ...], now: float) -> float:
        window = self._windows.get(key)
        if window is None:
            return 0.0
        if self._max_age_s is not None and now - self._last_task[key] > self._max_age_s:
            # Nothing ran here for a while: old misses would otherwise show forever.
            self._windows[key] = window = self._make_window()
        return window.ratio(now)
