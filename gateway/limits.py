"""Per-request limits of the HTTP API: a body deadline, reserve connections, queries per client.

- **Body deadline** (`body_timeout_s`): a JSON body must arrive within this long of the
  request's headers (`read_body`), else `408` (code `request_timeout`, field
  "") and the connection is closed.
- **Reserve connections**: a connection `gateway.connections` took beyond
  `max_connections` gets the probes answered (`PROBE_PATHS`), anything else `503` (code
  `connection_limit`, Retry-After); it is closed after its answer.
- **Queries in flight per client** (`max_in_flight_per_client`): a source (an IPv4
  address, an IPv6 /64, as `gateway.auth.source_of`) with that many queries unanswered
  gets `429` (code `client_in_flight_limited`, Retry-After: 1) whose body names the limit
  (`"limit": {"name": "max_in_flight_per_client", "value": N}`).

`ClientLimits.middleware` runs after the access check (`gateway.guard`), so only
admitted requests count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from gateway.auth import Access, access_of, source_of
from gateway.config import GatewayConfig
from gateway.connections import PROBE_PATHS, ConnectionLimits
from gateway.errors import RequestTimeout, TooManyRequests, Unavailable

__all__ = ["LIMITS_KEY", "ClientLimits", "InFlightTable", "read_body"]


class InFlightTable:
    """Queries in flight per source, at most `limit` each (0: no limit); empty sources are
    dropped, so the table holds only sources with a query unanswered."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.counts: dict[str, int] = {}

    def acquire(self, source: str) -> bool:
        """Count one more query of `source`; False (nothing counted) when at its limit."""
        n = self.counts.get(source, 0)
        if self.limit and n >= self.limit:
            return False
        self.counts[source] = n + 1
        return True

    def release(self, source: str) -> None:
        """A query that `acquire` counted was answered."""
        n = self.counts.get(source, 0) - 1
        if n > 0:
            self.counts[source] = n
        else:
            self.counts.pop(source, None)


class ClientLimits:
    """The per-request limits: body deadline, reserve connections, queries per client."""

    def __init__(self, config: GatewayConfig, registry: CollectorRegistry | None = None) -> None:
        self.body_timeout_s = config.body_timeout_s
        self.in_flight = InFlightTable(config.max_in_flight_per_client)
        self.limited = Counter(
            "tailgate_client_in_flight_limited",
            "Queries refused (429) because their source had max_in_flight_per_client "
            "queries unanswered",
            registry=registry,
        )

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]
    ) -> web.StreamResponse:
        """Probes only on a reserve connection; a client's queries within its limit."""
        protocol = request.protocol
        if getattr(protocol, "reserve", False):
            return await self._on_reserve(request, handler)
        resource_ = request.match_info.route.resource
        if resource_ is None or access_of(request.method, resource_.canonical) is not Access.QUERY:
            return await self._timed(request, handler)
        source = source_of(request.remote)
        if not self.in_flight.acquire(source):
            self.limited.inc()
            limit = self.in_flight.limit
            raise TooManyRequests(
                f"at most {limit} queries in flight from one client ({source}): wait for "
                f"some to be answered",
                code="client_in_flight_limited",
                extra={"limit": {"name": "max_in_flight_per_client", "value": limit}},
                headers={"Retry-After": "1"},
            )
        try:
            return await self._timed(request, handler)
        finally:
            self.in_flight.release(source)

    async def _on_reserve(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]
    ) -> web.StreamResponse:
        """A connection beyond max_connections: a probe is answered, anything else is 503;
        either way the connection is then closed, so the reserve frees up."""
        if request.path in PROBE_PATHS:
            response = await handler(request)
        else:
            limits = getattr(request.protocol, "limits", None)
            most = limits.max_connections if isinstance(limits, ConnectionLimits) else "its"
            exc = Unavailable(
                f"the gateway holds {most} connections, its most: only "
                f"{', '.join(sorted(PROBE_PATHS))} are answered on this one; try again",
                code="connection_limit",
            )
            response = web.json_response(
                exc.body(), status=exc.status, headers={"Retry-After": "1"}
            )
        _close_after(request, response)
        return response

    async def _timed(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestTimeout as exc:
            # The rest of the body may still come: nothing more is read on this connection.
            response = web.json_response(exc.body(), status=exc.status)
            _close_after(request, response, "body_timeout")
            return response
        except ConnectionResetError:
            # The client left before its body came: nobody to answer, nothing to log.
            response = web.Response(status=400, reason="Client Gone")
            _close_after(request, response)
            return response


LIMITS_KEY: web.AppKey[ClientLimits] = web.AppKey("limits", ClientLimits)
"""The app's ClientLimits (gateway.app.create_app sets it)."""


async def read_body(request: web.Request) -> bytes:
    """The request's body, read within the app's `body_timeout_s` (else RequestTimeout:
    408); 413 past `client_max_size`, as aiohttp reads it."""
    limits = request.app.get(LIMITS_KEY)
    timeout_s = None if limits is None else limits.body_timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise RequestTimeout(
            f"the request's body did not arrive within {timeout_s:g} s", field=""
        ) from None


def _close_after(
    request: web.Request, response: web.StreamResponse, reason: str | None = None
) -> None:
    """Close the request's connection once `response` is written (counted under `reason`
    on a gateway.connections connection)."""
    response.force_close()
    close = getattr(request.protocol, "close_after_answer", None)
    if close is not None:
        close(reason)
