"""The deferral queue: deferred queries are asked again in the allocation layer's order.

An admission rule may DEFER a query (the cost ladder's first rung, client-side-scheduling
§3.1): the gateway holds it for the decision's `defer_s` and then puts it to the gate again.
Held queries whose time is up wait here and are released one at a time, each allowed to
reach the gate (and, if admitted, to dispatch its tasks, which the queue-pressure signal
sees at once) before the next is released, so the order matters: with ``[allocation]`` it is
the arbiter's (DRR or fair queueing between tenants, in cost units; within a tenant, the
earliest SLO deadline first), without it the order in which their holds ended. This is
where the allocation layer's "which class gets the next send opportunity" applies to
deferred work.

Shell code: asyncio timers and futures around `admission.allocation`'s pure queues.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from admission.allocation import HeapFlows
from admission.config import AllocationConfig

__all__ = ["DeferralQueue"]


class _Fifo:
    """Release in the order the holds ended (no allocation)."""

    def __init__(self) -> None:
        self._items: list[tuple[int, Any]] = []
        self._seq = itertools.count()

    def push(self, flow: str, item: Any, cost: float, key: Any = None) -> None:
        self._items.append((next(self._seq), item))

    def pop(self) -> tuple[str, Any] | None:
        if not self._items:
            return None
        return "", self._items.pop(0)[1]

    def __len__(self) -> int:
        return len(self._items)


class DeferralQueue:
    """Deferred queries whose hold is over, released in the allocation layer's order."""

    def __init__(self, config: AllocationConfig) -> None:
        self._queue: HeapFlows | _Fifo = HeapFlows(config.arbiter()) if config.enabled else _Fifo()
        self._pumping = False
        self.held = 0
        """Queries held now (their hold running, or waiting for their release)."""
        self.released: dict[str, int] = {}
        """Releases per flow since start."""

    def __len__(self) -> int:
        """Queries whose hold is over, waiting for their release."""
        return len(self._queue)

    async def hold(self, flow: str, cost: float, key: float, defer_s: float) -> None:
        """Hold a deferred query for defer_s, then until its release (`key`: its SLO
        deadline, the order within its flow); cancelling the caller leaves no trace."""
        loop = asyncio.get_running_loop()
        released: asyncio.Future[None] = loop.create_future()
        self.held += 1
        timer = loop.call_later(max(defer_s, 0.0), self._due, flow, cost, key, released)
        try:
            await released
        finally:
            self.held -= 1
            timer.cancel()

    def _due(self, flow: str, cost: float, key: float, released: asyncio.Future[None]) -> None:
        if released.done():
            return  # its query went away meanwhile
        self._queue.push(flow, released, max(cost, 1e-9), key)
        if not self._pumping:
            self._pumping = True
            asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        """Release the queries whose hold is over, one per turn of the loop: each gets to
        the gate (and dispatches, if admitted) before the next is released."""
        try:
            while (nxt := self._queue.pop()) is not None:
                flow, released = nxt
                if released.done():
                    continue
                released.set_result(None)
                self.released[flow] = self.released.get(flow, 0) + 1
                await asyncio.sleep(0)
        finally:
            self._pumping = False

    def sleeper(self, flow: str, cost: float, key: float) -> Callable[[float], Any]:
        """The `sleep` a deferral of this query takes (gateway.overload.admit's)."""
        return lambda defer_s: self.hold(flow, cost, key, defer_s)
