"""The busy watch: one timer per event loop checks the quiet servers given work."""

from __future__ import annotations

import asyncio

from gateway import links
from gateway.links import SWEEPS_PER_HEARTBEAT, busy_watch


class FakeLink:
    """What the watch reads of a link: heartbeat_s, and its check (scripted here)."""

    def __init__(self, heartbeat_s: float, due_after: int) -> None:
        self.heartbeat_s = heartbeat_s
        self.due_after = due_after
        self.checks = 0

    def _watch_due(self) -> bool:
        self.checks += 1
        return self.checks >= self.due_after


async def test_links_share_one_timer_and_leave_when_due() -> None:
    watch = busy_watch()
    assert busy_watch() is watch
    a, b = FakeLink(0.04, due_after=1), FakeLink(0.04, due_after=3)
    watch.add(a)  # type: ignore[arg-type]
    watch.add(b)  # type: ignore[arg-type]
    assert watch._period_s == 0.04 / SWEEPS_PER_HEARTBEAT
    await asyncio.sleep(0.015)
    assert a.checks == 1 and b.checks == 1 and list(watch.links) == [b]
    await asyncio.sleep(0.04)
    assert b.checks == 3 and not watch.links
    # Empty, it stops and leaves: the next add makes a new one.
    assert watch._timer is None
    assert id(asyncio.get_running_loop()) not in links._WATCHES
    assert busy_watch() is not watch


async def test_a_shorter_heartbeat_shortens_the_sweep() -> None:
    watch = busy_watch()
    slow, fast = FakeLink(10.0, due_after=1), FakeLink(0.02, due_after=1)
    watch.add(slow)  # type: ignore[arg-type]
    watch.add(fast)  # type: ignore[arg-type]
    await asyncio.sleep(0.03)
    assert slow.checks == 1 and fast.checks == 1 and not watch.links
