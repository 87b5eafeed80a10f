"""The heartbeat's waits without asyncio.wait_for: the link's poll flag and a Thrift call's
timeout, each one future and one timer."""

from __future__ import annotations

import asyncio

import pytest

from gateway.links import PollSignal
from taskserver.wire import ThriftConnection, gateway_body_types, thrift


async def test_a_set_flag_is_seen_at_once_and_a_quiet_one_times_out() -> None:
    poll = PollSignal()
    poll.set()
    assert poll.is_set() and await poll.wait(10.0) is True
    poll.clear()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await poll.wait(0.05) is False
    assert loop.time() - t0 >= 0.04
    assert poll._waiter is None


async def test_a_flag_set_while_waiting_wakes_the_waiter_before_its_period() -> None:
    poll = PollSignal()
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, poll.set)
    t0 = loop.time()
    assert await poll.wait(5.0) is True
    assert loop.time() - t0 < 1.0
    poll.set()  # again, with no waiter: nothing to wake
    assert poll.is_set()


async def test_a_cancelled_wait_leaves_no_waiter() -> None:
    poll = PollSignal()
    task = asyncio.get_running_loop().create_task(poll.wait(5.0))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert poll._waiter is None
    poll.set()  # the cancelled waiter is not woken (it would raise InvalidStateError)


async def test_a_call_with_no_reply_times_out_and_forgets_the_call() -> None:
    # A peer that reads and never answers.
    gone = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.read(1 << 16):  # until the connection closes
                pass
        finally:
            writer.close()
            gone.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(
        lambda: ThriftConnection(gateway_body_types(), lambda *a: None), "127.0.0.1", port
    )
    try:
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await conn.call("status", thrift().TaskServer.status_args(), 0.1)
        assert 0.09 <= loop.time() - t0 < 2.0
        assert conn._calls == {}
        # A cancelled call is forgotten too.
        task = loop.create_task(conn.call("status", thrift().TaskServer.status_args(), 5.0))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert conn._calls == {}
    finally:
        conn.transport.close()
        await asyncio.wait_for(gone.wait(), 5.0)
        await asyncio.sleep(0)  # the server's side of the socket closes
        server.close()
        await server.wait_closed()


async def test_quiet_waits_due_on_one_tick_end_together_from_one_timer() -> None:
    from gateway import links

    loop = asyncio.get_running_loop()
    tick_s = 0.05
    signals = [PollSignal() for _ in range(6)]
    ended: dict[int, float] = {}

    async def wait(i: int, period_s: float) -> None:
        assert await signals[i].wait(period_s, tick_s) is False
        ended[i] = loop.time()

    # Periods spread over (t0, t0 + tick): all end on one of at most two ticks; the
    # periods a tick apart and more end on later ones, each no earlier than its period.
    t0 = loop.time()
    periods = [0.06, 0.065, 0.07, 0.08, 0.2, 0.31]
    tasks = [loop.create_task(wait(i, p)) for i, p in enumerate(periods)]
    await asyncio.sleep(0)
    ticks = links._TICKS[(id(loop), tick_s)]
    assert len(ticks._ticks) <= 4  # the first four waits share at most two ticks
    await asyncio.gather(*tasks)
    for i, p in enumerate(periods):
        assert ended[i] - t0 >= p - 0.003  # never before its period (uvloop: ~1 ms early)
        on_grid = (ended[i] + 0.002) / tick_s
        assert ended[i] - t0 < p + tick_s + 0.05
        assert abs(on_grid - round(on_grid)) < 0.2  # on a tick of the grid
    first_four = {round(ended[i] / tick_s) for i in range(4)}
    assert len(first_four) <= 2
    assert (id(loop), tick_s) not in links._TICKS  # the grid left with its last wait


async def test_a_quiet_wait_ended_early_leaves_its_tick() -> None:
    from gateway import links

    loop = asyncio.get_running_loop()
    poll = PollSignal()
    loop.call_later(0.01, poll.set)
    assert await poll.wait(5.0, 0.05) is True
    ticks = links._TICKS[(id(loop), 0.05)]
    assert all(not waits for waits in ticks._due.values())
    # An earlier tick added after a later one re-arms the timer for it.
    other = PollSignal()
    t0 = loop.time()
    assert await other.wait(0.06, 0.05) is False
    assert loop.time() - t0 < 1.0
