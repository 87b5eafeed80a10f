"""A minimal HTTP/1.1 endpoint on the event loop for a server's /metrics and /healthz.

Why not aiohttp: an edge agent is a task server on a Raspberry Pi, and aiohttp alone is
about 10 MiB of resident memory there. Why not ``prometheus_client.start_http_server``:
it answers from a thread of its own, while our lock-free histograms and executor
snapshots are written and read on the event loop only. Scrapes are rare and small, so
each connection serves one GET (or HEAD) and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from http import HTTPStatus

__all__ = ["HEAD_LIMIT_BYTES", "Reply", "Route", "answer", "start_http"]

log = logging.getLogger(__name__)

Reply = tuple[int, str, bytes]
"""(status, content type, body)."""
Route = Callable[[], Reply]
"""Builds a path's answer; called on the event loop for every request to it."""

HEAD_LIMIT_BYTES = 16 * 1024
"""Longest request head accepted (request line and headers)."""
READ_TIMEOUT_S = 10.0
"""A client that sends no complete request head within this long is dropped."""


def _response(status: int, content_type: str, body: bytes, *, head_only: bool) -> bytes:
    phrase = HTTPStatus(status).phrase
    lines = [
        f"HTTP/1.1 {status} {phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if status == 405:
        lines.append("Allow: GET, HEAD")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


def _text(status: int, message: str) -> Reply:
    return status, "text/plain; charset=utf-8", (message + "\n").encode()


def answer(routes: Mapping[str, Route], request_head: bytes) -> tuple[Reply, bool]:
    """The reply to one request head, and whether it was a HEAD request."""
    request_line = request_head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return _text(400, "bad request line"), False
    method, target = parts[0], parts[1]
    head_only = method == "HEAD"
    if method not in ("GET", "HEAD"):
        return _text(405, f"method {method} not allowed"), False
    route = routes.get(target.split("?", 1)[0])
    if route is None:
        return _text(404, f"no such path; try {', '.join(sorted(routes))}"), head_only
    try:
        return route(), head_only
    except Exception:  # a collector bug must not take the endpoint down
        log.exception("%s failed", target)
        return _text(500, "internal error"), head_only


async def start_http(host: str, port: int, routes: Mapping[str, Route]) -> asyncio.Server:
    """Listen on host:port and answer GET/HEAD for the given paths until the server closes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            head = None
            reply, head_only = _text(431, "request head too large"), False
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            writer.close()
            return
        if head is not None:
            reply, head_only = answer(routes, head)
        with contextlib.suppress(ConnectionError):
            writer.write(_response(*reply, head_only=head_only))
            await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    return await asyncio.start_server(handle, host, port, limit=HEAD_LIMIT_BYTES)
