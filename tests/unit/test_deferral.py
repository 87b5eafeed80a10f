"""The deferral queue (gateway.deferral): held queries released in the allocation's order."""

from __future__ import annotations

import asyncio

import pytest

from admission import AllocationConfig
from gateway.deferral import DeferralQueue


async def release_order(q: DeferralQueue, holds: list[tuple[str, float, float]]) -> list[str]:
    """Hold every (name, cost, key) for the same 10 ms; the order their holds end in.

    The holds start from one instant: the loop's clock is held still until every hold has
    set its timer. Otherwise a pause of the process between two of them (a busy machine)
    makes the later ones due a turn of the loop after the first are released."""
    order: list[str] = []

    async def one(name: str, cost: float, key: float) -> None:
        await q.hold(name[0], cost, key, 0.01)
        order.append(name)

    loop = asyncio.get_running_loop()
    start = loop.time()
    loop.time = lambda: start  # type: ignore[method-assign]
    try:
        tasks = [asyncio.ensure_future(one(*h)) for h in holds]
        for _ in range(100):
            if q.held == len(holds):
                break
            await asyncio.sleep(0)
        assert q.held == len(holds), "the holds did not all start"
    finally:
        del loop.time  # the loop's own clock again
    await asyncio.gather(*tasks)
    return order


async def test_without_allocation_holds_end_in_the_order_they_are_due() -> None:
    q = DeferralQueue(AllocationConfig())
    order = await release_order(q, [("a1", 1.0, 3.0), ("a2", 1.0, 1.0), ("b1", 1.0, 2.0)])
    assert order == ["a1", "a2", "b1"]
    assert q.held == 0 and len(q) == 0


async def test_drr_releases_flows_by_weight_and_deadlines_within_a_flow() -> None:
    q = DeferralQueue(AllocationConfig(policy="drr", weights={"a": 1.0, "b": 2.0}, quantum_ms=1.0))
    holds = [(f"a{i}", 1.0, 10.0 - i) for i in range(3)] + [(f"b{i}", 1.0, i) for i in range(4)]
    order = await release_order(q, holds)
    # a's quantum 1 releases one per round, b's 2 releases two; within a, the earliest
    # deadline (a2) first.
    assert order == ["a2", "b0", "b1", "a1", "b2", "b3", "a0"]
    assert q.released == {"a": 3, "b": 4}


async def test_fair_queueing_shares_releases_by_cost() -> None:
    q = DeferralQueue(AllocationConfig(policy="fair"))
    holds = [("a0", 4.0, 0.0), ("a1", 4.0, 1.0)] + [(f"b{i}", 1.0, i) for i in range(4)]
    order = await release_order(q, holds)
    assert order.index("a1") > order.index("b3")  # b's four cheap queries cost a's one


async def test_a_cancelled_hold_leaves_nothing_behind() -> None:
    q = DeferralQueue(AllocationConfig(policy="drr"))
    task = asyncio.create_task(q.hold("a", 1.0, 0.0, 10.0))
    await asyncio.sleep(0)
    assert q.held == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert q.held == 0 and len(q) == 0
    # One whose hold ended but whose caller left before its release is skipped.
    gone = asyncio.create_task(q.hold("a", 1.0, 0.0, 0.0))
    stays = asyncio.create_task(q.hold("b", 1.0, 0.0, 0.0))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.wait_for(stays, 1.0)
    assert q.released == {"b": 1}
