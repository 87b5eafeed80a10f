"""Counting the event loop's turns while a coroutine runs: did it let the loop run?"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def turns_during(work: Awaitable[T]) -> tuple[T, int]:
    """Await `work` beside a task that counts its own turns; return the result and how many
    turns that task took meanwhile (0: the work held the loop from start to end)."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.get_running_loop().create_task(tick())
    await asyncio.sleep(0)
    before = ticks
    try:
        result = await work
    finally:
        ticker.cancel()
    return result, ticks - before
