"""The HTTP listener's connections under limits: a header deadline, at most so many open.

aiohttp bounds a request's size (line, field and header count, `client_max_size`) and
closes a connection idle for `keepalive_timeout` between requests, but it waits as long as
a client likes for the headers of a request that has started, and it takes every
connection it is offered: 8,000 idle connections and 300 that sent a header line every
5 s all stayed open. Here (`GatewayConfig` fields):

- **Header deadline** (`header_timeout_s`): a connection must complete a request's headers
  within this long of the request's first byte, or of the connection opening. Past it the
  connection is closed; a client that had sent part of a request gets a `408` first.
- **Idle keep-alive** (`keepalive_timeout_s`): aiohttp's own timer, between requests.
- **Connections** (`max_connections`): at the limit, a new connection closes the one that
  has been idle (or sending a request's head) longest; when every connection is busy
  with a request, up to `PROBE_RESERVE` more are taken for the probes (`PROBE_PATHS`;
  `gateway.limits` answers anything else on them with 503). Beyond that, new
  connections are closed at once. The limit is lowered, with a WARNING, to what the
  process's file limit (`ulimit -n`) allows, after raising the soft limit towards the
  hard one.

`app_runner` builds the aiohttp runner whose connections obey these limits; what closes
them is counted in ``tailgate_http_connections_closed_total{reason}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server
from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.config import GatewayConfig

__all__ = [
    "PROBE_PATHS",
    "PROBE_RESERVE",
    "ConnectionLimits",
    "LimitedAppRunner",
    "LimitedServer",
    "app_runner",
    "fit_to_file_limit",
]

log = logging.getLogger(__name__)

PROBE_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})
"""What a connection taken beyond `max_connections` may ask for."""
PROBE_RESERVE = 16
"""Connections taken beyond `max_connections` for the probes, when none can be closed."""
FILE_HEADROOM = 512
"""Files the process keeps for itself (server links, the store, logs) under `ulimit -n`."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The per-connection limits of the HTTP listener."""

    header_timeout_s: float = 10.0
    """A request's headers must be complete within this long of its first byte."""
    keepalive_timeout_s: float = 75.0
    """An idle connection is closed after this long without a request."""
    max_connections: int = 10_000
    """Open connections at most (plus PROBE_RESERVE for the probes)."""
    probe_reserve: int = PROBE_RESERVE
    """Connections taken beyond max_connections, for the probes only."""

    @classmethod
    def of(cls, config: GatewayConfig) -> ConnectionLimits:
        """The limits a gateway config asks for, fitted to the process's file limit."""
        return cls(
            header_timeout_s=config.header_timeout_s,
            keepalive_timeout_s=config.keepalive_timeout_s,
            max_connections=fit_to_file_limit(config.max_connections),
        )


def fit_to_file_limit(max_connections: int, headroom: int = FILE_HEADROOM) -> int:
    """`max_connections`, or fewer where the file limit cannot hold them (a WARNING says so).

    The soft limit is raised towards the hard one first, as far as the connections need.
    """
    needed = max_connections + PROBE_RESERVE + headroom
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
            if want > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                soft = want
    except (OSError, ValueError):
        return max_connections
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return max_connections
    fitted = max(16, soft - PROBE_RESERVE - headroom)
    log.warning(
        "max_connections %d lowered to %d: the process may open %d files (ulimit -n); "
        "raise the limit to serve more connections",
        max_connections,
        fitted,
        soft,
    )
    return min(fitted, max_connections)


def _timeout_answer() -> bytes:
    """A 408 written straight to the socket: the request never reached the application."""
    body = json.dumps(
        {
            "error": {
                "code": "request_timeout",
                "message": "the request's headers did not arrive in time",
                "field": None,
            }
        },
        separators=(",", ":"),
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\nServer: tailgate\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _LimitedHandler(RequestHandler):
    """aiohttp's per-connection protocol with a header deadline, and counted by its server."""

    def __init__(self, manager: LimitedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.limits = manager.limits
        self.reserve = False
        """Taken beyond max_connections: only the probes are answered on it."""
        self.busy = False
        """A request's headers are complete and it is not yet answered."""
        self._header_timer: asyncio.TimerHandle | None = None
        self._started_request = False
        self._next_started = False  # bytes of a next request came while one was served
        self._body: Any = EMPTY_PAYLOAD
        self._close_after_answer = False
        self._server = manager

    # The connection's life.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._server.admit(self):
            self._arm_header_deadline()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_header_deadline()
        self._server.forget(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            # Headers complete: the request is the application's now (the body's deadline
            # is read_body's).
            self._disarm_header_deadline()
            self._body = self._messages[-1][1] if self._messages else EMPTY_PAYLOAD
            self.busy = True
            self._server.mark_busy(self)
        elif data and self._body.is_eof():
            # Bytes of a request's head (not of a body still arriving).
            if self.busy:
                self._next_started = True  # its deadline starts when this one is answered
            elif self._header_timer is None:
                self._arm_header_deadline(started=True)
            else:
                self._started_request = True  # the deadline since opening stands

    def close_after_answer(self, reason: str | None = None) -> None:
        """Close the connection once the answer being made is written: no lingering for
        the rest of a body that did not come in time (aiohttp reads it for up to 10 s).
        `reason`: count the close under it (tailgate_http_connections_closed_total)."""
        self._close_after_answer = True
        if reason is not None:
            self._server.closed(reason)

    async def finish_response(
        self, request: Any, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        """Answer as aiohttp does; then the connection is idle again (or sending the next
        request, which gets its own header deadline), or closed if so asked."""
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            if self._close_after_answer:
                self.force_close()  # the transport sends what it holds, then closes
            elif not self._messages:
                self.busy = False
                self._body = EMPTY_PAYLOAD
                self._server.mark_idle(self)
                if self._next_started and self.transport is not None:
                    self._arm_header_deadline(started=True)
                self._next_started = False

    # The header deadline.

    def _arm_header_deadline(self, *, started: bool = False) -> None:
        self._disarm_header_deadline()
        self._started_request = started
        loop = asyncio.get_running_loop()
        self._header_timer = loop.call_later(self.limits.header_timeout_s, self._headers_late)

    def _disarm_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._started_request = False

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.busy or self.transport is None:
            return
        if self._started_request:
            self.transport.write(_timeout_answer())
            self._server.closed("header_timeout")
        else:
            self._server.closed("idle_timeout")
        self.force_close()


class LimitedServer(Server):
    """aiohttp's low-level server, with the connection limit and `_LimitedHandler`s."""

    def __init__(
        self,
        handler: Any,
        *,
        limits: ConnectionLimits,
        registry: CollectorRegistry | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self.limits = limits
        self._open: set[_LimitedHandler] = set()
        self._idle: dict[_LimitedHandler, None] = {}  # oldest idle first (insertion order)
        self._reserve = 0
        self.open_gauge = Gauge(
            "tailgate_http_connections",
            "HTTP connections open now",
            registry=registry,
        )
        self.open_gauge.set_function(lambda: len(self._open))
        self.closed_total = Counter(
            "tailgate_http_connections_closed",
            "HTTP connections the gateway closed or refused for a limit, by reason "
            "(header_timeout, idle_timeout, body_timeout, evicted, refused)",
            ["reason"],
            registry=registry,
        )

    def __call__(self) -> _LimitedHandler:
        return _LimitedHandler(self, loop=self._loop, **self._kwargs)

    def admit(self, handler: _LimitedHandler) -> bool:
        """Count a new connection; False if it was closed (over every limit)."""
        if len(self._open) - self._reserve >= self.limits.max_connections:
            victim = self._oldest_idle()
            if victim is not None:
                self.closed("evicted")
                victim.force_close()
            elif self._reserve < self.limits.probe_reserve:
                handler.reserve = True
                self._reserve += 1
                self._open.add(handler)
                return True
            else:
                self.closed("refused")
                handler.force_close()
                return False
        self._open.add(handler)
        self._idle[handler] = None
        return True

    def _oldest_idle(self) -> _LimitedHandler | None:
        """The connection idle (or sending a request's head) longest, now forgotten."""
        while self._idle:
            handler = next(iter(self._idle))
            self.forget(handler)
            if not handler.busy and handler.transport is not None:
                return handler
        return None

    def mark_busy(self, handler: _LimitedHandler) -> None:
        """A request of this connection is being served: it is not closed for another."""
        self._idle.pop(handler, None)

    def mark_idle(self, handler: _LimitedHandler) -> None:
        """The connection answered its requests: the newest idle one."""
        if handler in self._open and not handler.reserve:
            self._idle.pop(handler, None)
            self._idle[handler] = None

    def forget(self, handler: _LimitedHandler) -> None:
        """The connection is gone (or going)."""
        if handler in self._open:
            self._open.discard(handler)
            if handler.reserve:
                self._reserve -= 1
        self._idle.pop(handler, None)

    def closed(self, reason: str) -> None:
        """Count a connection closed or refused for a limit."""
        self.closed_total.labels(reason).inc()


class LimitedAppRunner(web.AppRunner):
    """`web.AppRunner` whose server is a `LimitedServer`."""

    def __init__(
        self,
        app: web.Application,
        *,
        limits: ConnectionLimits,
        registry: CollectorRegistry | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._limits = limits
        self._registry = registry

    async def _make_server(self) -> Server:
        plain = await super()._make_server()
        return LimitedServer(
            plain.request_handler,
            limits=self._limits,
            registry=self._registry,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=asyncio.get_running_loop(),
            **plain._kwargs,
        )


def app_runner(
    app: web.Application,
    config: GatewayConfig,
    registry: CollectorRegistry | None = None,
    **kwargs: Any,
) -> LimitedAppRunner:
    """The runner of the gateway's app under the config's connection limits (`kwargs`: as
    for `web.AppRunner`)."""
    limits = ConnectionLimits.of(config)
    kwargs.setdefault("keepalive_timeout", limits.keepalive_timeout_s)
    return LimitedAppRunner(app, limits=limits, registry=registry, **kwargs)
