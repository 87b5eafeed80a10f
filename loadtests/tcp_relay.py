"""A userspace TCP relay on one link, which can blackhole it: a partition at the TCP level.

The relay listens on a loopback address of its own and forwards every connection to an
upstream address (a task server's or an edge agent's Thrift port). The server advertises the
relay's address (``--advertise``), so every gateway that dials the server dials the relay.

``blackhole()`` emulates a network partition of that link as the peers see it: nothing is
forwarded any more in either direction, and every socket stays open, so a peer that writes
sees its bytes accepted by its kernel and never answered, exactly as when packets are lost
on the path. A connection opened during the partition is accepted and held without being
forwarded (a real partition would leave its SYN unanswered; either way the dialler gets no
byte back). ``heal()`` forwards again: connections that both ends kept go on where they
stopped, connections held during the partition are connected upstream now, and a peer that
gave up meanwhile finds its connection closed, as after a healed partition its stale
segments draw a reset.

This emulates a partition at the TCP level only: the kernel still acknowledges the bytes
the relay does not forward, so the senders' retransmission timers never fire, and traffic
that does not cross the relay (a server's HTTP registration with the gateway) is not cut.
While the upstream is gone (its process killed and not yet restarted) a new connection is
closed at once, as a dead host's closed port would refuse it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Coroutine
from typing import Any

__all__ = ["TcpRelay"]

CHUNK_BYTES = 65536
CONNECT_TIMEOUT_S = 5.0


class TcpRelay:
    """Forwards connections from its own loopback port to an upstream host:port."""

    def __init__(self, upstream: str | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.upstream = upstream
        """``host:port`` new connections are forwarded to; None: refuse them (closed)."""
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0
        """Connections accepted so far."""
        self.partitions = 0
        """Times the link was blackholed."""

    @property
    def address(self) -> str:
        """``host:port`` the relay listens on (what the server advertises)."""
        if self._server is None:
            raise RuntimeError("the relay is not started")
        port = self._server.sockets[0].getsockname()[1]
        return f"{self.host}:{port}"

    @property
    def partitioned(self) -> bool:
        """Whether the link is blackholed now."""
        return not self._open.is_set()

    async def start(self) -> None:
        """Listen on a free port of `host`."""
        self._server = await asyncio.start_server(self._accept, self.host, 0)

    def blackhole(self) -> None:
        """Stop forwarding in both directions; every socket stays open."""
        if self._open.is_set():
            self.partitions += 1
        self._open.clear()

    def heal(self) -> None:
        """Forward again."""
        self._open.set()

    async def close(self) -> None:
        """Stop listening and close every relayed connection."""
        self._open.set()  # pumps waiting on the gate wake and see their sockets closed
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        self._spawn(self._relay(reader, writer))

    async def _relay(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        up_writer: asyncio.StreamWriter | None = None
        try:
            await self._open.wait()  # accepted during a partition: held until it heals
            upstream = self.upstream
            if upstream is None:
                return  # nothing listens upstream: closed, as a dead host's port refuses
            host, port = upstream.rsplit(":", 1)
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError):
                return
            self._writers.add(up_writer)
            with contextlib.suppress(OSError):
                up_writer.get_extra_info("socket").setsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
                )
                c_writer.get_extra_info("socket").setsockopt(
                    socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
                )
            pumps = [
                asyncio.ensure_future(self._pump(c_reader, up_writer)),
                asyncio.ensure_future(self._pump(up_reader, c_writer)),
            ]
            try:
                # Either side's end (EOF, reset) ends the pair: a half-open Thrift link is of
                # no use to either peer.
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for p in pumps:
                    p.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            for w in (c_writer, up_writer):
                if w is not None:
                    self._writers.discard(w)
                    w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy bytes one way while the gate is open; during a partition neither read nor
        write, so each peer's own buffers fill and it stalls."""
        while True:
            await self._open.wait()
            try:
                data = await reader.read(CHUNK_BYTES)
            except OSError:
                return
            if not data:
                return
            await self._open.wait()  # bytes read as the partition began are held with it
            try:
                writer.write(data)
                await writer.drain()
            except OSError:
                return
