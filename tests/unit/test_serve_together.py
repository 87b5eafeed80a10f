"""serve_together: several servers in one loop, one stop each, the first failure raised."""

from __future__ import annotations

import asyncio

import pytest

from taskserver.server import serve_together


async def test_a_failure_stops_the_others_and_is_raised() -> None:
    stopped: list[str] = []

    async def waits(name: str, *, stop: asyncio.Event) -> None:
        await stop.wait()
        stopped.append(name)

    async def fails(*, stop: asyncio.Event) -> None:
        await asyncio.sleep(0)
        raise OSError("port taken")

    servers = [lambda stop: waits("a", stop=stop), fails, lambda stop: waits("b", stop=stop)]
    with pytest.raises(OSError, match="port taken"):
        await asyncio.wait_for(serve_together(servers), 5)
    assert sorted(stopped) == ["a", "b"]  # drained through their own stops, not cancelled


async def test_one_retiring_leaves_the_rest_until_the_common_stop() -> None:
    stop = asyncio.Event()
    done: list[str] = []

    async def retires(*, stop: asyncio.Event) -> None:
        done.append("retired")

    async def waits(*, stop: asyncio.Event) -> None:
        await stop.wait()
        done.append("stopped")

    runner = asyncio.create_task(serve_together([retires, waits], stop=stop))
    await asyncio.sleep(0.01)
    assert done == ["retired"] and not runner.done()
    stop.set()
    await asyncio.wait_for(runner, 5)
    assert done == ["retired", "stopped"]
