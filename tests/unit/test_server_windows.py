"""ServerMissRatios (vectorised columns) against one MissRatioWindow per server and pool."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from admission import MissRatioWindow
from gateway.server_windows import ServerMissRatios


class PerKeyWindows:
    """The windows as they were: one time window per (server, pool) and per pool, fed by
    update() from the same cumulative counts. The reference the columns must agree with."""

    def __init__(self, window_s: float, max_age_s: float | None) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}
        self._make: Callable[[], MissRatioWindow] = lambda: MissRatioWindow(
            window_tasks=None, window_s=window_s
        )
        self._max_age_s = max_age_s
        self._seen: dict[tuple[str, str], tuple[int, int]] = {}
        self._windows: dict[tuple[str, ...], MissRatioWindow] = {}
        self._last_task: dict[tuple[str, ...], float] = {}

    def tasks(self, server: str, pool: str, n: int, misses: int) -> None:
        c = self.counts.setdefault((server, pool), [0, 0])
        c[0] += n
        c[1] += misses

    def update(self, now: float) -> None:
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
        self.update(now)
        for key in [k for k in self.counts if k[0] == server]:
            del self.counts[key]
            self._seen.pop(key, None)
            self._windows.pop(("server", *key), None)
            self._last_task.pop(("server", *key), None)

    def server_ratio(self, server: str, pool: str, now: float) -> float:
        return self._ratio(("server", server, pool), now)

    def pool_ratio(self, pool: str, now: float) -> float:
        return self._ratio(("pool", pool), now)

    def pools(self) -> list[str]:
        return sorted(
            {pool for _, pool in self.counts} | {k[1] for k in self._windows if k[0] == "pool"}
        )

    def _feed(self, key: tuple[str, ...], misses: int, tasks: int, now: float) -> None:
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = self._make()
        self._last_task[key] = now
        window.record_many(misses, tasks, now)

    def _ratio(self, key: tuple[str, ...], now: float) -> float:
        window = self._windows.get(key)
        if window is None:
            return 0.0
        if self._max_age_s is not None and now - self._last_task[key] > self._max_age_s:
            self._windows[key] = window = self._make()
        return window.ratio(now)


@pytest.mark.parametrize("seed", range(12))
def test_columns_agree_with_a_window_per_server(seed: int) -> None:
    rng = random.Random(seed)
    window_s = rng.choice([1.0, 5.0, 60.0])
    max_age_s = rng.choice([None, 0.5, 3.0])
    ours = ServerMissRatios(window_s, max_age_s)
    ref = PerKeyWindows(window_s, max_age_s)
    servers = [f"s{i}" for i in range(rng.randint(3, 40))]
    pools = ["a", "b", "c"][: rng.randint(1, 3)]
    now = 0.0
    reads = forgotten = 0
    for _ in range(3000):
        op = rng.random()
        if op < 0.45:
            server, pool = rng.choice(servers), rng.choice(pools)
            n = rng.randint(0, 5)
            misses = rng.randint(0, n)
            ours.tasks(server, pool, n, misses)
            ref.tasks(server, pool, n, misses)
        elif op < 0.5:
            server, pool, missed = rng.choice(servers), rng.choice(pools), rng.random() < 0.3
            ours.task(server, pool, missed)
            ref.tasks(server, pool, 1, int(missed))
        elif op < 0.65:
            now += rng.choice([0.0, 0.1, 0.25, 1.0, 2.5])
            ours.update(now)
            ref.update(now)
        elif op < 0.9:
            now += rng.choice([0.0, 0.0, 0.3])
            server, pool = rng.choice(servers), rng.choice(pools)
            assert ours.server_ratio(server, pool, now) == ref.server_ratio(server, pool, now)
            assert ours.pool_ratio(pool, now) == ref.pool_ratio(pool, now)
            reads += 1
        elif op < 0.93:
            server = rng.choice(servers)
            ours.forget(server, now)
            ref.forget(server, now)
            forgotten += 1
        else:
            assert ours.pools() == ref.pools()
        assert ours.counts == ref.counts
    assert reads > 500 and forgotten > 30
    for server in servers:
        for pool in pools:
            assert ours.server_ratio(server, pool, now) == ref.server_ratio(server, pool, now)


def test_a_forgotten_servers_row_is_reused_without_its_old_tasks() -> None:
    w = ServerMissRatios(60.0)
    w.tasks("old", "p", 10, 10)
    w.update(1.0)
    assert w.server_ratio("old", "p", 1.0) == 1.0
    w.forget("old", 2.0)
    assert w.server_ratio("old", "p", 2.0) == 0.0 and w.counts == {}
    w.tasks("new", "p", 4, 1)
    w.update(3.0)
    assert w._row_of[("new", "p")] == 0  # the freed row
    assert w.server_ratio("new", "p", 3.0) == 0.25
    # The old column leaves the window without taking the new server's tasks with it.
    assert w.server_ratio("new", "p", 61.5) == 0.25
    assert w.server_ratio("new", "p", 63.0) == 0.0
    # The pool keeps what the forgotten server ran, until its window passes.
    assert w.pool_ratio("p", 3.0) == 11 / 14


def test_an_update_with_nothing_new_adds_no_column() -> None:
    w = ServerMissRatios(60.0)
    w.tasks("s", "p", 3, 0)
    for t in range(50):
        w.update(float(t))
    assert len(w._columns) == 1
    w.tasks("s", "p", 0, 0)  # a frame of nothing
    w.update(100.0)
    assert len(w._columns) == 0  # the first one left the window at t = 60


def test_rows_grow_past_their_first_allocation() -> None:
    w = ServerMissRatios(60.0)
    for i in range(1000):
        w.tasks(f"s{i}", f"p{i % 3}", i + 1, i % 2)
    w.update(1.0)
    assert w.server_ratio("s999", "p0", 1.0) == 1 / 1000
    assert w.server_ratio("s998", "p2", 1.0) == 0.0
    assert w.pools() == ["p0", "p1", "p2"]


def test_a_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_s"):
        ServerMissRatios(0.0)
